"""A feed of another rank than its placeholder's is answered as TF Serving answers it,
except in a graph with a convolution, whose oneDNN kernels abort the whole server on one:
there it is refused. The graph decides, not the CPU: each case runs in a fresh process
with oneDNN's kernels on and off (``TF_ENABLE_ONEDNN_OPTS``) and must give one answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from saved_model_io import save_tf1, serving_default

from serving_opt.model_server.servable import LoadOptions, Servable, ServableId

v1 = tf.compat.v1

# Loads a version with the server's Servable and runs one feed; prints the outcome.
_RUN = """
import json, sys
import numpy as np
from serving_opt.model_server.servable import LoadOptions, Servable, ServableId
from serving_opt.model_server.status import ServingStatusError
path, shape, direct = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
servable = Servable.load(ServableId("m", 1), path, LoadOptions())
run = servable.run_direct if direct else servable.run
try:
    out = run({"x:0": np.ones(shape, np.float32)}, ["y:0"])
    print(json.dumps({"answer": out[0].value.ravel().tolist()}))
except ServingStatusError as e:
    print(json.dumps({"refused": e.code.name, "message": e.message}))
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("ranks")
    with tf.Graph().as_default() as graph:  # upstream's half_plus_two: x is [None, 1]
        x = v1.placeholder(tf.float32, [None, 1], name="x")
        y = tf.identity(0.5 * x + 2.0, name="y")
        half_plus_two = save_tf1(graph, str(root / "half_plus_two" / "1"),
                                 serving_default({"x": x}, {"y": y}))
    with tf.Graph().as_default() as graph:  # and a side input that reaches no convolution
        x = v1.placeholder(tf.float32, [None, 4, 4, 3], name="x")
        y = tf.identity(tf.nn.conv2d(x, tf.ones([1, 1, 3, 2]), 1, "SAME"), name="y")
        side = v1.placeholder(tf.float32, [None, 1], name="side")
        z = tf.identity(0.5 * side + 2.0, name="z")
        conv = save_tf1(graph, str(root / "conv" / "1"),
                        serving_default({"x": x, "side": side}, {"y": y, "z": z}))
    return {"half_plus_two": half_plus_two, "conv": conv}


def _run(path: str, shape: list[int], onednn: str, direct: bool = False):
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", _RUN, path, json.dumps(shape),
                           "1" if direct else "0"],
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        return {"exit": done.returncode}
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_half_plus_two_answers_a_one_dimensional_x_with_onednn_on_and_off(models):
    outcomes = {onednn: _run(models["half_plus_two"], [3], onednn) for onednn in "01"}
    assert outcomes["0"] == outcomes["1"] == {"answer": [2.5, 2.5, 2.5]}


def test_a_convolution_refuses_a_wrongly_ranked_input_with_onednn_on_and_off(models):
    # Control: past the refusal (run_direct), oneDNN's convolution aborts the process.
    assert _run(models["conv"], [4, 4, 3], "1", direct=True) == {"exit": -6}
    outcomes = {onednn: _run(models["conv"], [4, 4, 3], onednn) for onednn in "01"}
    assert outcomes["0"] == outcomes["1"]
    assert outcomes["1"]["refused"] == "INVALID_ARGUMENT"
    assert "x:0 must be 4-dimensional, not [4,4,3]" in outcomes["1"]["message"]
    assert "Conv2D" in outcomes["1"]["message"]


def test_a_side_input_that_reaches_no_convolution_is_run_as_fed(models):
    servable = Servable.load(ServableId("m", 1), models["conv"], LoadOptions())
    try:
        out = servable.run({"side:0": np.ones([3], np.float32)}, ["z:0"])
    finally:
        servable.close()
    assert out[0].value.tolist() == [2.5, 2.5, 2.5]
