"""serving_opt.keras: export a trained Keras model, optimized and proven, as numbered versions.

Each test trains a tiny Normalization + Dense model for an epoch or two on numpy data,
then checks what TF Serving would see in the model base: integer versions only,
the signature keys Keras' own export writes, and answers equal to ``model.predict``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import repo_paths

from serving_opt.options import BuildOptions, MeasureOptions, OutputOptions

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

import serving_opt.keras as so_keras  # noqa: E402
from serving_opt import OptimizeOptions  # noqa: E402
from serving_opt.errors import ParityError, UsageError  # noqa: E402

ROOT = repo_paths.REPO
FEATURES = 4
LOSSY = OptimizeOptions(
    measure=MeasureOptions(benchmark_runs=0),
    build=BuildOptions(transforms="round_weights(num_steps=4)"))
# Not about measuring: the cold start (on in the helper's default) is skipped where the
# test is about versions, signatures or the callback's schedule.
NOT_MEASURED = OptimizeOptions(measure=MeasureOptions(benchmark_runs=0, cold_start=False))


def _data(seed: int = 0, n: int = 64):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, FEATURES)) * [1.0, 10.0, 100.0, 0.1] + 5.0).astype("float32")
    y = (x[:, 0] + x[:, 1] / 10.0 > 5.5).astype("float32")
    return x, y


def _model(x) -> keras.Model:
    keras.utils.set_random_seed(0)
    norm = keras.layers.Normalization(name="norm")
    norm.adapt(x)
    inputs = keras.Input(shape=(FEATURES,), name="features")
    hidden = keras.layers.Dense(8, activation="relu", name="hidden")(norm(inputs))
    outputs = keras.layers.Dense(1, activation="sigmoid", name="prob")(hidden)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    return model


@pytest.fixture(scope="module")
def data():
    return _data()


@pytest.fixture
def model(data):
    x, y = data
    m = _model(x)
    m.fit(x, y, epochs=1, batch_size=16, verbose=0)
    return m


def _signature_keys(saved_model_dir: str) -> set[str]:
    from serving_opt.savedmodel import loader

    meta_graph = loader.find_meta_graph(loader.read_saved_model(saved_model_dir), {"serve"})
    return set(loader.serving_signatures(meta_graph))


def _serve(saved_model_dir: str, key: str, x: np.ndarray) -> np.ndarray:
    """The one output of signature ``key``, run the way TF Serving runs it (TF1 session)."""
    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as sess:
        meta_graph = tf.compat.v1.saved_model.loader.load(sess, ["serve"], saved_model_dir)
        sig = meta_graph.signature_def[key]
        (feed,) = sig.inputs.values()
        (fetch,) = sig.outputs.values()
        return sess.run(fetch.name, {feed.name: x})


def _entries(base: str) -> list[str]:
    return sorted(os.listdir(base)) if os.path.isdir(base) else []


def _assert_predicts_like(saved_model_dir: str, model, x, keys=("serving_default",)) -> None:
    expected = model.predict(x, verbose=0)
    for key in keys:
        np.testing.assert_allclose(_serve(saved_model_dir, key, x), expected,
                                   rtol=1e-5, atol=1e-6, err_msg=key)


# --- export() ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_exports(data, tmp_path_factory):
    """A trained model exported twice into one base: with the helper's default options,
    then not measured. (model, base, first report, second report)"""
    x, y = data
    model = _model(x)
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    base = str(tmp_path_factory.mktemp("models") / "clf")
    first = so_keras.export(model, base)  # the helper's default options
    second = so_keras.export(model, base, options=NOT_MEASURED)
    return model, base, first, second


@pytest.mark.golden
def test_export_publishes_numbered_versions_that_predict_like_the_model(two_exports, data):
    x, _ = data
    model, base, first, second = two_exports

    assert (first.output_dir, second.output_dir) == (os.path.join(base, "1"),
                                                     os.path.join(base, "2"))
    assert first.published and first.parity.ok and first.frozen
    assert first.benchmark is None  # the helper's default skips the benchmark
    assert _entries(base) == ["1", "2"]  # no staging or temporary directories left behind
    _assert_predicts_like(second.output_dir, model, x, keys=("serving_default", "serve"))


def test_export_writes_the_signature_keys_model_export_writes(two_exports, tmp_path):
    model, _, _, report = two_exports
    reference = str(tmp_path / "keras_export")
    model.export(reference, format="tf_saved_model", verbose=False)

    assert _signature_keys(report.output_dir) == _signature_keys(reference) == {
        "serve", "serving_default"}
    assert set(report.signatures) == {"serve", "serving_default"}


def test_export_with_custom_signatures(model, data, tmp_path):
    x, _ = data
    spec = tf.TensorSpec([None, FEATURES], tf.float32, name="features")

    @tf.function(input_signature=[spec])
    def logit(features):
        p = model(features, training=False)
        return {"logit": tf.math.log(p / (1.0 - p))}

    hidden = model.get_layer("hidden")
    report = so_keras.export(model, str(tmp_path / "base"), options=NOT_MEASURED, signatures={
        "predict": [spec],  # an input signature: the model itself
        "logit": logit,  # a tf.function with an input signature
        "hidden": (lambda f: hidden(model.get_layer("norm")(f)), [spec]),  # (fn, signature)
    })

    # As with ExportArchive, the first endpoint is also served as serving_default.
    assert _signature_keys(report.output_dir) == {"predict", "logit", "hidden",
                                                  "serving_default"}
    _assert_predicts_like(report.output_dir, model, x, keys=("predict", "serving_default"))
    p = model.predict(x, verbose=0)
    np.testing.assert_allclose(_serve(report.output_dir, "logit", x), np.log(p / (1 - p)),
                               rtol=1e-4, atol=1e-4)
    assert _serve(report.output_dir, "hidden", x).shape == (len(x), 8)


def test_export_parity_failure_raises_and_publishes_nothing(model, tmp_path):
    base = str(tmp_path / "base")
    with pytest.raises(ParityError, match="nothing was published") as info:
        so_keras.export(model, base, options=LOSSY)
    assert info.value.report is not None and not info.value.report.parity.ok
    # The callback logs this line; its tests below raise one that starts the same way.
    assert info.value.one_line().startswith("parity failed")
    assert _entries(base) == []


def test_export_rejects_a_taken_version_before_exporting(model, tmp_path):
    base = tmp_path / "base"
    (base / "3").mkdir(parents=True)
    with pytest.raises(Exception, match="already exists"):
        so_keras.export(model, str(base), options=OptimizeOptions(
            measure=MeasureOptions(benchmark_runs=0), output=OutputOptions(version=3)))


@pytest.mark.parametrize("signatures, match", [
    ({}, "names no endpoint"),
    ({"__init": [tf.TensorSpec([None, FEATURES])]}, "not usable"),
    ({"f": lambda x: x}, "without an input signature"),
])
def test_export_rejects_unusable_signatures(model, tmp_path, signatures, match):
    with pytest.raises(UsageError, match=match):
        so_keras.export(model, str(tmp_path / "base"), signatures=signatures)
    assert _entries(str(tmp_path / "base")) == []


# --- OptimizedExportCallback ---------------------------------------------------------------


@pytest.fixture
def exports(monkeypatch):
    """In place of export() (proven end to end above, and with the callback in the first
    test below): publishes an empty version directory, the next free number, and records
    the weights it was handed; for the LOSSY options it raises ParityError. The subject
    is the callback: when it exports, which weights, versions, pruning, failures."""
    from serving_opt.integrations import keras_export

    handed = []

    def export(model, base, *, signatures=None, options=None, progress=None):
        if options is LOSSY:
            raise ParityError("parity failed: a stand-in's refusal; nothing was published")
        version = max((int(n) for n in _entries(base) if n.isdigit()), default=0) + 1
        os.makedirs(os.path.join(base, str(version)))
        handed.append(model.get_weights())
        return types.SimpleNamespace(version=version, output_dir=os.path.join(base, str(version)),
                                     parity=None)

    monkeypatch.setattr(keras_export, "export", export)
    return handed


def _assert_same_weights(exported: list, model) -> None:
    for got, want in zip(exported, model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_callback_exports_once_at_the_end_of_fit_by_default(data, tmp_path):
    x, y = data
    model = _model(x)
    base = str(tmp_path / "base")
    callback = so_keras.OptimizedExportCallback(base, options=NOT_MEASURED, verbose=0)

    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback])

    assert _entries(base) == ["1"]
    assert [r.version for r in callback.reports] == [1] and callback.failures == []
    _assert_predicts_like(os.path.join(base, "1"), model, x)  # the weights after epoch 2


def test_callback_every_n_epochs_keeps_the_last_k_versions(data, tmp_path, capsys,
                                                           exports):
    x, y = data
    model = _model(x)
    base = tmp_path / "base"
    (base / "7").mkdir(parents=True)  # an older run's version: pruned like any other
    (base / "notes").mkdir()  # not a version: never touched
    callback = so_keras.OptimizedExportCallback(str(base), every_n_epochs=1, keep=2,
                                                options=NOT_MEASURED)

    model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[callback])

    # Epochs 1..3 published 8, 9, 10; the last epoch was exported, so fit's end adds none.
    assert [r.version for r in callback.reports] == [8, 9, 10]
    assert _entries(str(base)) == ["10", "9", "notes"]
    _assert_same_weights(exports[-1], model)
    out = capsys.readouterr().out
    assert f"published {base / '10'}" in out and "pruned 7" in out and "pruned 8" in out


def test_callback_exports_the_final_weights_when_the_last_epoch_was_not_exported(
        data, tmp_path, exports):
    x, y = data
    model = _model(x)
    base = str(tmp_path / "base")
    callback = so_keras.OptimizedExportCallback(base, every_n_epochs=2, options=NOT_MEASURED,
                                                verbose=0)

    model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[callback])

    assert _entries(base) == ["1", "2"]  # after epoch 2, and at the end (epoch 3)
    _assert_same_weights(exports[-1], model)  # the weights after epoch 3
    # CONTROL: epoch 3 moved the weights, so the epoch 2 export holds others.
    assert any((a != b).any() for a, b in zip(exports[0], exports[-1], strict=True))


def test_callback_parity_failure_is_logged_and_training_continues(data, tmp_path, caplog,
                                                                  exports):
    x, y = data
    model = _model(x)
    base = str(tmp_path / "base")
    callback = so_keras.OptimizedExportCallback(base, every_n_epochs=1, options=LOSSY,
                                                verbose=0)

    with caplog.at_level(logging.ERROR, logger="serving_opt.keras"):
        history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback])

    assert len(history.history["loss"]) == 2  # training was not interrupted
    assert [type(e) for e in callback.failures] == [ParityError, ParityError]
    assert callback.reports == [] and _entries(base) == []
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "epoch 1" in messages[0]
    assert "nothing published, training continues: parity failed" in messages[0]


def test_callback_fatal_stops_training(data, tmp_path, exports):
    x, y = data
    model = _model(x)
    callback = so_keras.OptimizedExportCallback(str(tmp_path / "base"), every_n_epochs=1,
                                                options=LOSSY, fatal=True, verbose=0)
    with pytest.raises(ParityError):
        model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[callback])
    assert _entries(str(tmp_path / "base")) == []


@pytest.mark.parametrize("kwargs, match", [
    ({"keep": 0}, "keep=0"),
    ({"every_n_epochs": 0}, "every_n_epochs=0"),
    ({"options": OptimizeOptions(output=OutputOptions(version=1))},
     "options.output.version is fixed"),
])
def test_callback_rejects_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(UsageError, match=match):
        so_keras.OptimizedExportCallback(str(tmp_path), **kwargs)


# --- helpers and packaging -----------------------------------------------------------------


def test_prune_versions_keeps_the_highest_integer_versions_only(tmp_path):
    for name in ("1", "2", "10", "3", "latest", ".serving-opt-staging-11-x"):
        (tmp_path / name).mkdir()
    (tmp_path / "4").write_text("a file, not a version")

    removed = so_keras.prune_versions(str(tmp_path), keep=2)

    assert removed == [str(tmp_path / "1"), str(tmp_path / "2")]
    assert _entries(str(tmp_path)) == [".serving-opt-staging-11-x", "10", "3", "4", "latest"]


def test_import_keras_finds_the_real_keras_even_from_inside_the_package():
    # Scripts run from serving_opt/ (and Bazel py_binaries whose main lives there) have
    # that directory on sys.path, where serving_opt/keras.py would shadow Keras.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import keras; "
            "import serving_opt.keras as k; "
            "print(keras.__file__, hasattr(keras, 'Sequential'), k.keras is keras)")
    result = subprocess.run(
        [sys.executable, "-c", code, os.path.join(ROOT, "serving_opt")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stderr
    path, has_sequential, same = result.stdout.split()
    assert os.path.join("serving_opt", "keras.py") not in path
    assert (has_sequential, same) == ("True", "True")
