"""Words a model knows: its vocabulary assets, and the keys of lookup tables filled from
constants in its graph, so that synthesized string inputs hit real table entries.
"""

from __future__ import annotations

from collections.abc import Sequence

from serving_opt.savedmodel.graph import node_name


def vocabulary_words(asset_paths: Sequence[str], limit: int = 2000) -> list[str]:
    """Words from text assets (first column of each line), to make lookups hit."""
    words: list[str] = []
    for path in asset_paths:
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    token = line.rstrip("\n").split("\t")[0].strip()
                    if token:
                        words.append(token)
                    if len(words) >= limit:
                        return words
        except (OSError, UnicodeDecodeError):
            continue  # binary assets are not vocabularies
    return words


_TABLE_FILL_OPS = frozenset({"LookupTableImportV2", "LookupTableImport", "InitializeTableV2",
                             "InitializeTable", "LookupTableInsertV2", "LookupTableInsert"})


def graph_vocabulary_words(graph_def, limit: int = 2000) -> list[str]:
    """String keys of lookup tables filled from constants in the graph.

    Keras ``StringLookup``/``TextVectorization`` and ``KeyValueTensorInitializer``
    tables keep their vocabulary in the graph, not in an asset file; drawing inputs
    from it makes lookups hit, not only the out-of-vocabulary path. In TF2 models the
    keys reach the initializer function as an argument, so arguments are followed to
    the constant their caller passes.
    """
    from tensorflow.python.framework import tensor_util

    top = {n.name: n for n in graph_def.node}
    functions = {f.signature.name: f for f in graph_def.library.function}
    scopes = {"": top} | {name: {n.name: n for n in f.node_def}
                          for name, f in functions.items()}
    callers: dict[str, list[tuple[str, object]]] = {}
    for scope_name, nodes in scopes.items():
        for node in nodes.values():
            attr = node.attr.get("f")
            if attr is not None and attr.HasField("func") and attr.func.name in functions:
                callers.setdefault(attr.func.name, []).append((scope_name, node))

    def resolve(scope_name: str, tensor: str, depth: int = 0):
        if depth > 8:
            return None
        nodes = scopes[scope_name]
        node = nodes.get(node_name(tensor))
        while node is not None and node.op == "Identity" and node.input:
            node = nodes.get(node_name(node.input[0]))
        if node is not None:
            return node if node.op == "Const" else None
        if scope_name:  # a function argument: follow it to what the callers pass
            args = [a.name for a in functions[scope_name].signature.input_arg]
            if node_name(tensor) in args:
                index = args.index(node_name(tensor))
                for caller_scope, caller in callers.get(scope_name, []):
                    data_inputs = [i for i in caller.input if not i.startswith("^")]
                    if index < len(data_inputs):
                        found = resolve(caller_scope, data_inputs[index], depth + 1)
                        if found is not None:
                            return found
        return None

    words: list[str] = []
    for scope_name, nodes in scopes.items():
        for node in nodes.values():
            if node.op not in _TABLE_FILL_OPS or len(node.input) < 2:
                continue
            keys = resolve(scope_name, node.input[1])
            if keys is None:
                continue
            value = tensor_util.MakeNdarray(keys.attr["value"].tensor)
            if value.dtype != object:
                continue
            for key in value.ravel():
                token = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
                if token:
                    words.append(token)
                if len(words) >= limit:
                    return words
    return words


def model_vocabulary(meta_graph, saved_model_dir: str, limit: int = 2000) -> list[str]:
    """Words the model knows: vocabulary assets first, then in-graph table keys."""
    from serving_opt.savedmodel import loader

    assets = [a.path for a in loader.asset_files(meta_graph, saved_model_dir) if a.path]
    words = vocabulary_words(assets, limit)
    if len(words) < limit:
        words += graph_vocabulary_words(meta_graph.graph_def, limit - len(words))
    return list(dict.fromkeys(words))
