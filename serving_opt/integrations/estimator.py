"""Optimized Estimator exports: an Exporter for ``train_and_evaluate`` and a one-off export.

TF Serving serves every integer directory of a model base, and an Estimator names
each export ``<export_dir_base>/<timestamp>``. So the plain export must never be
written where TF Serving looks. The layout:

    <model_dir>/export/<name>/<version>          what TF Serving serves: optimized models
    <model_dir>/export/<name>_raw/<timestamp>    the Estimator's plain exports

For each export:

1. the (wrapped) exporter writes the plain export into the raw base
   (:func:`raw_export_base`), with the Estimator's own temp-dir-then-rename and,
   for ``LatestExporter``/``BestExporter``, its own garbage collection there;
2. :func:`serving_opt.optimize` writes the optimized model into a hidden staging
   directory of the served base, proves it against the plain export (parity gate)
   and renames it to ``<base>/<version>``. The version is the export's timestamp,
   the number the Estimator would have used, unless the base already holds that or a
   newer version: then the next free number, so the newest export is always the
   highest version (the one TF Serving's default policy serves);
3. if optimizing fails, by default the plain export is published instead (hard
   links, or a copy across filesystems, staged and renamed in the same way), the
   failure is logged as an error and training goes on. With ``fatal=True``
   :class:`ExportOptimizationError` is raised and nothing is published. Either way
   the plain export stays in the raw base;
4. the served base keeps the newest ``exports_to_keep`` timestamp versions; an old
   version is renamed to a hidden name before it is deleted, so TF Serving never
   sees a half-deleted version.

A version directory therefore only ever appears complete, by a rename. Paths must be
local (or mounted) directories: ``gs://`` model dirs are exported plain, with an error.

``tf.estimator`` exists up to TF 2.15 (with ``tensorflow-estimator``); elsewhere
the exporter and :func:`export_optimized_saved_model` raise a
:class:`~serving_opt.errors.ServingOptError` saying so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from serving_opt.errors import ServingOptError, UsageError
from serving_opt.pipeline import optimizer as optimizer_lib
from serving_opt.pipeline.optimizer import OptimizeOptions, OptimizeReport
from serving_opt.savedmodel import tf_process, writer

logger = logging.getLogger("serving_opt.estimator")  # the public path

RAW_SUFFIX = "_raw"


def _estimator_exporter_base() -> tuple[type, str | None]:
    """``tf.estimator.Exporter`` (train_and_evaluate accepts only its subclasses), or why not."""
    try:
        tf_process.quiet_tensorflow_import()
        import tensorflow as tf

        return tf.estimator.Exporter, None
    except Exception as e:  # AttributeError on TF >= 2.16; ImportError on a broken install
        return object, f"{type(e).__name__}: {e}"


_ExporterBase, _ESTIMATOR_MISSING = _estimator_exporter_base()


def _require_estimator() -> None:
    if _ESTIMATOR_MISSING is None:
        return
    try:
        import tensorflow as tf

        version = f"TensorFlow {tf.__version__}"
    except Exception:  # TF itself cannot be imported: say so rather than guess a version
        version = "this environment"
    raise ServingOptError(
        f"tf.estimator is not available in {version} (Estimators were removed in TF 2.16; "
        f"{_ESTIMATOR_MISSING})",
        "use serving_opt.estimator where the Estimator trains (tensorflow<=2.15 with "
        "tensorflow-estimator, as in `make venv-tf215`), or export the plain SavedModel "
        "and run `serving-opt optimize` on it here",
    )


def raw_export_base(export_dir_base: str) -> str:
    """Where the plain exports for the served base ``export_dir_base`` are kept.

    A sibling directory, outside the base TF Serving watches.
    """
    return os.path.normpath(os.fsdecode(export_dir_base)) + RAW_SUFFIX


class ExportOptimizationError(ServingOptError):
    """Optimizing an export failed with ``fatal=True``; nothing was published.

    ``raw_export_dir`` is the plain export (kept), ``cause`` the original exception and
    ``report`` the optimize report when the failure came with one (e.g. a parity failure).
    """

    raw_export_dir: str | None = None
    cause: BaseException | None = None


@dataclass(frozen=True)
class OptimizedExport:
    """One export: what TF Serving now serves and where the plain export is."""

    export_dir: str  # <base>/<version>: the optimized model, or the plain one on fallback
    raw_export_dir: str  # the Estimator's plain export, kept in the raw base
    version: int
    optimized: bool
    report: OptimizeReport | None  # None when optimizing failed before the gate reported
    error: str | None = None  # why the plain export was published instead


def _check_options(options: OptimizeOptions) -> OptimizeOptions:
    """Fails at construction, not after the first hour of training, on a bad option."""
    if not isinstance(options, OptimizeOptions):
        raise UsageError(f"options must be an OptimizeOptions, got {type(options).__name__}",
                         "pass options=serving_opt.OptimizeOptions(...)")
    if options.output.version is not None or options.output.overwrite:
        raise UsageError(
            "OptimizeOptions.output.version/overwrite cannot be set for Estimator exports",
            "leave them unset: each export is published as its own timestamp version",
        )
    options.check()
    return options


def _check_keep(exports_to_keep: int | None) -> int | None:
    if exports_to_keep is not None and (not isinstance(exports_to_keep, int)
                                        or exports_to_keep <= 0):
        raise UsageError(f"exports_to_keep must be a positive int or None, got "
                         f"{exports_to_keep!r}", "e.g. exports_to_keep=5; None keeps all")
    return exports_to_keep


def _is_remote(path: str) -> bool:
    return "://" in path


def _link_or_copy(src: str, dst: str) -> None:
    # SavedModel files are never modified in place, so sharing inodes with the plain
    # export is safe and makes the fallback instant even for large variables.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _publish_plain(raw_dir: str, base: str, version: int) -> str:
    """Publishes the plain export as ``<base>/<version>``, staged and renamed like the optimizer."""
    staging = writer.make_staging_dir(base, version)
    try:
        shutil.copytree(raw_dir, staging, copy_function=_link_or_copy, dirs_exist_ok=True)
        published = writer.publish(staging, base, version)
        staging = None
        return published
    finally:
        writer.discard(staging)


def _timestamp_versions(base: str) -> list[int]:
    # Like the Estimator's own exporters: only 10-digit names are exports to collect,
    # so a hand-placed version such as 1/ is never deleted.
    return [v for v in writer.existing_versions(base) if len(str(v)) == 10]


def _collect_garbage(base: str, exports_to_keep: int | None) -> list[str]:
    """Deletes all but the newest ``exports_to_keep`` timestamp versions of ``base``."""
    if exports_to_keep is None:
        return []
    removed = []
    for version in _timestamp_versions(base)[:-exports_to_keep]:
        path = os.path.join(base, str(version))
        # Rename first: a version disappears at once instead of file by file, so a
        # server (re)starting meanwhile never tries to load a half-deleted one.
        hidden = tempfile.mkdtemp(prefix=f"{writer.STAGING_PREFIX}gc-{version}-", dir=base)
        try:
            os.rename(path, os.path.join(hidden, "model"))
        except OSError as e:
            logger.warning("serving-opt: could not remove old export %s: %s", path, e)
            os.rmdir(hidden)
            continue
        shutil.rmtree(hidden, ignore_errors=True)
        removed.append(path)
    return removed


def _summary(report: OptimizeReport) -> str:
    after = report.size_after.total if report.size_after else 0
    line = (f"size {report.size_before.total} -> {after} bytes, nodes {report.nodes_before} -> "
            f"{report.nodes_after}, {report.parity.summary() if report.parity else 'no parity'}")
    bench = report.benchmark
    if bench is not None:
        for before, after_lat in zip(bench.before, bench.after):
            line += (f", p50 batch {before.batch_size} {before.p50_ms:.3f} -> "
                     f"{after_lat.p50_ms:.3f} ms")
    return line


@contextlib.contextmanager
def isolated_from_caller_graph() -> Iterator[None]:
    """Runs the optimizer as ``serving-opt optimize`` runs: eagerly, with a fresh default graph.

    An exporter runs inside the training loop, where the default graph is the training
    graph, finalized by the MonitoredSession, and TensorFlow is in graph mode. A stage
    building an op there fails with "Graph is finalized and cannot be modified." (and
    ``--freeze=auto`` then published every export unfrozen, every variable and
    ``global_step`` kept), or builds it without running it. A sandboxed worker is a
    process of its own; in this process (no bubblewrap, ``allow_unsandboxed``) the
    stages build their ops in graphs of their own, and this keeps anything else (TF's
    own loaders) away from the caller's graph, device scopes and graph mode too.
    """
    import tensorflow as tf
    from tensorflow.python.eager import context

    with tf.Graph().as_default(), context.eager_mode():
        yield


def _log_warnings(report: OptimizeReport | None, where: str) -> None:
    # The CLI prints these under its report; a training job only has its log, and a
    # fallback such as "variables kept: freezing failed (...)" must not hide at INFO.
    for warning in report.warnings if report is not None else ():
        logger.warning("serving-opt: %s: %s", where, warning)


def _optimize_and_publish(raw_dir: str, base: str, options: OptimizeOptions,
                          fatal: bool) -> OptimizedExport:
    """Optimizes the plain export ``raw_dir`` into ``base``; the plain one on non-fatal failure."""
    from serving_opt.pipeline import report as report_lib
    stamp = os.path.basename(raw_dir)
    version = int(stamp) if stamp.isascii() and stamp.isdigit() else 0
    # The newest export must be the highest version, or TF Serving keeps serving an older one.
    version = max(version, writer.next_version(base))
    try:
        with isolated_from_caller_graph():
            report = optimizer_lib.optimize(
                raw_dir, base, dataclasses.replace(
                    options, output=dataclasses.replace(options.output, version=version,
                                                        overwrite=False)),
                progress=lambda message: logger.info("serving-opt: %s", message.strip()),
            )
    except Exception as e:  # any failure: a failed optimization must not kill training
        problem = e.one_line() if isinstance(e, ServingOptError) else f"{type(e).__name__}: {e}"
        _log_warnings(getattr(e, "report", None), raw_dir)
        if fatal:
            error = ExportOptimizationError(
                f"optimizing the export {raw_dir} failed: {problem}",
                f"nothing was published in {base}; the plain export is kept at {raw_dir}",
            ).with_report(getattr(e, "report", None))
            error.raw_export_dir = raw_dir
            error.cause = e
            raise error from e
        published = _publish_plain(raw_dir, base, version)
        logger.error(
            "serving-opt: optimizing the export %s failed: %s. Published the PLAIN "
            "(unoptimized) export as %s instead; pass fatal=True to stop training on this.%s",
            raw_dir, problem, published,
            "" if isinstance(e, ServingOptError) else "\n" + traceback.format_exc(),
        )
        return OptimizedExport(published, raw_dir, version, False, getattr(e, "report", None),
                               problem)
    logger.info("serving-opt: published optimized export %s (%s)", report.output_dir,
                _summary(report))
    _log_warnings(report, report.output_dir)
    logger.debug("serving-opt report:\n%s", report_lib.format_optimize_report(report))
    return OptimizedExport(report.output_dir, raw_dir, version, True, report)


class _Inherit:
    def __repr__(self) -> str:
        return "INHERIT"


INHERIT = _Inherit()  # exports_to_keep: take the wrapped exporter's setting


class OptimizingExporter(_ExporterBase):
    """A ``tf.estimator.Exporter`` whose exports TF Serving gets optimized and proven.

    Wraps another exporter (``LatestExporter``, ``BestExporter``, ``FinalExporter``,
    or your own), which decides *when* to export and writes the plain export to
    :func:`raw_export_base`; or, given a name and a ``serving_input_receiver_fn``
    like ``LatestExporter``, exports on every evaluation. Each export is optimized
    and published as ``<model_dir>/export/<name>/<version>`` (see the module doc).

    Args:
        exporter: the exporter to wrap, or the name of a new latest-exporter.
        serving_input_receiver_fn: with a name only, as for ``LatestExporter``.
        options: how to optimize; ``version``/``overwrite`` must stay unset.
        fatal: raise :class:`ExportOptimizationError` (stopping training) when an
            export cannot be optimized, instead of publishing the plain export.
        exports_to_keep: versions kept in the served base; by default the wrapped
            exporter's own ``exports_to_keep`` (none collected for ``FinalExporter``),
            5 for a name; ``None`` keeps all.
        assets_extra, as_text: with a name only, as for ``LatestExporter``.

    ``last_export`` holds the :class:`OptimizedExport` of the latest export.
    """

    def __init__(
        self,
        exporter,
        serving_input_receiver_fn: Callable | None = None,
        options: OptimizeOptions | None = None,
        *,
        fatal: bool = False,
        exports_to_keep: int | None | _Inherit = INHERIT,
        assets_extra: dict | None = None,
        as_text: bool = False,
    ) -> None:
        _require_estimator()
        import tensorflow as tf

        if isinstance(exporter, OptimizingExporter):
            raise UsageError("an OptimizingExporter cannot wrap another OptimizingExporter",
                             "wrap the inner exporter once")
        if isinstance(exporter, str):
            if serving_input_receiver_fn is None:
                raise UsageError(f"OptimizingExporter({exporter!r}) needs a "
                                 "serving_input_receiver_fn", "pass the receiver fn, as for "
                                 "tf.estimator.LatestExporter, or wrap an exporter")
            keep = 5 if exports_to_keep is INHERIT else _check_keep(exports_to_keep)
            # Raw exports are collected like the published ones: same count.
            exporter = tf.estimator.LatestExporter(
                exporter, serving_input_receiver_fn, assets_extra=assets_extra,
                as_text=as_text, exports_to_keep=keep)
        elif isinstance(exporter, tf.estimator.Exporter):
            if serving_input_receiver_fn is not None or assets_extra is not None or as_text:
                raise UsageError(
                    "serving_input_receiver_fn, assets_extra and as_text belong to the "
                    "wrapped exporter", "set them on the exporter you wrap")
            # LatestExporter and BestExporter keep their setting in _exports_to_keep.
            keep = (getattr(exporter, "_exports_to_keep", None) if exports_to_keep is INHERIT
                    else _check_keep(exports_to_keep))
        else:
            raise UsageError(
                f"OptimizingExporter wraps a tf.estimator.Exporter or takes a name, got "
                f"{type(exporter).__name__}",
                "e.g. OptimizingExporter(tf.estimator.LatestExporter('clf', receiver_fn))")
        self._inner = exporter
        self._options = _check_options(options if options is not None else OptimizeOptions())
        self._fatal = bool(fatal)
        self._exports_to_keep = keep
        self.last_export: OptimizedExport | None = None

    @property
    def name(self) -> str:
        """The wrapped exporter's name: the served base is ``<model_dir>/export/<name>``."""
        return self._inner.name

    @property
    def exports_to_keep(self) -> int | None:
        """How many versions the served base keeps (None: all)."""
        return self._exports_to_keep

    def export(self, estimator, export_path, checkpoint_path, eval_result,
               is_the_final_export):
        """Exports plain into the raw base, then optimizes and publishes into ``export_path``.

        Returns the published version directory (as ``bytes`` when the wrapped exporter
        returned bytes, like the Estimator does), or None when the wrapped exporter
        skipped this evaluation (a ``BestExporter`` without improvement, a
        ``FinalExporter`` before the end).
        """
        base = os.path.normpath(os.fsdecode(export_path))
        if _is_remote(base):
            if self._fatal:
                raise UsageError(f"serving-opt exports to local paths, not {base}",
                                 "use a local or mounted model_dir")
            logger.error("serving-opt: %s is not a local path; exporting it plain, "
                         "unoptimized", base)
            return self._inner.export(estimator, export_path, checkpoint_path, eval_result,
                                      is_the_final_export)
        raw = self._inner.export(estimator, raw_export_base(base), checkpoint_path, eval_result,
                                 is_the_final_export)
        if raw is None:
            return None
        result = _optimize_and_publish(os.fsdecode(raw), base, self._options, self._fatal)
        self.last_export = result
        _collect_garbage(base, self._exports_to_keep)
        return os.fsencode(result.export_dir) if isinstance(raw, bytes) else result.export_dir


def export_optimized_saved_model(
    estimator,
    export_dir_base: str,
    serving_input_receiver_fn: Callable,
    options: OptimizeOptions | None = None,
    *,
    fatal: bool = True,
    assets_extra: dict | None = None,
    as_text: bool = False,
    checkpoint_path: str | None = None,
    raw_export_dir_base: str | None = None,
) -> OptimizedExport:
    """Exports ``estimator`` once, optimized, as a new version of ``export_dir_base``.

    The plain export goes to ``raw_export_dir_base`` (default
    :func:`raw_export_base`), the optimized one to ``<export_dir_base>/<version>``.
    Unlike the exporter, a failure raises :class:`ExportOptimizationError` by default
    (nothing published); ``fatal=False`` publishes the plain export instead and says
    why in the result's ``error``. Nothing is garbage collected.
    """
    _require_estimator()
    options = _check_options(options if options is not None else OptimizeOptions())
    base = os.path.normpath(os.fsdecode(export_dir_base))
    raw_base = (os.path.normpath(os.fsdecode(raw_export_dir_base)) if raw_export_dir_base
                else raw_export_base(base))
    if _is_remote(base) or _is_remote(raw_base):
        raise UsageError(f"serving-opt exports to local paths, not {base}",
                         "use a local or mounted directory")
    if os.path.realpath(raw_base) == os.path.realpath(base):
        raise UsageError("raw_export_dir_base is export_dir_base: TF Serving would serve the "
                         "plain exports", "leave raw_export_dir_base unset")
    raw = estimator.export_saved_model(raw_base, serving_input_receiver_fn,
                                       assets_extra=assets_extra, as_text=as_text,
                                       checkpoint_path=checkpoint_path)
    return _optimize_and_publish(os.fsdecode(raw), base, options, fatal)
