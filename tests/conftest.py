"""Shared fixtures: real SavedModels built once per test session, in seconds.

Builders are session-scoped and return a *model base* holding version 1, so tests
that need a version directory use ``<base>/1`` and tests that serve use the base.
Tests must never write into these directories: copy them first (``model_copy``).
"""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from serving_opt import samples  # noqa: E402


def _build(tmp_path_factory, kind: str) -> str:
    base = str(tmp_path_factory.mktemp(kind))
    samples.build(kind, os.path.join(base, "1"))
    return base


@pytest.fixture(scope="session")
def classifier_base(tmp_path_factory) -> str:
    """TF1 DNN classifier: vocab-file + hashed embeddings, batch norm, classify/predict."""
    return _build(tmp_path_factory, "classifier")


@pytest.fixture(scope="session")
def classifier_dir(classifier_base) -> str:
    return os.path.join(classifier_base, "1")


@pytest.fixture(scope="session")
def multihead_base(tmp_path_factory) -> str:
    """The classifier plus a regress signature: classify + regress in one model."""
    return _build(tmp_path_factory, "multihead")


@pytest.fixture(scope="session")
def regressor_base(tmp_path_factory) -> str:
    """TF1 linear regressor: regress + predict signatures over tf.Examples."""
    return _build(tmp_path_factory, "regressor")


@pytest.fixture(scope="session")
def regressor_dir(regressor_base) -> str:
    return os.path.join(regressor_base, "1")


@pytest.fixture(scope="session")
def convnet_base(tmp_path_factory) -> str:
    """TF1 conv net with fused batch norm in inference mode, float image input."""
    return _build(tmp_path_factory, "convnet")


@pytest.fixture(scope="session")
def convnet_dir(convnet_base) -> str:
    return os.path.join(convnet_base, "1")


@pytest.fixture(scope="session")
def keras_base(tmp_path_factory) -> str:
    """Keras 3 ``model.export()``: a TF2 object-graph SavedModel."""
    return _build(tmp_path_factory, "keras")


@pytest.fixture(scope="session")
def keras_dir(keras_base) -> str:
    return os.path.join(keras_base, "1")


@pytest.fixture
def model_copy(tmp_path):
    """Copies a model directory into this test's tmp dir so the test may break it."""

    def copy(src: str, name: str = "model") -> str:
        dst = os.path.join(str(tmp_path), name)
        shutil.copytree(src, dst)
        return dst

    return copy


def tree_snapshot(path: str) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes, to prove a run left the input untouched."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out
