"""Vocabulary lookups in a quarter of their memory, at about their speed, for the lossy
modes (``--quantize``).

A vocabulary file table (``categorical_column_with_vocabulary_file``,
``index_table_from_file``: a ``HashTableV2`` filled by ``InitializeTableFromTextFileV2``
with whole lines as keys and line numbers as values) is built by the init op when the
server loads the model. For 1M words the hash table holds ~68 MiB (a hash map of
24-byte strings and int64 values at half load), as much as a fifth of an int8 embedding
table of 256 columns.

Here such a table becomes a ``MutableDenseHashTableV2`` from the words' 64-bit
fingerprints (``StringToHashBucketFast``: TF's own Fingerprint64, computed by the same
kernel the server runs) to their line numbers, laid out here by TF's own insert kernel
and stored as the table's two bucket arrays in the checkpoint (16 bytes a bucket, at most
96% full). The init op hands both arrays to the table (``LookupTableImportV2`` keeps the
tensors it is given, so nothing is copied) and empties the variables. A request hashes
its keys and makes one lookup, whose probes start at the fingerprint's low bits: the
``LookupTableFindV2`` node keeps its name and its consumers, and the string table and
its initializer leave the graph. What the lookup costs a request, against the string
table's and a binary search's, is measured in docs/int8.md.

Not exact for every possible key, and so only with ``--quantize``, where the lossy gate
measures the result: a key that is not in the vocabulary gets a word's line number if
their fingerprints collide, for 1M words a chance of about 1 in 10^13 per unknown
key (1M in 2^63). The
vocabulary's own fingerprints are checked to be distinct, else the table is left as it
is. The words and line numbers come from the real table (built here by TensorFlow with
the model's own attributes and exported), so the file is read exactly as the server
would read it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from serving_opt.savedmodel import checkpoint
from serving_opt.savedmodel.checkpoint import KeptVariable
from serving_opt.savedmodel.graph import attr, data_consumers, make_node, node_name, var_handle

_SCOPE = "serving_opt_vocabulary"
_WHOLE_LINE, _LINE_NUMBER = -2, -1  # InitializeTableFromTextFileV2's key/value indices
_BUCKETS = (1 << 63) - 1  # StringToHashBucketFast's largest: Fingerprint64 mod 2^63 - 1
# Never a fingerprint (they are in [0, _BUCKETS)): the dense table's free and deleted
# bucket markers.
_EMPTY_KEY, _DELETED_KEY = -1, -2
# How full the buckets (a power of two of them, as the table requires) may be. At 95%,
# TF's quadratic probing takes about three probes for a word and twenty for an unknown
# key; half full would be faster for unknown keys and take twice the memory (measured:
# docs/int8.md).
_MAX_LOAD = 0.96


@dataclass(frozen=True)
class CompactVocabulary:
    """One vocabulary table stored as a fingerprint hash table, for the report."""

    table: str
    entries: int
    bytes_after: int  # its variables


def _scalar_const(node) -> bool:
    return node is not None and node.op == "Const" and \
        not node.attr["value"].tensor.tensor_shape.dim


def _asset_path(source_dir: str, filename: str | None) -> str | None:
    """The model's asset file ``filename``, or None unless it is a regular file inside
    the model's own ``assets/`` (no other directory, no link out of it): its words go
    into the published checkpoint, and no host file may."""
    if not filename or not source_dir or os.path.basename(filename) != filename \
            or filename in (".", ".."):
        return None
    assets = os.path.realpath(os.path.join(source_dir, "assets"))
    path = os.path.realpath(os.path.join(assets, filename))
    if os.path.dirname(path) != assets or not os.path.isfile(path):
        return None
    return path


def _candidates(graph, graph_def) -> list[tuple]:
    """``(table, initializer, finds, sizes, vocabulary path)`` of every table this can
    store compactly, and nothing else reads."""
    from tensorflow.core.framework import types_pb2

    nodes = {n.name: n for n in graph_def.node}
    users = data_consumers(graph_def.node)
    assets = {node_name(a.tensor_info.name): a.filename for a in graph.asset_file_defs}
    # Protected, the table (stateful) and its initializer (a collection's) may go here:
    # this stage takes both out together, and their collection entries with them.
    keep = set(graph.signature_input_nodes() + graph.signature_output_nodes())
    found = []
    for table in graph_def.node:
        if table.op != "HashTableV2" or table.name in keep \
                or table.attr["key_dtype"].type != types_pb2.DT_STRING \
                or table.attr["value_dtype"].type != types_pb2.DT_INT64:
            continue
        by_op: dict[str, list] = {}
        for node, index in users.get(table.name, []):
            by_op.setdefault(node.op if index == 0 else "other", []).append(node)
        inits = by_op.pop("InitializeTableFromTextFileV2", [])
        finds = by_op.pop("LookupTableFindV2", [])
        sizes = by_op.pop("LookupTableSizeV2", [])
        if by_op or len(inits) != 1 or not finds:
            continue
        init = inits[0]
        if init.attr["key_index"].i != _WHOLE_LINE or init.attr["value_index"].i != \
                _LINE_NUMBER or init.name in (graph.init_op, *keep):
            continue
        path = _asset_path(graph.source_dir, assets.get(node_name(init.input[1])))
        if path is None:
            continue
        if not all(_scalar_const(nodes.get(node_name(f.input[2]))) for f in finds):
            continue
        found.append((table, init, finds, sizes, path))
    return found


def _words(table, init, path: str) -> tuple[np.ndarray, np.ndarray]:
    """The table's keys and values as the server builds it: the model's own two nodes,
    run here on the vocabulary file, and exported."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2, types_pb2

    mini = graph_pb2.GraphDef()
    mini.node.add().CopyFrom(table)
    mini.node.append(make_node("filename", "Const", dtype=attr(type=types_pb2.DT_STRING),
                               value=attr(tensor=tf.make_tensor_proto(path))))
    node = mini.node.add()
    node.CopyFrom(init)
    del node.input[:]
    node.input.extend([table.name, "filename"])
    node.ClearField("device")
    mini.node[0].ClearField("device")
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(mini, name="")
        handle = g.get_tensor_by_name(f"{table.name}:0")
        keys, values = tf.raw_ops.LookupTableExportV2(table_handle=handle, Tkeys=tf.string,
                                                      Tvalues=tf.int64)
        fingerprints = tf.strings.to_hash_bucket_fast(keys, _BUCKETS)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(g.get_operation_by_name(init.name))
            return sess.run([fingerprints, values])


def bucket_count(words: int) -> int:
    """The fewest buckets (a power of two, at least 4) that hold ``words`` at most
    :data:`_MAX_LOAD` full.

    >>> bucket_count(1_000_000), bucket_count(1_000), bucket_count(1)
    (1048576, 2048, 4)
    """
    count = 4
    while words > count * _MAX_LOAD:
        count *= 2
    return count


def buckets(fingerprints: np.ndarray, lines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bucket arrays (keys, values: int64 ``[buckets, 1]``) of a dense hash table from
    ``fingerprints`` to ``lines``, filled by TensorFlow's own insert kernel, as
    ``LookupTableImportV2`` takes them back. Inserted in fingerprint order: where a word
    lands depends on the words inserted before it, and the string table's export order
    on its hash seed, so the same vocabulary always gives the same bytes."""
    import tensorflow as tf

    order = np.argsort(fingerprints, kind="stable")
    graph_def = tf.compat.v1.GraphDef()
    graph_def.node.extend(_table_nodes("table", bucket_count(len(fingerprints))))
    with tf.Graph().as_default() as g:
        tf.graph_util.import_graph_def(graph_def, name="")
        table = g.get_tensor_by_name("table:0")
        insert = tf.raw_ops.LookupTableInsertV2(
            table_handle=table, keys=tf.constant(fingerprints[order], tf.int64),
            values=tf.constant(np.asarray(lines)[order], tf.int64))
        with tf.control_dependencies([insert]):
            keys, values = tf.raw_ops.LookupTableExportV2(table_handle=table, Tkeys=tf.int64,
                                                          Tvalues=tf.int64)
        with tf.compat.v1.Session(graph=g) as sess:
            return sess.run([keys, values])


def _table_nodes(name: str, count: int | None = None) -> list:
    """The table's node (and its two marker constants), with ``count`` buckets. The
    served table takes the fewest (the default): the import replaces them, and the
    allocator would keep a vocabulary-sized first set for the server's life (16 MiB for
    1M words, measured)."""
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    i64 = attr(type=types_pb2.DT_INT64)
    markers = [make_node(f"{name}/{what}_key", "Const", dtype=i64,
                         value=attr(tensor=tf.make_tensor_proto(key, tf.int64)))
               for what, key in (("empty", _EMPTY_KEY), ("deleted", _DELETED_KEY))]
    return markers + [make_node(
        name, "MutableDenseHashTableV2", [m.name for m in markers], key_dtype=i64,
        value_dtype=i64, shared_name=attr(s=name.encode()),
        initial_num_buckets=attr(i=bucket_count(0) if count is None else count),
        max_load_factor=attr(f=_MAX_LOAD))]


def _load(table: str, keys_var: str, values_var: str) -> list:
    """Init-op nodes: the bucket arrays handed to ``table`` (kept as they are, not
    copied), then the variables emptied, or the server would hold them twice."""
    from tensorflow.core.framework import types_pb2

    i64 = attr(type=types_pb2.DT_INT64)
    base = f"{table}/load"
    nodes = [make_node(f"{base}/keys", "ReadVariableOp", [keys_var], dtype=i64),
             make_node(f"{base}/values", "ReadVariableOp", [values_var], dtype=i64),
             make_node(f"{base}/import", "LookupTableImportV2",
                       [table, f"{base}/keys", f"{base}/values"], Tin=i64, Tout=i64)]
    frees = []
    for var in (keys_var, values_var):
        nodes += checkpoint.emptied(var, types_pb2.DT_INT64, f"{base}/import", var)
        frees.append(nodes[-1].name)
    nodes.append(make_node(f"{base}/done", "NoOp", [f"^{f}" for f in frees]))
    return nodes


def _lookup(find, table: str, flat: bool) -> tuple[list, object]:
    """The nodes that answer ``find`` from ``table``; the last one takes its name (so
    its consumers are untouched). ``flat``: the keys are known to be a vector, which the
    dense table requires, so no reshape around the lookup."""
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    i32, i64 = attr(type=types_pb2.DT_INT32), attr(type=types_pb2.DT_INT64)
    base = f"{find.name}/{_SCOPE}"
    keys, default = find.input[1], find.input[2]
    controls = [i for i in find.input if i.startswith("^")]
    nodes = [make_node(f"{base}/hash", "StringToHashBucketFast", [keys],
                       num_buckets=attr(i=_BUCKETS))]
    if flat:
        answer = make_node(find.name, "LookupTableFindV2", [table, f"{base}/hash", default]
                           + controls, Tin=i64, Tout=i64)
    else:
        nodes += [
            make_node(f"{base}/shape", "Shape", [keys], T=attr(type=types_pb2.DT_STRING),
                      out_type=i32),
            make_node(f"{base}/vector_shape", "Const", dtype=i32,
                      value=attr(tensor=tf.make_tensor_proto([-1], tf.int32))),
            make_node(f"{base}/hashes", "Reshape", [f"{base}/hash", f"{base}/vector_shape"],
                      T=i64, Tshape=i32),
            make_node(f"{base}/ids", "LookupTableFindV2", [table, f"{base}/hashes", default],
                      Tin=i64, Tout=i64)]
        answer = make_node(find.name, "Reshape", [f"{base}/ids", f"{base}/shape"] + controls,
                           T=i64, Tshape=i32)
    if find.device:
        answer.device = find.device
    return nodes, answer


def _vector_tensors(graph_def, names: list[str]) -> set[str]:
    """Which of ``names`` (tensors) TensorFlow's shape inference knows to be vectors."""
    import tensorflow as tf

    try:
        with tf.Graph().as_default() as g:
            tf.graph_util.import_graph_def(graph_def, name="")
            return {n for n in names
                    if g.get_tensor_by_name(n if ":" in n else f"{n}:0").shape.rank == 1}
    except (ValueError, KeyError, TypeError, tf.errors.OpError):
        return set()  # the reshapes cost a little, and are always right


def compact_vocabularies(graph, min_entries: int, work_dir: str) -> tuple:
    """Stores every vocabulary file table of at least ``min_entries`` words as a
    fingerprint hash table (see the module); returns ``(graph, [CompactVocabulary])``.
    """
    import tensorflow as tf
    from tensorflow.core.framework import tensor_shape_pb2, types_pb2

    if graph.variables_dir is not None and not graph.kept_variables:
        return graph, []  # the source's own saver and checkpoint: not ours to extend
    graph_def = type(graph.graph_def)()
    graph_def.CopyFrom(graph.graph_def)
    new_nodes, removed, done = [], set(), []
    saved: dict[str, np.ndarray] = {}
    kept = list(graph.kept_variables)
    candidates = _candidates(graph, graph_def)
    vectors = _vector_tensors(graph_def, [f.input[1] for *_, finds, _s, _p in candidates
                                          for f in finds]) if candidates else set()
    loads = []
    for table, init, finds, sizes, path in candidates:
        fingerprints, lines = _words(table, init, path)
        if len(fingerprints) < max(1, min_entries) or \
                len(np.unique(fingerprints)) != len(fingerprints):
            continue
        dense = f"{table.name}/{_SCOPE}"
        keys_var, values_var = f"{dense}_keys", f"{dense}_values"
        saved[keys_var], saved[values_var] = buckets(fingerprints, lines)
        for name, what in ((keys_var, "bucket keys (word fingerprints)"),
                           (values_var, "bucket values (line numbers)")):
            kept.append(KeptVariable(name, "VarHandleOp", types_pb2.DT_INT64,
                                     saved[name].nbytes, f"{what} of the vocabulary "
                                     f"{table.name}"))
            # Of unknown shape to the graph: the import's shape function wants the keys
            # a vector, its kernel the [buckets, 1] it exports (as a checkpoint restore
            # feeds it, unknown until run).
            new_nodes.append(var_handle(name, types_pb2.DT_INT64,
                                        tensor_shape_pb2.TensorShapeProto(unknown_rank=True)))
        new_nodes.extend(_table_nodes(dense))
        load = _load(dense, keys_var, values_var)
        new_nodes.extend(load)
        loads.append(load[-1].name)
        for find in finds:
            nodes, answer = _lookup(find, dense, find.input[1] in vectors)
            new_nodes.extend(nodes)
            find.CopyFrom(answer)
        for size in sizes:  # the table's size: now a constant
            controls = [i for i in size.input if i.startswith("^")]
            size.CopyFrom(make_node(size.name, "Const", controls,
                                    dtype=attr(type=types_pb2.DT_INT64), value=attr(
                                        tensor=tf.make_tensor_proto(len(fingerprints),
                                                                    tf.int64))))
        removed.update({table.name, init.name})
        done.append(CompactVocabulary(table.name, len(fingerprints), saved[keys_var].nbytes
                                      + saved[values_var].nbytes))
    if not done:
        return graph, []
    if graph.kept_variables:
        reader = tf.train.load_checkpoint(os.path.join(graph.variables_dir, "variables"))
        for var in graph.kept_variables:
            saved[var.name] = reader.get_tensor(var.name)
        del reader
    graph_def.node.extend(new_nodes)
    part = os.path.join(work_dir, "vocabulary", "variables")
    checkpoint.save_arrays(part, saved)
    del saved
    collections = {key: [n for n in names if n not in removed]
                   for key, names in graph.collections.items()}
    # Right after the restore, TF Serving runs the init op: the tables are filled there.
    init_op = f"{_SCOPE}/init"
    graph_def.node.append(make_node(init_op, "NoOp", ([f"^{graph.init_op}"] if graph.init_op
                                                      else []) + [f"^{x}" for x in loads]))
    return checkpoint.replace_saver(graph, graph_def, kept, os.path.dirname(part),
                                    removed=frozenset(removed), protect=(init_op,),
                                    collections=collections, init_op=init_op,
                                    init_op_source=graph.init_op_source or "main_op"), done
