"""Where tf.estimator does not exist (TF >= 2.16, this venv), the hook says so clearly.

The Estimator suite itself runs in the TF 2.15 venv (tests/estimator, make test-estimator).
"""

from __future__ import annotations

import pytest

from serving_opt.errors import ServingOptError


def test_tf_estimator_really_is_missing_here():
    import tensorflow as tf

    assert not hasattr(tf, "estimator"), "this test expects TF >= 2.16"


def test_exporter_raises_a_clear_error_not_attribute_error():
    # Importing works everywhere; using the hook names the problem and the way out.
    from serving_opt.integrations.estimator import OptimizingExporter

    with pytest.raises(ServingOptError) as info:
        OptimizingExporter("clf", lambda: None)
    import tensorflow as tf

    message = str(info.value)
    assert f"tf.estimator is not available in TensorFlow {tf.__version__} " in message
    assert "removed in TF 2.16" in message
    assert "tensorflow-estimator" in message and "serving-opt optimize" in message
    assert not isinstance(info.value, AttributeError)


def test_one_off_export_raises_the_same_error(tmp_path):
    from serving_opt.integrations.estimator import export_optimized_saved_model

    with pytest.raises(ServingOptError, match="tf.estimator is not available"):
        export_optimized_saved_model(object(), str(tmp_path / "clf"), lambda: None)
    assert not (tmp_path / "clf").exists()
