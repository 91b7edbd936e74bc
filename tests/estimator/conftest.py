"""The Estimator suite: real canned Estimators, so it runs only where tf.estimator exists.

``make test-estimator`` runs it in ``.venv-tf215`` (TF 2.15 + tensorflow-estimator).
The main run (``make pytest``, TF 2.21, no tf.estimator) must not collect it at all,
rather than report dozens of skips: without the ``tensorflow_estimator`` package the
directory's test files are ignored. ``find_spec`` answers without importing TensorFlow.
"""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if importlib.util.find_spec("tensorflow_estimator") is None:
    collect_ignore_glob = ["test_*.py"]


import pytest  # noqa: E402


def pytest_configure(config):
    # Estimator-era APIs warn on every call; the warnings summary would bury the results.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning")
    config.addinivalue_line("filterwarnings", "ignore::UserWarning")


@pytest.fixture(scope="session", autouse=True)
def _quiet_tensorflow():
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")


@pytest.fixture(scope="session")
def vocab_path(tmp_path_factory) -> str:
    from .estimator_helpers import write_vocabulary

    return write_vocabulary(str(tmp_path_factory.mktemp("vocab")))


@pytest.fixture(scope="session")
def trained_classifier(tmp_path_factory, vocab_path):
    """A DNNClassifier trained a few steps (no exports): (estimator, receiver_fn)."""
    from .estimator_helpers import dnn_classifier, input_fn

    estimator, receiver = dnn_classifier(str(tmp_path_factory.mktemp("trained")), vocab_path)
    estimator.train(input_fn("class", repeat=True), max_steps=10)
    return estimator, receiver
