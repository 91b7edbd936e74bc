"""The Beam side of ``serving-opt compare``: read shards, batch, run both models, combine.

    shard paths -> ReadShard (TFRecord of tf.Example, or JSON lines, told apart and
                  framed by serving_opt.savedmodel.examples; keys shard:index)
      -> Reshuffle -> BatchElements -> RunInference(baseline) -> RunInference(candidate)
      -> per (signature, output) batch pairs -> CombinePerKey(OutputStats) -> JSON lines
    (on Beam's DaskRunner: ReadShardBatches makes the batches, see batches_when_read)

Every step streams: a worker holds a batch at a time and the combiners' accumulators
(``stats.OutputStats``) have a fixed size, so memory does not grow with the input.
Imports apache_beam at module level: import it through ``serving_opt.compare``, which
turns a missing Beam into one clear error.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import ModelHandler, RunInference

from serving_opt.compare.stats import ErrorStats, OutputStats
from serving_opt.savedmodel import examples as examples_lib

# Errors raised inside the pipeline (on a worker, maybe another machine) reach the
# driver as text inside the runner's own error; the markers let it find the one line.
MARK_OPEN, MARK_CLOSE = "[serving-opt:", ":serving-opt]"
ERRORS_OUTPUT = "(errors)"


def pipeline_error(problem: str, fix: str) -> RuntimeError:
    return RuntimeError(f"{MARK_OPEN} {problem}; {fix} {MARK_CLOSE}")


# --- reading shards -------------------------------------------------------------------

_RECORD_ERRORS = {  # examples.TFRecordError.problem -> (what, fix)
    "partial header": ("{where} is truncated (a partial header)", "rewrite or re-copy the shard"),
    "length checksum": ("{where}: corrupt length (checksum mismatch)",
                        "the shard is not a TFRecord file or is damaged"),
    "truncated": ("{where} is truncated ({got} of {length} bytes)",
                  "rewrite or re-copy the shard"),
    "data checksum": ("{where}: corrupt data (checksum mismatch)",
                      "rewrite or re-copy the shard"),
}


def _records(f, path: str):
    """The shard's records (examples.iter_tfrecords), damage reported as a pipeline error."""
    try:
        yield from examples_lib.iter_tfrecords(f)
    except examples_lib.TFRecordError as e:
        what, fix = _RECORD_ERRORS[e.problem]
        raise pipeline_error(what.format(where=f"shard {path} record {e.index}", got=e.got,
                                         length=e.length), fix) from None


def _json_rows(f, path: str):
    text = io.TextIOWrapper(io.BufferedReader(f), encoding="utf-8")
    for number, line in enumerate(text, 1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise pipeline_error(f"shard {path} line {number} is not valid JSON ({e})",
                                 'write one JSON request per line, {"alias": [rows...]}') \
                from None
        if not isinstance(request, dict) or not request:
            raise pipeline_error(f"shard {path} line {number} is not a JSON object of inputs",
                                 'write one {"alias": [rows...]} object per line')
        values = {k: examples_lib.decode_json_value(v) for k, v in request.items()}
        lengths = {len(v) if isinstance(v, list) else -1 for v in values.values()}
        if len(lengths) != 1 or -1 in lengths:
            raise pipeline_error(
                f"shard {path} line {number}: every input needs the same batch dimension",
                'e.g. {"x": [[1, 2], [3, 4]], "y": [5, 6]} (2 rows)')
        rows = lengths.pop()
        for row in range(rows):
            yield f"{number}.{row}", {k: v[row] for k, v in values.items()}


class ReadShard(beam.DoFn):
    """A shard path -> (key, payload): payload is a serialized tf.Example (bytes) or one
    row of a JSON request (alias -> value). Keys: ``<shard>:<record index>`` (TFRecord,
    0-based) or ``<shard>:<line>.<row>`` (JSON lines)."""

    def process(self, path: str):
        from google.protobuf.message import DecodeError
        from tensorflow.core.example import example_pb2

        count = 0
        with FileSystems.open(path) as f:  # any filesystem Beam has; .gz by extension
            head = examples_lib.read_exact(f, examples_lib.HEAD_BYTES)
            rest = f
            kind = examples_lib.examples_format(head)
            if kind == "tfrecord":
                for index, record in _records(_Prefixed(head, rest), path):
                    try:
                        example_pb2.Example.FromString(record)
                    except DecodeError as e:
                        raise pipeline_error(
                            f"shard {path} record {index} is not a serialized tf.Example "
                            f"({e})", "write tf.train.Example(...).SerializeToString() "
                            "records") from None
                    count += 1
                    yield f"{path}:{index}", record
            elif kind == "json" or not head.strip():
                for key, row in _json_rows(_Prefixed(head, rest), path):
                    count += 1
                    yield f"{path}:{key}", row
            else:
                raise pipeline_error(
                    f"shard {path} is neither a TFRecord nor JSON lines "
                    f"(starts with {head[:8]!r})",
                    "write TFRecords of serialized tf.Example, or one JSON request per line")
        if not count:
            raise pipeline_error(f"shard {path} holds no examples",
                                 "remove the empty shard or narrow --examples")


class _Prefixed(io.RawIOBase):
    """A read-only stream: ``head`` (already read) followed by the rest of ``f``."""

    def __init__(self, head: bytes, f) -> None:
        self._head, self._f = head, f

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._f.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            data, self._head = self._head + self._f.read(), b""
            return data
        if self._head:
            data, self._head = self._head[:n], self._head[n:]
            return data if len(data) == n else data + self._f.read(n - len(data))
        return self._f.read(n)


# --- running the models ----------------------------------------------------------------

@dataclass(frozen=True)
class SignaturePlan:
    """How one signature is fed: serialized examples to one alias, or JSON rows."""

    key: str
    example_alias: str | None  # TFRecord input: the alias taking the batch of examples
    input_dtypes: tuple[tuple[str, str], ...]  # (alias, numpy dtype name or "object")
    outputs: tuple[str, ...]

    def groups(self, payloads: list) -> list[tuple[list[int], dict]]:
        """(row indices, feed) for the rows of a batch this signature takes."""
        if self.example_alias is not None:
            rows = [i for i, p in enumerate(payloads) if isinstance(p, bytes)]
            if not rows:
                return []
            return [(rows, {self.example_alias: np.array([payloads[i] for i in rows],
                                                         dtype=object)})]
        dtypes = dict(self.input_dtypes)
        by_aliases: dict[frozenset, list[int]] = {}
        for i, p in enumerate(payloads):
            if isinstance(p, dict) and p and set(p) <= set(dtypes):
                by_aliases.setdefault(frozenset(p), []).append(i)
        out = []
        for aliases, rows in by_aliases.items():
            feed = {a: np.array([payloads[i][a] for i in rows],
                                dtype=object if dtypes[a] == "object" else dtypes[a])
                    for a in sorted(aliases)}
            out.append((rows, feed))
        return out


@dataclass
class BatchAnswers:
    """One batch flowing through both RunInference steps: its keys, inputs, and per
    signature the answers of each model: role -> key -> [(rows, outputs or error)]."""

    keys: list
    payloads: list
    answers: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.keys)


class _LoadedModel:
    def __init__(self, session, signature_defs: dict, local_dir: str | None) -> None:
        self.session, self.signature_defs, self.local_dir = session, signature_defs, local_dir


def localize(model_dir: str) -> tuple[str, str | None]:
    """A local directory holding the model: itself, or a copy of a remote one (gs://,
    s3://, ...) made through Beam's filesystems. Returns (dir, temporary copy or None)."""
    if "://" not in model_dir:
        return model_dir, None
    scratch = tempfile.mkdtemp(prefix="serving-opt-model-")
    base = model_dir.rstrip("/")
    matches = FileSystems.match([base + "/**"])[0].metadata_list
    for meta in matches:
        relative = meta.path[len(base):].lstrip("/")
        target = os.path.join(scratch, *relative.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with FileSystems.open(meta.path, compression_type="uncompressed") as src, \
                open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return scratch, scratch


class SavedModelHandler(ModelHandler):
    """Beam's model handler for a SavedModel, loaded the way TF Serving loads it: the
    session loader (``serving_opt.savedmodel.loader.load_session``), any signature, TF1 and
    TF2 exports. RunInference loads it once per worker process and shares it between the
    process's threads (``beam.utils.shared``). Takes pre-batched input (a list of
    ``(key, payload)`` or a :class:`BatchAnswers`) and adds this model's answers."""

    def __init__(self, model_dir: str, tags: tuple[str, ...], plans: tuple[SignaturePlan, ...],
                 role: str) -> None:
        super().__init__()
        self.model_dir, self.tags, self.plans, self.role = model_dir, tags, plans, role

    def load_model(self) -> _LoadedModel:
        from serving_opt.savedmodel import loader

        local, scratch = localize(self.model_dir)
        session, meta_graph = loader.load_session(local, self.tags)
        return _LoadedModel(session, {p.key: meta_graph.signature_def[p.key]
                                      for p in self.plans}, scratch)

    def run_inference(self, batch, model: _LoadedModel, inference_args=None):
        from serving_opt.errors import first_line
        from serving_opt.savedmodel.loader import run_signature

        if not isinstance(batch, BatchAnswers):
            batch = BatchAnswers([k for k, _ in batch], [p for _, p in batch])
        mine = batch.answers.setdefault(self.role, {})
        for plan in self.plans:
            results = []
            for rows, feed in plan.groups(batch.payloads):
                try:
                    out = run_signature(model.session, model.signature_defs[plan.key], feed,
                                        plan.outputs)
                except Exception as e:  # noqa: BLE001 - a rejected batch is behaviour
                    out = first_line(e)
                results.append((rows, out))
            mine[plan.key] = results
        return [batch]

    def get_num_bytes(self, batch) -> int:
        payloads = batch.payloads if isinstance(batch, BatchAnswers) else [p for _, p in batch]
        return sum(len(p) if isinstance(p, bytes) else 64 for p in payloads)

    def get_metrics_namespace(self) -> str:
        return f"serving_opt_compare_{self.role}"


def pair_answers(batch: BatchAnswers):
    """((signature, output), item) per output of every signature run on the batch."""
    baseline, candidate = batch.answers["baseline"], batch.answers["candidate"]
    for key, groups in baseline.items():
        for (rows, b_out), (_, c_out) in zip(groups, candidate[key]):
            keys = [batch.keys[i] for i in rows]
            if isinstance(b_out, str) or isinstance(c_out, str):
                yield (key, ERRORS_OUTPUT), ("errors", key, len(rows),
                                             b_out if isinstance(b_out, str) else None,
                                             c_out if isinstance(c_out, str) else None)
                continue
            for alias, value in b_out.items():
                yield (key, alias), ("answers", key, alias, keys, value, c_out.get(alias))


class CompareOutputs(beam.CombineFn):
    """The per-(signature, output) combiner: folds batches into a stats.OutputStats (or
    an ErrorStats for the batches a model rejected). Accumulators have a fixed size."""

    def __init__(self, atol: float, rtol: float, worst_k: int) -> None:
        self.atol, self.rtol, self.worst_k = atol, rtol, worst_k

    def create_accumulator(self):
        return None

    def add_input(self, acc, item):
        if item[0] == "errors":
            _, signature, rows, b_err, c_err = item
            acc = acc or ErrorStats(signature)
            acc.add(rows, b_err, c_err)
            return acc
        _, signature, alias, keys, b, c = item
        if acc is None:
            acc = OutputStats.empty(signature, alias, self.atol, self.rtol, self.worst_k)
        if c is None:
            acc.add_missing(keys, b)
            return acc
        acc.add_batch(keys, b, c)
        return acc

    def merge_accumulators(self, accumulators):
        out = None
        for acc in accumulators:
            if acc is None:
                continue
            out = acc if out is None else out.merge(acc)
        return out

    def extract_output(self, acc):
        return acc


def result_line(keyed) -> str:
    """One JSON line per (signature, output): what the driver turns into the report."""
    (signature, output), acc = keyed
    if isinstance(acc, ErrorStats):
        return json.dumps({"kind": "errors", "signature": signature, "both": acc.both,
                           "baseline_only": acc.baseline_only,
                           "candidate_only": acc.candidate_only,
                           "first_error": acc.first_error})
    return json.dumps({
        "kind": "output", "signature": signature, "output": output, "dtype": acc.dtype,
        "output_kind": acc.kind.value,
        "row_shape": list(acc.row_shape), "examples": acc.examples, "elements": acc.elements,
        "mismatches": acc.mismatches, "mismatched_examples": acc.mismatched_examples,
        "max_abs_diff": acc.max_abs_diff,
        "mean_abs_diff": acc.sum_abs_diff / acc.elements if acc.elements else 0.0,
        "max_rel_diff": acc.max_rel_diff,
        "mean_rel_diff": acc.sum_rel_diff / acc.elements if acc.elements else 0.0,
        "histogram": acc.histogram, "top1_rows": acc.top1_rows,
        "top1_agree": acc.top1_agree,
        "confusion": sorted([b, c, n] for (b, c), n in acc.confusion.items()),
        "worst": [[k, s] for k, s in acc.worst_examples()], "details": acc.details,
    })


class ReadShardBatches(beam.DoFn):
    """A shard path -> lists of up to ``size`` of :class:`ReadShard`'s (key, payload), the
    last one emitted by ``process`` itself: for runners that drop what a DoFn emits in
    ``finish_bundle`` (Beam 2.77's DaskRunner), where BatchElements leaves its last batch."""

    def __init__(self, size: int) -> None:
        self.size = size

    def process(self, path: str):
        batch = []
        for item in ReadShard().process(path):
            batch.append(item)
            if len(batch) == self.size:
                yield batch
                batch = []
        if batch:
            yield batch


def batches_when_read(p) -> bool:
    """Whether batches are made as shards are read (:class:`ReadShardBatches`): on Beam's
    DaskRunner, which drops what a DoFn emits in ``finish_bundle``."""
    from apache_beam.options.pipeline_options import StandardOptions

    return "dask" in str(p.options.view_as(StandardOptions).runner or "").lower()


def build(p, shards: list[str], baseline: SavedModelHandler, candidate: SavedModelHandler,
          *, batch_size: int, atol: float, rtol: float, worst_k: int, results_prefix: str):
    """Adds the comparison to pipeline ``p``; results go to ``<results_prefix>`` as JSON
    lines (one per signature output, plus the count of examples read)."""
    read = p | "Shards" >> beam.Create(shards)
    if batches_when_read(p):
        batches = (read
                   | "ReadBatches" >> beam.ParDo(ReadShardBatches(batch_size))
                   | "Spread" >> beam.Reshuffle())
        count = (batches
                 | "BatchSizes" >> beam.Map(len)
                 | "CountExamples" >> beam.CombineGlobally(sum))
    else:
        examples = (read
                    | "Read" >> beam.ParDo(ReadShard())
                    | "Spread" >> beam.Reshuffle())
        count = examples | "CountExamples" >> beam.combiners.Count.Globally()
        batches = examples | "Batch" >> beam.BatchElements(
            min_batch_size=min(8, batch_size), max_batch_size=batch_size)
    count = count | "CountLine" >> beam.Map(
        lambda n: json.dumps({"kind": "count", "examples": n}))
    stats = (batches
             | "Baseline" >> RunInference(baseline.with_no_batching())
             | "Candidate" >> RunInference(candidate.with_no_batching())
             | "Pair" >> beam.FlatMap(pair_answers)
             | "Combine" >> beam.CombinePerKey(CompareOutputs(atol, rtol, worst_k))
             | "Lines" >> beam.Map(result_line))
    return ((count, stats) | beam.Flatten()
            | "Write" >> beam.io.WriteToText(results_prefix, num_shards=1,
                                             shard_name_template=""))
