"""The loader's own use of asset files: where the loaders feed asset paths, and
whether a file-reading op reads one (see :mod:`serving_opt.savedmodel.untrusted`)."""

from __future__ import annotations

from serving_opt.savedmodel.graph import node_name, tensor_info_nodes
from serving_opt.savedmodel.host_ops import ASSET_READ_OPS
from serving_opt.savedmodel.untrusted.reach import (
    _data_inputs,
    _follow_identity,
    _Graph,
    _Root,
)

# How many calls deep an asset path is followed from the graph-level call passing it.
_MAX_CALL_DEPTH = 4


def _declared_assets(meta_graph) -> list[tuple[object, str]]:
    """(AssetFileDef, where declared) for every asset the MetaGraph declares, in
    asset_file_def and in the TF1 ``saved_model_assets`` collection alike (a loader
    reads one or the other); None for a collection entry that is no AssetFileDef the
    check can read (another type, or a filename that is not UTF-8)."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import meta_graph_pb2

    from serving_opt.savedmodel import loader

    out: list[tuple[object, str]] = [(a, "asset_file_def") for a in meta_graph.asset_file_def]
    collection = meta_graph.collection_def.get(loader.SAVED_MODEL_ASSETS_COLLECTION)
    if collection is not None:
        where = f"the {loader.SAVED_MODEL_ASSETS_COLLECTION} collection"
        for index, value in enumerate(collection.any_list.value):
            asset = meta_graph_pb2.AssetFileDef()
            try:
                readable = value.Unpack(asset)
            except DecodeError:
                readable = False
            out.append((asset if readable else None, f"entry {index} of {where}"))
    return out


class _Assets:
    """Where the loaders feed asset paths, and whether a file-reading op reads one."""

    def __init__(self, meta_graph, graph: _Graph) -> None:
        from serving_opt.savedmodel import loader

        self.graph = graph
        # The loaders' own choice (loader.cc GetAssetFileDefs, Python's
        # _get_asset_tensors): asset_file_def, else the TF1 saved_model_assets collection.
        defs = list(meta_graph.asset_file_def)
        collection = meta_graph.collection_def.get(loader.SAVED_MODEL_ASSETS_COLLECTION)
        if not defs and collection is not None:
            # An entry that does not unpack is refused by _escaping_assets.
            defs = [a for a, _ in _declared_assets(meta_graph) if a is not None]
        self.asset_nodes = {node_name(a.tensor_info.name) for a in defs}
        self.signature_inputs = {
            n for sig in loader.serving_signatures(meta_graph).values()
            for info in sig.inputs.values() for n in tensor_info_nodes(info)}
        objects = meta_graph.object_graph_def
        self.object_nodes = list(objects.nodes)
        self.bound = {name: list(f.bound_inputs)
                      for name, f in objects.concrete_functions.items()}
        self.memo: dict[tuple, tuple[str | None, frozenset]] = {}
        self.read: set[str] = set()

    def problem(self, function: str | None, node, reaching: list[_Root]) -> str | None:
        """None when ``node`` (an op of host_ops.ASSET_READ_OPS) reads an asset path the
        loader feeds, and only the loader runs it; :attr:`read` then holds the asset
        nodes whose path it may read."""
        self.read: set[str] = set()
        runners = [r for r in reaching if r.kind in ("signature", "save")]
        if runners:
            return (f"{runners[0].desc} runs it, and the loaders feed asset paths only to "
                    "the init op: it reads the path the graph holds")
        data = _data_inputs(node)
        index = ASSET_READ_OPS[node.op]
        if index >= len(data):
            return "it is given no file name"
        if function is None:
            return self._top_level(data[index])
        return self._argument(function, data[index])

    def _asset_node(self, name: str) -> str | None:
        node = self.graph.nodes[name]
        if node.op not in ("Placeholder", "Const"):
            return f"asset node {name!r} is a {node.op}, not a node the loader can feed"
        if name in self.signature_inputs:
            return f"asset node {name!r} is also a signature input: a client names the file"
        self.read.add(name)
        return None

    def _top_level(self, tensor: str) -> str | None:
        name = _follow_identity(self.graph.nodes, tensor)
        node = self.graph.nodes.get(name)
        if node is None:
            return f"its file name {tensor!r} is no node"
        if name in self.asset_nodes:
            return self._asset_node(name)
        if node.op == "ReadVariableOp" and _data_inputs(node):
            handle = node_name(_data_inputs(node)[0])
            return self._remember(("variable", handle), lambda: self._asset_variable(handle))
        return f"its file name comes from {node.op} {name!r}, which is no asset the loader feeds"

    def _asset_variable(self, handle: str) -> str | None:
        """TF2: tf.saved_model.save assigns the asset placeholder to a variable the init
        op reads: accepted when nothing else writes it or hands it on."""
        variable = self.graph.nodes.get(handle)
        if variable is None or variable.op != "VarHandleOp":
            return f"its file name is read from {handle!r}, which is no variable"
        assigned = False
        for consumer_name in self.graph.consumers[handle]:
            consumer = self.graph.nodes[consumer_name]
            data = _data_inputs(consumer)
            if consumer.op in ("ReadVariableOp", "VarIsInitializedOp"):
                continue
            if consumer.op == "AssignVariableOp" and len(data) == 2 and \
                    node_name(data[0]) == handle:
                source = _follow_identity(self.graph.nodes, data[1])
                if source in self.asset_nodes and self._asset_node(source) is None:
                    assigned = True
                    continue
            return (f"its file name is read from variable {handle!r}, which {consumer.op} "
                    f"{consumer_name!r} also uses")
        if not assigned:
            return f"its file name is read from variable {handle!r}, which no asset sets"
        return None

    def _argument(self, fname: str, tensor: str, depth: int = 0) -> str | None:
        """``tensor`` of function ``fname`` is an argument, and every caller passes it an
        asset path (a graph-level call, or a call in a function whose own argument is
        one, :data:`_MAX_CALL_DEPTH` calls deep at most), and the object graph, when it
        binds the argument, binds it to an asset.

        Memoized: k callers per level are k**depth chains.
        """
        return self._remember(("argument", fname, tensor, depth),
                              lambda: self._judge_argument(fname, tensor, depth))

    def _remember(self, key: tuple, judge) -> str | None:
        """``judge()`` once per key, with the asset nodes it read: many reads of one
        variable, or the same argument reached along many call chains, are judged once."""
        if key not in self.memo:
            outer, self.read = self.read, set()
            try:
                self.memo[key] = (judge(), frozenset(self.read))
            finally:
                self.read = outer | self.read
        problem, read = self.memo[key]
        self.read |= read
        return problem

    def _judge_argument(self, fname: str, tensor: str, depth: int) -> str | None:
        function = self.graph.library[fname]
        body = {n.name: n for n in function.node_def}
        args = [a.name for a in function.signature.input_arg]
        name = _follow_identity(body, tensor)
        if name not in args:
            op = body[name].op if name in body else "nothing"
            return f"its file name comes from {op} {name!r} inside the function, not an asset"
        index = args.index(name)
        bound = self.bound.get(fname) if self.object_nodes else None
        if bound is not None:
            # TF2: the Python loader binds captured inputs from the object graph.
            offset = len(args) - len(bound)
            if index < offset or not 0 <= bound[index - offset] < len(self.object_nodes):
                return f"argument {name!r} is no captured asset"
            kind = self.object_nodes[bound[index - offset]].WhichOneof("kind")
            if kind != "asset":
                return f"argument {name!r} is bound to a {kind} of the object graph, not an asset"
        refs = self.graph.refs.get(fname, [])
        if not refs:
            if bound is not None:
                return None
            if self.object_nodes:
                return (f"function {fname} is no saved function of the object graph and no "
                        f"node calls it: nothing binds argument {name!r} to an asset")
            return f"no node calls function {fname}, so nothing passes it an asset"
        # The session loaders (TF Serving, this tool) run the graph's calls, and a
        # function's calls with what its caller passed. A function of no object graph
        # binding is run by nothing else: TF 2.3-2.8's tf.saved_model.save traced each
        # table's initializer as ``lambda: _wrap_initializer(obj)`` (save.py,
        # _trace_resource_initializers) and called it from the init op only, passing
        # the asset variable's read; a TF2 model loaded into a TF1 graph and saved
        # again calls its restored ``_initializer`` from a ``restored_function_body``.
        for ref in refs:
            where = f" in function {ref.function}" if ref.function else ""
            if not ref.call_arg:
                return (f"function {fname} is reached via {ref.how}{where}; only a call "
                        "can pass it an asset path")
            if ref.function is None:
                call = self.graph.nodes[ref.node]
            elif depth + 1 >= _MAX_CALL_DEPTH:
                return (f"function {fname} is called{where}, more than {_MAX_CALL_DEPTH} "
                        "calls below the graph")
            else:
                call = next(n for n in self.graph.library[ref.function].node_def
                            if n.name == ref.node)
            data = _data_inputs(call)
            if index >= len(data):
                return f"{call.name}{where} passes no argument {name!r}"
            problem = self._top_level(data[index]) if ref.function is None else \
                self._argument(ref.function, data[index], depth + 1)
            if problem:
                return f"{call.name}{where} passes argument {name!r}, and {problem}"
        return None


