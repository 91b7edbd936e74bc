"""serving-opt compare on Beam's DaskRunner, against a distributed.LocalCluster of two
worker processes: the same counts as DirectRunner, exactly, on the same examples."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("apache_beam")
distributed = pytest.importorskip("distributed")

from serving_opt import samples  # noqa: E402
from serving_opt.compare import CompareOptions, compare  # noqa: E402
from serving_opt.compare import pipeline as pipeline_lib  # noqa: E402
from serving_opt.errors import UsageError  # noqa: E402


def write_shards(directory: str, records: list[bytes], shards: int) -> list[str]:
    import tensorflow as tf

    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"part-{s}.tfrecord") for s in range(shards)]
    for s, path in enumerate(paths):
        with tf.io.TFRecordWriter(path) as w:
            for r in records[s::shards]:
                w.write(r)
    return paths


def counts(report) -> dict:
    """Everything in the report that must not depend on the runner (means are sums in
    whatever order the workers add them: left out)."""
    return {
        "examples": report.examples, "shards": report.shards, "ok": report.ok,
        "errors": report.errors, "skipped": report.skipped,
        "outputs": sorted(
            (o.signature, o.output, o.examples, o.elements, o.mismatches,
             o.mismatched_examples, o.max_abs_diff, o.max_rel_diff,
             tuple(sorted(o.histogram.items())), o.top1_rows, o.top1_agreement,
             tuple(o.confusion)) for o in report.outputs),
    }


@pytest.fixture(scope="module")
def models_and_examples(tmp_path_factory):
    root = tmp_path_factory.mktemp("dask")
    # Other weights: mismatches, a confusion matrix and a histogram to count.
    baseline = samples.build_classifier(str(root / "baseline" / "1"), seed=0)
    candidate = samples.build_classifier(str(root / "candidate" / "1"), seed=1)
    paths = write_shards(str(root / "examples"), samples.sample_examples(800, seed=5), 4)
    return baseline, candidate, os.path.dirname(paths[0]) + "/part-*.tfrecord"


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as c:
        yield c


def dask_options(cluster) -> CompareOptions:
    return CompareOptions(runner="DaskRunner",
                          pipeline_args=(f"--dask_client_address={cluster.scheduler_address}",))


@pytest.fixture(scope="module")
def direct(models_and_examples):
    return compare(*models_and_examples)


def test_dask_cluster_counts_equal_direct_runners(models_and_examples, cluster, direct):
    baseline, candidate, pattern = models_and_examples
    dask = compare(baseline, candidate, pattern, dask_options(cluster))
    assert direct.examples == 800 and direct.runner == "DirectRunner"
    assert dask.runner == "DaskRunner"
    assert any(o.mismatches for o in direct.outputs)  # there is something to count
    assert counts(dask) == counts(direct)
    # The run was on the two worker processes, still both there.
    assert len(cluster.scheduler_info["workers"]) == 2


def test_control_batch_elements_on_dask_loses_the_last_batches(models_and_examples, cluster,
                                                                 monkeypatch):
    # Why batches are made as shards are read on Dask: its runner drops what a DoFn
    # emits in finish_bundle, where BatchElements leaves each bundle's last batch.
    baseline, candidate, pattern = models_and_examples
    monkeypatch.setattr(pipeline_lib, "batches_when_read", lambda p: False)
    report = compare(baseline, candidate, pattern, dask_options(cluster))
    assert report.examples == 800
    assert all(o.examples < 800 for o in report.outputs)


def test_dask_without_a_cluster_is_refused_unless_unsandboxed_is_allowed(
        models_and_examples):
    baseline, candidate, pattern = models_and_examples
    with pytest.raises(UsageError, match="outside the sandbox.*--dask_client_address"):
        compare(baseline, candidate, pattern, CompareOptions(runner="DaskRunner"))


def test_dask_without_a_cluster_and_unsandboxed_runs_its_own_local_cluster(
        models_and_examples, direct):
    report = compare(*models_and_examples, CompareOptions(
        runner="DaskRunner", direct_num_workers=2, allow_unsandboxed=True))
    assert report.workers == 2
    assert counts(report) == counts(direct)
