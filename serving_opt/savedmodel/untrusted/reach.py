"""The static check's index of a graph: its nodes, its function library, who
references which function (and with which attr bindings), and walks over it.

Shared by the parts of :mod:`serving_opt.savedmodel.untrusted`: the saver's and the
assets' exceptions, and what one node does.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from serving_opt.savedmodel.graph import CALL_OPS, node_name

# How many nodes deep a file name is followed through the ops that build it.
_MAX_NAME_DEPTH = 16


@dataclass(frozen=True)
class _Ref:
    """A reference to a library function: from ``node`` (in ``function``, None at the
    top level), described by ``how``; ``call_arg`` when it is the ``f`` of a call op
    (so the call's inputs are the function's arguments)."""

    function: str | None
    node: str
    how: str
    call_arg: bool
    # The attrs the reference binds the function's attr placeholders with (the
    # NameAttrList's attr map, or a call-as-op node's attrs); None when it binds none
    # (a library.gradient entry).
    binds: object = field(default=None, compare=False)


@dataclass(frozen=True)
class _Root:
    """Something a loader or a request runs: a signature's outputs, the init op, the
    saver's restore op or its save tensor, the functions the MetaGraph names outside
    its graph (the object graph's) or registers as gradients."""

    key: str  # signature key, INIT_OP, "restore", "save", "named" or "gradient"
    kind: str  # "signature", "init", "restore", "save", "named", "gradient"
    desc: str
    start_desc: str
    starts: tuple[str, ...]  # nodes
    functions: tuple[str, ...] = ()  # library functions it runs by name


def _data_inputs(node) -> list[str]:
    return [i for i in node.input if not i.startswith("^")]


def _attr(node, name: str):
    """``node.attr[name]`` without adding it: indexing a proto map inserts the key, and
    the check must leave the MetaGraph exactly as it found it (inspect measures it)."""
    from tensorflow.core.framework import attr_value_pb2

    return node.attr[name] if name in node.attr else attr_value_pb2.AttrValue()


class _Graph:
    """The top-level nodes, the library, who references which function, and walks."""

    def __init__(self, graph_def, embedded_cache: dict | None = None) -> None:
        self.nodes = {n.name: n for n in graph_def.node}
        # _embedded's findings per (graph bytes, depth), shared with the graphs embedded
        # in this one: many ops naming one constant, a few deep, parse it once.
        self.embedded_cache: dict = {} if embedded_cache is None else embedded_cache
        self.library = {f.signature.name: f for f in graph_def.library.function}
        self.gradients = {g.function_name: g.gradient_func for g in graph_def.library.gradient}
        self.gradient_of = {g.gradient_func: g.function_name
                            for g in graph_def.library.gradient}
        self.refs: dict[str, list[_Ref]] = collections.defaultdict(list)
        # _bindings' memo and step count (work done resolving attr placeholders).
        self.binding_memo: dict[tuple[str, str, int], list[tuple[object, str]]] = {}
        self.binding_work = 0
        self.top_calls: dict[str, list[tuple[str, str]]] = {}
        self.function_calls: dict[str, list[tuple[str, str]]] = {}
        for node in graph_def.node:
            calls = self._function_refs(node)
            self.top_calls[node.name] = [(f, how) for f, how, *_ in calls]
            self.refs_from(None, node, calls)
        for function in graph_def.library.function:
            found = []
            for node in function.node_def:
                calls = self._function_refs(node)
                found += [(f, f"{how} in function {function.signature.name}")
                          for f, how, *_ in calls]
                self.refs_from(function.signature.name, node, calls)
            self.function_calls[function.signature.name] = found
        # What else runs a function, found by its name rather than a call: a string attr
        # naming it (a node's, or a FunctionDef attr such as backward_function_name), its
        # library.gradient, and the functions sharing its api_implements, which
        # Grappler's implementation selector swaps in for it (Keras' LSTM/GRU carry a
        # CPU and a cuDNN body, one of them called by nothing).
        self.links: dict[tuple[str, str], list[tuple[tuple[str, str], str]]] = \
            collections.defaultdict(list)
        for node in graph_def.node:
            named = self._named(node.attr, f"{node.op} {node.name}")
            if named:  # most nodes name none: no empty list per node
                self.links[("node", node.name)] += named
        for function in graph_def.library.function:
            fname = function.signature.name
            place = ("function", fname)
            self.links[place] += self._named(function.attr, f"function {fname}", funcs=True)
            for node in function.node_def:
                self.links[place] += self._named(
                    node.attr, f"{node.op} {node.name} in function {fname}")
            if fname in self.gradients:
                self.links[place].append((("function", self.gradients[fname]),
                                          f"library.gradient of {fname}"))
            implements = _attr(function, "api_implements").s
            if implements:
                group = ("implements", implements.decode("utf-8", "replace"))
                self.links[place].append((group, f"api_implements of {fname}"))
                self.links[group].append((place, f"api_implements {group[1]!r} shared with "
                                                 "a function that runs (Grappler's "
                                                 "implementation selector may swap it in)"))
        self.consumers: dict[str, list[str]] = collections.defaultdict(list)
        for node in graph_def.node:
            for i in node.input:
                self.consumers[node_name(i)].append(node.name)

    def _named(self, attrs, owner: str,
               funcs: bool = False) -> list[tuple[tuple[str, str], str]]:
        """(function place, how) for every string of ``attrs`` (at any depth of func
        attrs' own attrs) that is the name of a library function, and with ``funcs``
        every function-valued attr (a FunctionDef's own attrs: a node's are calls): no op
        of TF's is known to run a function named by a string, but a name is cheap doubt."""
        out = []
        pending = [(key, value) for key, value in attrs.items()]
        while pending:
            key, value = pending.pop()
            named = [text.decode("utf-8", "replace") for text in (value.s, *value.list.s)]
            for func in (*([value.func] if value.HasField("func") else []), *value.list.func):
                pending += [(f"{key}.{k}", v) for k, v in func.attr.items()]
                named += [func.name] if funcs else []
            out += [(("function", name), f"attr {key} of {owner}")
                    for name in named if name in self.library]
        return out

    def refs_from(self, function: str | None, node, calls) -> None:
        for fname, how, call_arg, binds in calls:
            self.refs[fname].append(_Ref(function, node.name, how, call_arg, binds))

    def _function_refs(self, node) -> list[tuple[str, str, bool, object]]:
        """(function, how, is the f of a call op, the attrs it binds) for every
        function ``node`` may run: func attrs and func lists at any depth (a func's own
        attrs can hold funcs), its op type when that is a library function, and for a
        SymbolicGradient the gradient function ``library.gradient`` registers for its
        ``f``."""
        out: list[tuple[str, str, bool, object]] = []

        def visit(attr: str, name_attr_list) -> None:
            name = name_attr_list.name
            if name in self.library:
                if attr == "f" and node.op in CALL_OPS:
                    out.append((name, f"a call by {node.op} {node.name}", True,
                                name_attr_list.attr))
                else:
                    out.append((name, f"{attr} of {node.op} {node.name}", False,
                                name_attr_list.attr))
            if node.op == "SymbolicGradient" and attr == "f" and name in self.gradients:
                out.append((self.gradients[name],
                            f"library.gradient of SymbolicGradient {node.name}", False,
                            None))
            for key, value in name_attr_list.attr.items():
                from_value(f"{attr}.{key}", value)

        def from_value(attr: str, value) -> None:
            if value.HasField("func"):
                visit(attr, value.func)
            for func in value.list.func:
                visit(attr, func)

        for key, value in node.attr.items():
            from_value(key, value)
        if node.op in self.library:
            out.append((node.op, f"a call as an op by {node.name}", False, node.attr))
        return out

    def successors(self, place: tuple[str, str]) -> Iterable[tuple[tuple[str, str], str]]:
        """(place, how) for what running ``place`` runs too: a node's inputs (data and
        control, followed backwards) and the functions it references; a function's
        references (a function counts whole: the runtime runs every stateful op of a
        body), and what :attr:`links` names. A place is ``("node", name)`` at the top
        level, ``("function", name)``, or ``("implements", api)`` (the functions sharing
        an api_implements)."""
        kind, name = place
        calls: Iterable[tuple[str, str]] = ()
        if kind == "node":
            for i in self.nodes[name].input:
                if node_name(i) in self.nodes:
                    yield ("node", node_name(i)), "control input" if i.startswith("^") else "input"
            calls = self.top_calls[name]
        elif kind == "function":
            calls = self.function_calls.get(name, ())  # a gradient no library holds
        for fname, how in calls:
            yield ("function", fname), how
        yield from self.links.get(place, ())

    def _places(self, starts: Iterable[str],
                functions: Iterable[str] = ()) -> list[tuple[str, str]]:
        return [*(("node", n) for n in starts if n in self.nodes),
                *(("function", f) for f in functions if f in self.library)]

    def walk(self, starts: Iterable[str],
             functions: Iterable[str] = ()) -> dict[tuple[str, str], tuple]:
        """Everything a run of ``starts`` (nodes) and ``functions`` may execute: place
        -> (parent place, how). Breadth first, so the recorded route is a shortest one."""
        parents: dict[tuple[str, str], tuple] = {}
        queue: collections.deque = collections.deque()
        for place in self._places(starts, functions):
            if place not in parents:
                parents[place] = (None, "")
                queue.append(place)
        while queue:
            place = queue.popleft()
            for target, how in self.successors(place):
                if target not in parents:
                    parents[target] = (place, how)
                    queue.append(target)
        return parents

    def reach(self, starts: Sequence[Iterable[str]],
              functions: Sequence[Iterable[str]] = ()) -> dict[tuple[str, str], int]:
        """place -> the bit mask of the start sets (by index: nodes ``starts[i]`` and
        functions ``functions[i]``) whose run may execute it: what ``walk`` of each would
        give, in time and memory linear in the graph (a walk per signature is signatures
        x nodes: 1,000 of each in a 48 KB model held 500 MB). Places that run each other
        (a loop, a recursion) share one mask."""
        mask: dict[tuple[str, str], int] = collections.defaultdict(int)
        for bit, names in enumerate(starts):
            extra = functions[bit] if bit < len(functions) else ()
            for place in self._places(names, extra):
                mask[place] |= 1 << bit
        components = self._components(list(mask))
        component_of = {place: i for i, scc in enumerate(components) for place in scc}
        for i in reversed(range(len(components))):  # callers before what they run
            scc = components[i]
            bits = 0
            for place in scc:
                bits |= mask[place]
            for place in scc:
                mask[place] = bits
                for target, _ in self.successors(place):
                    if component_of[target] != i:
                        mask[target] |= bits
        return dict(mask)

    def _components(self, roots: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
        """The strongly connected places reachable from ``roots`` (Tarjan's, without
        recursion: a chain of 100,000 nodes is a valid graph), each after every
        component it runs."""
        index: dict[tuple[str, str], int] = {}
        low: dict[tuple[str, str], int] = {}
        stack: list[tuple[str, str]] = []
        on_stack: set[tuple[str, str]] = set()
        components: list[list[tuple[str, str]]] = []
        for root in roots:
            if root in index:
                continue
            index[root] = low[root] = len(index)
            stack.append(root)
            on_stack.add(root)
            work = [(root, iter(self.successors(root)))]
            while work:
                place, targets = work[-1]
                for target, _ in targets:
                    if target not in index:
                        index[target] = low[target] = len(index)
                        stack.append(target)
                        on_stack.add(target)
                        work.append((target, iter(self.successors(target))))
                        break
                    if target in on_stack:
                        low[place] = min(low[place], index[target])
                else:
                    work.pop()
                    if work:
                        caller = work[-1][0]
                        low[caller] = min(low[caller], low[place])
                    if low[place] == index[place]:
                        scc = []
                        while True:
                            member = stack.pop()
                            on_stack.discard(member)
                            scc.append(member)
                            if member == place:
                                break
                        components.append(scc)
        return components

    def all_nodes(self) -> Iterable[tuple[str | None, object]]:
        for node in self.nodes.values():
            yield None, node
        for name, function in self.library.items():
            for node in function.node_def:
                yield name, node



def _follow_identity(body: dict, tensor: str) -> str:
    """The node ``tensor`` comes from, through ``Identity`` only."""
    name = node_name(tensor)
    for _ in range(_MAX_NAME_DEPTH):
        node = body.get(name)
        if node is None or node.op != "Identity" or len(_data_inputs(node)) != 1:
            break
        name = node_name(_data_inputs(node)[0])
    return name
