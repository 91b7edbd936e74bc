"""Vocabulary lookups in a sixth of their memory, for the lossy modes (``--quantize``).

A vocabulary file table (``categorical_column_with_vocabulary_file``,
``index_table_from_file``: a ``HashTableV2`` filled by ``InitializeTableFromTextFileV2``
with whole lines as keys and line numbers as values) is built by the init op when the
server loads the model. For 1M words the hash table holds ~68 MiB (a hash map of
24-byte strings and int64 values at half load), as much as a fifth of an int8 embedding
table of 256 columns.

Here such a table becomes two variables of the checkpoint: the words' 64-bit
fingerprints, sorted (``StringToHashBucketFast``, TF's own Fingerprint64, computed by
the same kernel the server runs) and ended by a pad that sorts after every hash, and the
line number of each (int32): 12 bytes a word. A lookup hashes the keys, finds each in
the sorted fingerprints (``LowerBound``: a binary search; the pad keeps every position
it returns in bounds) and takes its line number where the fingerprint is there, the
table's default value elsewhere: the ``LookupTableFindV2`` node keeps its name and its
consumers, and the table and its initializer leave the graph. What the lookup costs a
request, against the hash table's, is measured in docs/int8.md.

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
# Never a hash (they are below _BUCKETS): ends the sorted fingerprints, so a hash past
# the last word finds a position in bounds that is not its own.
_PAD = np.iinfo(np.int64).max


@dataclass(frozen=True)
class CompactVocabulary:
    """One vocabulary table stored as sorted fingerprints, for the report."""

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


def index(fingerprints: np.ndarray, lines: np.ndarray, dtype) -> tuple:
    """The fingerprints sorted and ended by :data:`_PAD` (``[1, words + 1]``, as
    ``LowerBound`` searches rows), and their line numbers in that order (``dtype``,
    ``[words + 1]``, the pad's 0)."""
    order = np.argsort(fingerprints, kind="stable")
    ranked = np.append(fingerprints[order].astype(np.int64), _PAD).reshape(1, -1)
    return ranked, np.append(lines[order], 0).astype(dtype)


def _lookup(find, fp_var: str, ids_var: str, ids_dtype: int) -> list:
    """The nodes that answer ``find`` from the sorted fingerprints (see :func:`index`);
    the last one takes its name (so its consumers are untouched)."""
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    i32, i64 = attr(type=types_pb2.DT_INT32), attr(type=types_pb2.DT_INT64)
    base = f"{find.name}/{_SCOPE}"
    keys, default = find.input[1], find.input[2]
    # Everything stays a row, [1, keys], as LowerBound takes and gives it: no reshape
    # but the hashes' and the answer's.
    nodes = [
        make_node(f"{base}/row_shape", "Const", dtype=attr(type=types_pb2.DT_INT32),
                  value=attr(tensor=tf.make_tensor_proto([1, -1], tf.int32))),
        make_node(f"{base}/axis", "Const", dtype=attr(type=types_pb2.DT_INT32),
                  value=attr(tensor=tf.make_tensor_proto(1, tf.int32))),
        make_node(f"{base}/shape", "Shape", [keys], T=attr(type=types_pb2.DT_STRING),
                  out_type=i32),
        make_node(f"{base}/hash", "StringToHashBucketFast", [keys],
                  num_buckets=attr(i=_BUCKETS)),
        make_node(f"{base}/hash_row", "Reshape", [f"{base}/hash", f"{base}/row_shape"],
                  T=i64, Tshape=i32),
        make_node(f"{base}/fingerprints", "ReadVariableOp", [fp_var], dtype=i64),
        make_node(f"{base}/position", "LowerBound",
                  [f"{base}/fingerprints", f"{base}/hash_row"], T=i64, out_type=i32),
        make_node(f"{base}/there", "GatherV2",
                  [f"{base}/fingerprints", f"{base}/position", f"{base}/axis"],
                  Tparams=i64, Tindices=i32, Taxis=i32, batch_dims=attr(i=1)),
        make_node(f"{base}/hit", "Equal", [f"{base}/there", f"{base}/hash_row"], T=i64,
                  incompatible_shape_error=attr(b=True)),
        make_node(f"{base}/line", "ResourceGather", [ids_var, f"{base}/position"],
                  dtype=attr(type=ids_dtype), Tindices=i32, batch_dims=attr(i=0),
                  validate_indices=attr(b=True)),
    ]
    line = f"{base}/line"
    if ids_dtype != types_pb2.DT_INT64:
        nodes.append(make_node(f"{base}/line64", "Cast", [line], SrcT=attr(type=ids_dtype),
                               DstT=i64, Truncate=attr(b=False)))
        line = f"{base}/line64"
    nodes.append(make_node(f"{base}/ids", "SelectV2", [f"{base}/hit", line, default], T=i64))
    answer = make_node(find.name, "Reshape", [f"{base}/ids", f"{base}/shape"], T=i64,
                       Tshape=i32)
    answer.input.extend(i for i in find.input if i.startswith("^"))
    if find.device:
        answer.device = find.device
    return nodes, answer


def compact_vocabularies(graph, min_entries: int, work_dir: str) -> tuple:
    """Stores every vocabulary file table of at least ``min_entries`` words as sorted
    fingerprints (see the module); returns ``(graph, [CompactVocabulary])``.
    """
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    if graph.variables_dir is not None and not graph.kept_variables:
        return graph, []  # the source's own saver and checkpoint: not ours to extend
    graph_def = type(graph.graph_def)()
    graph_def.CopyFrom(graph.graph_def)
    new_nodes, removed, done = [], set(), []
    saved: dict[str, np.ndarray] = {}
    kept = list(graph.kept_variables)
    for table, init, finds, sizes, path in _candidates(graph, graph_def):
        fingerprints, lines = _words(table, init, path)
        if len(fingerprints) < max(1, min_entries) or \
                len(np.unique(fingerprints)) != len(fingerprints):
            continue
        wide = lines.size and (lines.min() < -(1 << 31) or lines.max() >= (1 << 31))
        ids_dtype = types_pb2.DT_INT64 if wide else types_pb2.DT_INT32
        fp_var, ids_var = f"{table.name}/{_SCOPE}_fingerprints", f"{table.name}/{_SCOPE}_ids"
        saved[fp_var], saved[ids_var] = index(fingerprints, lines,
                                              np.int64 if wide else np.int32)
        for name, dtype, what in ((fp_var, types_pb2.DT_INT64, "sorted word fingerprints"),
                                  (ids_var, ids_dtype, "line numbers of the words")):
            kept.append(KeptVariable(name, "VarHandleOp", dtype, saved[name].nbytes,
                                     f"{what} of the vocabulary {table.name}"))
            new_nodes.append(var_handle(name, dtype, saved[name].shape))
        for find in finds:
            nodes, answer = _lookup(find, fp_var, ids_var, ids_dtype)
            new_nodes.extend(nodes)
            find.CopyFrom(answer)
        for size in sizes:  # the table's size: now a constant
            controls = [i for i in size.input if i.startswith("^")]
            size.CopyFrom(make_node(size.name, "Const", controls,
                                    dtype=attr(type=types_pb2.DT_INT64), value=attr(
                                        tensor=tf.make_tensor_proto(len(fingerprints),
                                                                    tf.int64))))
        removed.update({table.name, init.name})
        done.append(CompactVocabulary(table.name, len(fingerprints), saved[fp_var].nbytes
                                      + saved[ids_var].nbytes))
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
    return checkpoint.replace_saver(graph, graph_def, kept, os.path.dirname(part),
                                    removed=frozenset(removed), collections=collections), done
