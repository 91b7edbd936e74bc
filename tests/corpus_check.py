"""The real-export corpus (tests/corpus): each model through inspect and optimize, and an
independent parity check of what was published.

The parity check here shares no code with serving_opt's: its inputs come from the
graph's own parse op (``ParseExample``/``ParseExampleV2``, at the top level or in a
library function) and from the placeholders' shapes, read here; both models are loaded
with TensorFlow's own session loader and run on the same feeds. It is what a reviewer
would do by hand to check that a published model answers like its original.

The corpus's models are the project's own or TF Serving's test exports (trusted), so
this module runs them in-process; serving_opt's own stages still run them sandboxed.

Example:
    >>> result = check_model(corpus_entry("tf-2.15/keras2"), workdir)
    >>> result.verdict, result.reason
    ('published', 'independent parity: 2 signatures, 5 outputs equal')
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Iterable

import numpy as np

# The source tree's copy, also under Bazel, whose runfiles are symlinks out of each model
# directory (which inspect and optimize rightly refuse).
CORPUS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "corpus")
PARSE_OPS = ("ParseExample", "ParseExampleV2")
BATCH = 3


# What inspect rightly says of the original (a risk code) where that is an error, so
# inspect exits 1 and the report names it: the model is still published, repaired.
EXPECTED_INSPECT_ERRORS = {
    # A Builder given a V1 saver: TF Serving's loader restores nothing from it.
    "handbuilt/tf1_saver_v1": "variables_v1_checkpoint",
    # Keras 3 through tf.saved_model.save: TF Serving loads it and fails every request.
    **{f"tf-2.{minor}/{kind}": "unbound_variables" for minor in (16, 21) for kind in (
        "keras3_saved_model_save", "keras3_subclassed_saved_model_save",
        # The same variables reached through a tf.Module's own serving function.
        "keras3_module_wrapped")},
}


def tags(entry: dict) -> list[str]:
    """The MetaGraph's tags as the manifest records them (an old TF Hub export has none)."""
    return list(entry.get("tags", ["serve"]))


def corpus_entries(extra_dir: str | None = None) -> list[dict]:
    """The manifest's entries (tests/corpus/corpus.json), each with an absolute path;
    plus every SavedModel under ``extra_dir`` (exports that cannot be committed here,
    such as TF Serving's own testdata: ``make corpus CORPUS_EXTRA=dir``)."""
    with open(os.path.join(CORPUS, "corpus.json")) as f:
        entries = json.load(f)
    for entry in entries:
        entry["abs_path"] = os.path.join(CORPUS, entry["path"])
    for root, _, files in sorted(os.walk(extra_dir)) if extra_dir else ():
        if "saved_model.pb" in files or "saved_model.pbtxt" in files:
            entries.append({"id": os.path.relpath(root, extra_dir), "abs_path": root,
                            "tf_version": "?", "kind": "extra"})
    return entries


def corpus_entry(model_id: str) -> dict:
    return next(e for e in corpus_entries() if e["id"] == model_id)


def structural_key(model_dir: str) -> str:
    """A hash of a model's structure: every node's op, input count and attr names (top
    level and functions), the saver's version and the collections. Two exports with the
    same key exercise the same code paths of every stage; their values differ.

    Example:
        >>> structural_key(a) == structural_key(b)   # keras2 of TF 2.15 and of TF 2.21
        True
    """
    import hashlib

    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(model_dir, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    items = []
    for meta_graph in saved_model.meta_graphs:
        def shape(node):
            attrs = ",".join(sorted(k for k in node.attr if not k.startswith("_")))
            return f"{node.op}/{len(node.input)}/{attrs}"

        items += sorted(shape(n) for n in meta_graph.graph_def.node)
        items += sorted(shape(n) for f in meta_graph.graph_def.library.function
                        for n in f.node_def)
        items += [f"saver {meta_graph.saver_def.version}", *sorted(meta_graph.collection_def),
                  f"tags {','.join(sorted(meta_graph.meta_info_def.tags))}",
                  *sorted(f"{k} {v.method_name}" for k, v in meta_graph.signature_def.items())]
    return hashlib.sha256("|".join(items).encode()).hexdigest()[:12]


def representatives(entries: list[dict]) -> list[dict]:
    """One entry per :func:`structural_key` (the first in the manifest's order, so the
    oldest TensorFlow that wrote that shape)."""
    seen: dict[str, dict] = {}
    for entry in entries:
        seen.setdefault(structural_key(entry["abs_path"]), entry)
    return list(seen.values())


# --- inputs, from the graph itself -------------------------------------------------------

def _nodes_with_bodies(graph_def) -> Iterable[tuple[dict, object]]:
    """(the body's nodes by name, node) for every node, top level and functions."""
    top = {n.name: n for n in graph_def.node}
    for node in graph_def.node:
        yield top, node
    for function in graph_def.library.function:
        body = {n.name: n for n in function.node_def}
        for node in function.node_def:
            yield body, node


def _const_strings(body: dict, tensor: str) -> list[str] | None:
    from tensorflow.python.framework import tensor_util

    name = tensor.lstrip("^").split(":")[0]
    for _ in range(8):
        node = body.get(name)
        if node is None:
            return None
        if node.op == "Const":
            value = tensor_util.MakeNdarray(node.attr["value"].tensor)
            return [v.decode() if isinstance(v, bytes) else str(v)
                    for v in np.atleast_1d(value).ravel()]
        if node.op != "Identity":
            return None
        name = node.input[0].split(":")[0]
    return None


@dataclasses.dataclass
class ParseSpec:
    """What one parse op reads from a tf.Example: key -> (dtype enum, dense shape or
    None for a sparse feature)."""

    features: dict


def parse_specs(graph_def) -> list[ParseSpec]:
    """Every parse op's features (keys resolved through their constants)."""
    specs = []
    for body, node in _nodes_with_bodies(graph_def):
        if node.op not in PARSE_OPS:
            continue
        data = [i for i in node.input if not i.startswith("^")]
        features: dict = {}
        if node.op == "ParseExample":
            n_sparse, n_dense = node.attr["Nsparse"].i, node.attr["Ndense"].i
            sparse_keys = [(_const_strings(body, t) or ["?"])[0]
                           for t in data[2:2 + n_sparse]]
            dense_keys = [(_const_strings(body, t) or ["?"])[0]
                          for t in data[2 + n_sparse:2 + n_sparse + n_dense]]
        else:
            sparse_keys = _const_strings(body, data[2]) or []
            dense_keys = _const_strings(body, data[3]) or []
            ragged_keys = _const_strings(body, data[4]) or []
            for key, dtype in zip(ragged_keys, node.attr["ragged_value_types"].list.type):
                features[key] = (dtype, None)
        for key, dtype in zip(sparse_keys, node.attr["sparse_types"].list.type):
            features[key] = (dtype, None)
        for key, dtype, shape in zip(dense_keys, node.attr["Tdense"].list.type,
                                     node.attr["dense_shapes"].list.shape):
            dims = tuple(max(d.size, 1) for d in shape.dim)
            features[key] = (dtype, dims)
        specs.append(ParseSpec(features))
    return specs


def _words(model_dir: str) -> list[str]:
    words: list[str] = []
    assets = os.path.join(model_dir, "assets")
    for name in sorted(os.listdir(assets)) if os.path.isdir(assets) else []:
        path = os.path.join(assets, name)
        if os.path.isfile(path) and os.path.getsize(path) < 10 << 20:
            with open(path, "rb") as f:
                for line in f.read().decode("utf-8", "replace").splitlines()[:50]:
                    word = line.split("\t")[0].strip()
                    if word:
                        words.append(word)
    return words + ["zz_out_of_vocabulary"]


def serialized_examples(spec: ParseSpec, count: int, words: list[str], rng) -> np.ndarray:
    """``count`` serialized tf.Examples with every feature the parse op reads."""
    import tensorflow as tf

    out = []
    for row in range(count):
        feature = {}
        for key, (dtype, dims) in sorted(spec.features.items()):
            size = int(np.prod(dims)) if dims is not None else 1
            if dtype == 7:  # DT_STRING
                values = [words[(row + i) % len(words)].encode() for i in range(size)]
                feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
            elif dtype in (9, 3):  # int64, int32
                feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(
                    value=[int(v) for v in rng.integers(0, 4, size)]))
            else:
                feature[key] = tf.train.Feature(float_list=tf.train.FloatList(
                    value=[float(v) for v in rng.normal(size=size)]))
        out.append(tf.train.Example(
            features=tf.train.Features(feature=feature)).SerializeToString())
    return np.array(out, dtype=object)


def _graph_shape(graph, tensor_name: str) -> list | None:
    try:
        shape = graph.get_tensor_by_name(tensor_name).shape
    except (KeyError, ValueError):
        return None
    return None if shape.rank is None else shape.as_list()


def _dense(dtype, shape: list, words: list[str], rng) -> np.ndarray:
    import tensorflow as tf

    np_dtype = tf.as_dtype(dtype).as_numpy_dtype
    if np_dtype is object or tf.as_dtype(dtype) == tf.string:
        flat = [words[i % len(words)].encode() for i in range(int(np.prod(shape)))]
        return np.array(flat, dtype=object).reshape(shape)
    if np.issubdtype(np_dtype, np.bool_):
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(np_dtype, np.integer):
        return rng.integers(0, 3, shape).astype(np_dtype)
    return rng.normal(size=shape).astype(np_dtype)


def candidate_feeds(meta_graph, graph, signature, model_dir: str, seed: int = 0):
    """Feeds to try for one signature, most natural first: (label, {tensor: value})."""
    rng = np.random.default_rng(seed)
    words = _words(model_dir)
    specs = parse_specs(meta_graph.graph_def)
    inputs = dict(signature.inputs)
    if any(info.WhichOneof("encoding") != "name" for info in inputs.values()):
        return []
    def dtype(info) -> int:
        # The graph's tensor, not the declaration: TF 1.0 could declare the wrong one.
        try:
            return graph.get_tensor_by_name(info.name).dtype.as_datatype_enum
        except (KeyError, ValueError):
            return info.dtype

    strings = [a for a, info in inputs.items() if dtype(info) == 7]
    if len(inputs) == 1 and strings and specs:
        alias = strings[0]
        for batch in (BATCH, 1):
            yield (f"tf.Examples from the parse op, batch {batch}",
                   {inputs[alias].name: serialized_examples(specs[0], batch, words, rng)})
    ragged = _ragged_groups(inputs)
    for label, batch, scalar in (("graph shapes", BATCH, False), ("batch 1", 1, False),
                                 ("scalars", 1, True)):
        feed = {}
        for _alias, info in sorted(inputs.items()):
            if scalar:
                shape: list = []
            else:
                # TF 1.0 wrote no tensor_shape at all: unknown, not a scalar.
                declared = None if not info.HasField("tensor_shape") or \
                    info.tensor_shape.unknown_rank else [d.size for d in info.tensor_shape.dim]
                known = _graph_shape(graph, info.name)
                shape = declared if declared is not None else known
                if shape is None:
                    shape = [batch]
                shape = [batch if i == 0 and (d is None or d < 0) else
                         (2 if d is None or d < 0 else d) for i, d in enumerate(shape)]
            feed[info.name] = _dense(dtype(info), shape, words, rng)
        if ragged and not scalar:
            yield label + ", ragged parts as row splits", _ragged_feed(
                feed, inputs, ragged, batch, rng)
        yield label, feed


def _ragged_groups(inputs: dict) -> dict[str, list[str]]:
    """TF's names for a ragged argument flattened into a signature (tf.saved_model.save):
    ``x`` the flat values, ``x_1``... the row splits, outermost first. Read from the
    names (the tool reads the graph), so the two cannot share a mistake."""
    groups = {}
    for alias in inputs:
        splits, k = [], 1
        while f"{alias}_{k}" in inputs and inputs[f"{alias}_{k}"].dtype in (3, 9):
            splits.append(f"{alias}_{k}")
            k += 1
        if splits:
            groups[alias] = splits
    return groups


def _ragged_feed(feed: dict, inputs: dict, groups: dict, rows: int, rng) -> dict:
    feed = dict(feed)
    for values, splits in groups.items():
        count = rows
        for alias in splits:
            lengths = [1 + (i % 3) for i in range(count)]  # never empty: every row answers
            feed[inputs[alias].name] = np.cumsum([0, *lengths]).astype(
                np.int64 if inputs[alias].dtype == 9 else np.int32)
            count = sum(lengths)
        old = np.asarray(feed[inputs[values].name])
        feed[inputs[values].name] = np.resize(old, (count, *old.shape[1:]))
    return feed


# --- the check ------------------------------------------------------------------------------

@dataclasses.dataclass
class Parity:
    signatures: int = 0
    outputs: int = 0
    unfed: list = dataclasses.field(default_factory=list)  # signatures no feed ran
    differing: list = dataclasses.field(default_factory=list)
    used: dict = dataclasses.field(default_factory=dict)  # signature -> feed label

    @property
    def ok(self) -> bool:
        return not self.differing and self.signatures > 0

    def describe(self) -> str:
        if self.differing:
            return f"independent parity FAILED: {self.differing[0]}"
        text = (f"independent parity: {self.signatures} signature(s), {self.outputs} "
                "outputs equal")
        if self.unfed:
            text += f"; no independent input ran {', '.join(self.unfed)}"
        return text


def _session(model_dir: str, tag_set: list[str]):
    import tensorflow as tf

    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        meta_graph = tf.compat.v1.saved_model.loader.load(session, tag_set, model_dir)
    return session, graph, meta_graph


def _run(session, signature, feed: dict) -> dict:
    names = sorted(signature.outputs)
    fetches = [signature.outputs[n].name for n in names]
    return dict(zip(names, session.run(fetches, feed_dict=feed)))


class _ObjectGraph:
    """An original the session loader cannot answer (Keras 3 tf.saved_model.save), run the
    way it does answer: ``tf.saved_model.load``'s signatures, behind ``_run``'s session."""

    def __init__(self, model_dir: str, tag_set: list[str], meta_graph):
        import tensorflow as tf

        self.loaded = tf.saved_model.load(model_dir, tags=tag_set)
        self.meta_graph = meta_graph

    def run(self, fetches, feed_dict):
        import tensorflow as tf

        for key, sig in self.meta_graph.signature_def.items():
            outputs = {t.name: a for a, t in sig.outputs.items()}
            if set(fetches) <= set(outputs) and \
                    {t.name for t in sig.inputs.values()} == set(feed_dict):
                out = self.loaded.signatures[key](**{
                    a: tf.constant(feed_dict[t.name], tf.as_dtype(t.dtype))
                    for a, t in sig.inputs.items()})
                return [out[outputs[f]].numpy() for f in fetches]
        raise KeyError(fetches)

    def close(self):
        self.loaded = None


def independent_parity(original: str, published: str, keys: Iterable[str] | None = None,
                       tag_set: Iterable[str] = ("serve",), object_graph: bool = False,
                       ) -> Parity:
    """Both models on the same independently built feeds, every signature (or ``keys``):
    floats within atol 1e-5 + rtol 1e-4 (the lossless default), the rest equal. With
    ``object_graph`` the original answers through ``tf.saved_model.load``."""
    result = Parity()
    tag_set = list(tag_set)
    ref_session, ref_graph, ref_mg = _session(original, tag_set)
    if object_graph:
        ref_session.close()
        ref_session = _ObjectGraph(original, tag_set, ref_mg)
    new_session, _, new_mg = _session(published, tag_set)
    try:
        for key, signature in sorted(ref_mg.signature_def.items()):
            if keys is not None and key not in keys or key.startswith("__"):
                continue
            if key not in new_mg.signature_def:
                result.differing.append(f"signature {key} missing from the published model")
                continue
            for label, feed in candidate_feeds(ref_mg, ref_graph, signature, original):
                try:
                    expected = _run(ref_session, signature, feed)
                except Exception:  # noqa: BLE001 - try the next kind of input
                    continue
                result.used[key] = label
                published_sig = new_mg.signature_def[key]
                feed = {published_sig.inputs[a].name: feed[signature.inputs[a].name]
                        for a in signature.inputs}
                try:
                    actual = _run(new_session, published_sig, feed)
                except Exception as e:  # noqa: BLE001 - a difference, reported
                    result.differing.append(f"{key}: the published model fails on {label}: "
                                            f"{str(e).splitlines()[0]}")
                    break
                result.signatures += 1
                for name, want in expected.items():
                    got = actual.get(name)
                    result.outputs += 1
                    want, got = np.asarray(want), np.asarray(got)
                    if want.shape != got.shape or want.dtype != got.dtype:
                        result.differing.append(f"{key}/{name}: {got.dtype}{got.shape} != "
                                                f"{want.dtype}{want.shape}")
                    elif want.dtype.kind in "fc":
                        if not np.allclose(got, want, atol=1e-5, rtol=1e-4, equal_nan=True):
                            result.differing.append(f"{key}/{name}: max abs diff "
                                                    f"{np.max(np.abs(got - want)):.3g}")
                    elif not np.array_equal(got, want):
                        result.differing.append(f"{key}/{name}: values differ")
                break
            else:
                result.unfed.append(key)
    finally:
        ref_session.close()
        new_session.close()
    return result


@dataclasses.dataclass
class Result:
    """One corpus model's line: inspect's exit, the optimize verdict and its reason."""

    model_id: str
    tf_version: str
    kind: str
    inspect_exit: int
    verdict: str  # "published" | "refused" | "error"
    reason: str
    seconds: float

    def line(self) -> str:
        return (f"{self.model_id:<34} {self.tf_version:<8} {self.kind:<18} "
                f"inspect={self.inspect_exit} {self.verdict:<9} {self.reason}")


def optimize_options(saved_model_tags: str = "serve"):
    """Defaults except the measuring (the corpus is about getting real exports in)."""
    from serving_opt.options import InputOptions, MeasureOptions, OptimizeOptions

    return OptimizeOptions(measure=MeasureOptions(benchmark_runs=0, cold_start=False),
                           inputs=InputOptions(saved_model_tags=saved_model_tags))


def inspect_exit(model_dir: str) -> int:
    """``serving-opt inspect``'s exit code (run in-process through its CLI entry)."""
    import contextlib
    import io

    from serving_opt.cli import main as cli_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = cli_main.main(["serving-opt", "inspect", f"--saved_model_dir={model_dir}"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return int(code or 0)


def check_model(entry: dict, workdir: str, options=None) -> Result:
    """Inspect, optimize into ``workdir``, then the independent parity check."""
    from serving_opt import optimize
    from serving_opt.errors import ServingOptError

    started = time.monotonic()
    model_dir = entry["abs_path"]
    code = inspect_exit(model_dir)
    out_base = os.path.join(workdir, entry["id"].replace("/", "__"))
    shutil.rmtree(out_base, ignore_errors=True)
    try:
        report = optimize(model_dir, out_base, options or optimize_options(
            saved_model_tags=",".join(tags(entry))))
    except ServingOptError as e:
        return Result(entry["id"], entry.get("tf_version", "?"), entry.get("kind", "?"),
                      code, "refused", str(e).splitlines()[0], time.monotonic() - started)
    parity = independent_parity(
        model_dir, report.output_dir, tag_set=tags(entry),
        object_graph=EXPECTED_INSPECT_ERRORS.get(entry["id"]) == "unbound_variables")
    verdict = "published" if parity.ok else "error"
    return Result(entry["id"], entry.get("tf_version", "?"), entry.get("kind", "?"), code,
                  verdict, parity.describe(), time.monotonic() - started)
