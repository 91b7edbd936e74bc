"""Export a Keras model for TF Serving, optimized and proven, as a numbered version.

    import serving_opt.keras

    report = serving_opt.keras.export(model, "/models/clf")   # -> /models/clf/<next version>
    model.fit(x, y, epochs=10, callbacks=[
        serving_opt.keras.OptimizedExportCallback("/models/clf", every_n_epochs=2, keep=3),
    ])

:func:`export` does what ``model.export(path, format="tf_saved_model")`` does, into a
temporary directory, then runs :func:`serving_opt.optimize` on it: the version
directory under ``export_dir_base`` appears (by rename) only after the parity gate
proved that the optimized model answers like Keras' own export, so TF Serving never
sees a half-written or wrong version.

Import this module as ``serving_opt.keras`` (``from serving_opt import keras`` would
shadow the real ``keras`` in your namespace). Inside, ``import keras`` is an absolute
import and resolves to the real Keras package; see ``serving_opt/keras.py``
for the one case where it would not.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import keras  # noqa: E402 - after the module docstring's imports

from serving_opt.errors import ServingOptError, UsageError  # noqa: E402
from serving_opt.options import MeasureOptions  # noqa: E402
from serving_opt.pipeline.optimizer import OptimizeOptions, OptimizeReport, optimize  # noqa: E402
from serving_opt.savedmodel import writer  # noqa: E402

logger = logging.getLogger("serving_opt.keras")  # the public path

# Keras 3 (TF 2.16+) is the target; Keras 2 (TF 2.15) lacks the `format`/`verbose` arguments.
_KERAS_3 = int(keras.__version__.split(".")[0]) >= 3

# No benchmark by default: exports run inside training, and the benchmark only
# measures (it never gates). Pass OptimizeOptions(benchmark_runs=100) to get it.
DEFAULT_OPTIONS = OptimizeOptions(measure=MeasureOptions(benchmark_runs=0))

# One endpoint: a tf.function (traced, or with an input_signature), a
# (callable, input_signature) pair, or an input signature for the model itself.
Endpoint = Any

Progress = Callable[[str], None]


def export(
    model: keras.Model,
    export_dir_base: str,
    *,
    signatures: Mapping[str, Endpoint] | None = None,
    options: OptimizeOptions = DEFAULT_OPTIONS,
    progress: Progress | None = None,
) -> OptimizeReport:
    """Exports ``model`` for serving, optimizes it and publishes ``<export_dir_base>/<N>``.

    ``signatures=None`` writes what ``model.export()`` writes: the model's ``call``
    under ``serve`` and ``serving_default``. A dict adds one endpoint per entry through
    ``keras.export.ExportArchive``; each value is a ``tf.function`` (traced at least
    once, or with an ``input_signature``), a ``(callable, input_signature)`` pair, or
    an input signature for the model itself (``ExportArchive.add_endpoint``'s format,
    a list with one entry per positional argument; a single spec or dict is wrapped).
    As with ``ExportArchive``, the first endpoint is also published as
    ``serving_default`` unless one has that name.

    ``options`` are :class:`~serving_opt.OptimizeOptions` (default: no benchmark);
    ``options.output.version`` picks the version, else the next free one.

    Raises ParityError when the optimized model does not answer like Keras' export
    (nothing is published), UsageError for bad ``signatures``/options, and
    ServingOptError for any other failure; the temporary export is always removed.
    """
    if signatures is not None and not signatures:
        raise UsageError("signatures={} names no endpoint",
                         "pass None for the model's call, or a dict of name -> endpoint")
    # Before exporting, so a taken version fails in milliseconds, not after the export.
    if options.output.version is not None:
        writer.check_target(export_dir_base, options.output.version, options.output.overwrite)
    with tempfile.TemporaryDirectory(prefix="serving-opt-keras-") as scratch:
        exported = os.path.join(scratch, "export")
        if progress:
            progress(f"exporting the Keras model to {exported}")
        _write_saved_model(model, exported, signatures)
        return optimize(exported, export_dir_base, options, progress)


def _write_saved_model(model: keras.Model, path: str,
                       signatures: Mapping[str, Endpoint] | None) -> None:
    if signatures is None:
        if _KERAS_3:
            model.export(path, format="tf_saved_model", verbose=False)
        else:  # Keras 2 (TF <= 2.15): no format/verbose arguments, and it prints the endpoints
            with contextlib.redirect_stdout(io.StringIO()):
                model.export(path)
        return
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(model)  # variables, and lookup tables of preprocessing layers
    for name, endpoint in signatures.items():
        if not isinstance(name, str) or not name or name.startswith("__"):
            raise UsageError(f"signature name {name!r} is not usable",
                             "use a non-empty name not starting with '__' (reserved by TF)")
        if isinstance(endpoint, tf.types.experimental.GenericFunction):
            if endpoint.input_signature is not None:
                endpoint.get_concrete_function()  # ExportArchive wants a traced function
            archive.add_endpoint(name, endpoint)
        elif isinstance(endpoint, tuple) and len(endpoint) == 2 and callable(endpoint[0]):
            fn, input_signature = endpoint
            archive.add_endpoint(name, fn, _as_positional(input_signature))
        elif callable(endpoint):
            raise UsageError(
                f"signature {name!r} is a plain callable without an input signature",
                "wrap it in tf.function(input_signature=[...]) or pass (fn, input_signature)",
            )
        else:
            archive.add_endpoint(name, model.__call__, _as_positional(endpoint))
    if _KERAS_3:
        archive.write_out(path, verbose=False)
    else:
        with contextlib.redirect_stdout(io.StringIO()):
            archive.write_out(path)


def _as_positional(input_signature) -> list:
    return list(input_signature) if isinstance(input_signature, (list, tuple)) \
        else [input_signature]


def prune_versions(export_dir_base: str, keep: int) -> list[str]:
    """Deletes all but the ``keep`` highest integer version directories; returns them.

    Each one is first renamed to a hidden name (TF Serving ignores non-integer names),
    so a server polling the base sees a version vanish at once, never half deleted.
    """
    if keep < 1:
        raise UsageError(f"keep={keep} would delete every version", "pass keep >= 1 or None")
    removed = []
    for version in writer.existing_versions(export_dir_base)[:-keep]:
        path = os.path.join(export_dir_base, str(version))
        doomed = tempfile.mkdtemp(prefix=f"{writer.STAGING_PREFIX}pruned-{version}-",
                                  dir=export_dir_base)
        os.rename(path, os.path.join(doomed, "model"))
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(path)
    return removed


class OptimizedExportCallback(keras.callbacks.Callback):
    """Publishes an optimized, parity-checked version during or at the end of ``fit``.

    ``every_n_epochs=None`` exports once, when training ends (also after early
    stopping); ``every_n_epochs=N`` exports after every N-th epoch and, if the last
    epoch was not one of them, once more at the end. ``keep=K`` then deletes all but
    the K highest integer versions in ``export_dir_base`` (the whole base, so a
    resumed run prunes the versions of earlier runs, like Estimator exporters'
    ``exports_to_keep``); ``None`` keeps everything.

    A failed export (parity or otherwise) is logged on the ``serving_opt.keras``
    logger, recorded in ``failures``, and training goes on with nothing published;
    ``fatal=True`` raises instead, which stops ``fit``. Published reports are in
    ``reports``.

    Place it after ``EarlyStopping(restore_best_weights=True)`` in ``callbacks`` so the
    final export sees the restored weights (Keras runs callbacks in list order).
    """

    def __init__(
        self,
        export_dir_base: str,
        *,
        every_n_epochs: int | None = None,
        keep: int | None = None,
        signatures: Mapping[str, Endpoint] | None = None,
        options: OptimizeOptions = DEFAULT_OPTIONS,
        fatal: bool = False,
        verbose: int = 1,
    ) -> None:
        super().__init__()
        if every_n_epochs is not None and every_n_epochs < 1:
            raise UsageError(f"every_n_epochs={every_n_epochs} must be >= 1",
                             "or None to export only at the end of training")
        if keep is not None and keep < 1:
            raise UsageError(f"keep={keep} would delete every version", "pass keep >= 1 or None")
        if options.output.version is not None:
            # Every export publishes a new version; a fixed one would collide on the second.
            raise UsageError("options.output.version is fixed; the callback publishes the "
                             "next free version each time",
                             "leave OptimizeOptions.output.version=None")
        self.export_dir_base = export_dir_base
        self.every_n_epochs = every_n_epochs
        self.keep = keep
        self.signatures = signatures
        self.options = options
        self.fatal = fatal
        self.verbose = verbose
        self.reports: list[OptimizeReport] = []
        self.failures: list[Exception] = []
        self._current = False  # the latest weights were exported (or the attempt failed)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._current = False
        if self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0:
            self._export(f"epoch {epoch + 1}")

    def on_train_end(self, logs: dict | None = None) -> None:
        if not self._current:
            self._export("end of training")

    def _export(self, when: str) -> None:
        self._current = True
        try:
            report = export(self.model, self.export_dir_base, signatures=self.signatures,
                            options=self.options)
        except Exception as e:
            if self.fatal:
                raise
            self.failures.append(e)
            # ServingOptErrors are explained in one line; anything else is a bug worth
            # its traceback. Either way training continues, nothing was published.
            logger.error("OptimizedExportCallback (%s): export to %s failed, nothing "
                         "published, training continues: %s", when, self.export_dir_base,
                         e.one_line() if isinstance(e, ServingOptError) else repr(e),
                         exc_info=not isinstance(e, ServingOptError))
            return
        self.reports.append(report)
        pruned = prune_versions(self.export_dir_base, self.keep) if self.keep else []
        message = (f"OptimizedExportCallback ({when}): published {report.output_dir} "
                   f"({report.parity.summary() if report.parity else 'no parity report'})")
        if pruned:
            message += f"; pruned {', '.join(os.path.basename(p) for p in pruned)}"
        logger.info(message)
        if self.verbose:
            print(message, flush=True)
