"""``serving-opt compare``: baseline vs candidate on a whole evaluation set, on Apache Beam.

    report = compare("models/clf/1", "models/clf/2", "gs://bucket/eval/part-*.tfrecord")
    print(format_report(report))

The examples (TFRecord shards of serialized tf.Example, or JSON lines of requests) are
read by Beam from any filesystem it has (local, gs://, s3://), batched, run through both
models with Beam's ``RunInference`` and our SavedModel handler (the session loader, as
TF Serving loads), and compared per signature output with combiners: count, mismatches
under the parity gate's tolerances, abs/rel diffs, a histogram, top-1 agreement and class
confusion for classifiers, and the worst examples by key (``<shard>:<record index>``).
Nothing is collected to the driver but the combined statistics. See docs/compare.md.

The package: ``options`` (what it can be told), ``driver`` (checks, plans, runs),
``pipeline`` (the Beam side), ``stats`` (the mergeable per-output accumulators) and
``report`` (the verdict, by the rules of ``serving_opt.core.gates``, and its tables).

Needs the ``beam`` extra (``pip install serving-opt[beam]``); the error says so.
"""

from serving_opt.compare.driver import compare, execute, require_beam
from serving_opt.compare.options import DEFAULT_BATCH_SIZE, CompareOptions
from serving_opt.compare.report import CompareReport, OutputComparison, format_report

__all__ = ["DEFAULT_BATCH_SIZE", "CompareOptions", "CompareReport", "OutputComparison",
           "compare", "execute", "format_report", "require_beam"]
