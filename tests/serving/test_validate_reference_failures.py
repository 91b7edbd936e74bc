"""validate names a reference model's own failure on its inputs as the model's, with the
fix, not as an internal error of the tool (the run that builds the expected answers
raises it before any server starts)."""

from __future__ import annotations

import pytest
import tensorflow as tf
from saved_model_io import save_tf1, serving_default

from serving_opt.errors import ServingOptError
from serving_opt.serving import requests

v1 = tf.compat.v1


@pytest.fixture(scope="module")
def failing_model(tmp_path_factory) -> str:
    """y = check_numerics(x / 0): every finite input but 0 makes an inf, which fails."""
    export_dir = str(tmp_path_factory.mktemp("failing") / "1")
    with tf.Graph().as_default() as graph:
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        y = tf.debugging.check_numerics(x / 0.0, "divided by zero", name="y")
        save_tf1(graph, export_dir, serving_default({"x": x}, {"y": y}))
    return export_dir


def test_the_model_fails_on_its_own_when_tensorflow_runs_it(failing_model):
    # The control: plain TensorFlow, no serving_opt code, gets the op's failure.
    with tf.Graph().as_default(), v1.Session() as session:
        v1.saved_model.loader.load(session, ["serve"], failing_model)
        with pytest.raises(tf.errors.InvalidArgumentError, match="divided by zero"):
            session.run("y:0", {"x:0": [[1.0, 2.0]]})


def test_validate_names_the_reference_models_failure_and_the_fix(failing_model):
    with pytest.raises(ServingOptError) as caught:
        requests.build_probes(failing_model, failing_model, "m", 1, frozenset({"serve"}))
    problem = caught.value.problem
    assert problem.startswith(f"the reference model {failing_model} fails on synthesized "
                              "inputs for signature serving_default: ")
    assert "divided by zero" in problem and "internal error" not in problem
    assert "--examples" in caught.value.fix
