"""Dependency cycles between operations: G0, G1c and G-single.

The graph (after Adya, as Jepsen's Elle builds it; jepsen-io/elle
``src/elle/core.clj`` and ``jepsen/src/jepsen/tests/kafka.clj`` ``ww-graph``,
``wr-graph``) relates operations that must have committed -- ok ones, and
info ones some of whose sends were read -- named by `ClientOp.id`:

ww
    T1 sent the value at index i of key k, T2 the value at index i + 1
    (the version order of `checker._model.KeyOrder`).
wr
    T2 read a value T1 sent.
rw
    T1's highest read of key k was the value at index i, T2 sent the value at
    i + 1 (Jepsen's docstring: only the *final* read of each key, since a poll
    observes a range).
process
    T1 and T2 are consecutive ok operations of one process.
realtime
    T1 completed (ok) before T2 was invoked. As in Elle's ``realtime-graph``
    we keep only a transitive reduction: an invoke is linked from the ops in a
    buffer of recent completions, and a completion drops from the buffer the
    ops that were linked to it, so the edges number about ops x concurrency.

Strongly connected components come from networkx; in each one we look for one
concrete cycle per class (a breadth-first search for the shortest path that
closes a chosen edge):

G0
    A cycle of ww edges only.
G1c
    A cycle of wr edges with process and realtime edges (Elle's G1c,
    G1c-process, G1c-realtime), without ww edges. Every such cycle is an
    anomaly for a read-committed queue: an op's effects become visible at one
    instant between its invoke and its completion (txnbuf: the coordinator logs
    its decision before answering, and a transaction reads before it decides),
    a wr edge orders the writer's instant before the reader's, a process or
    realtime edge orders completion before invocation, so a cycle orders an
    instant before itself. Cycles that need a ww edge are left out on purpose:
    offsets are assigned as messages reach each partition (txnbuf: when each
    partition writes its commit marker, after the coordinator answered), so a
    ww edge says nothing about commit order, and ww+wr cycles are normal --
    Jepsen's ``allowed-error-types`` allows G1c whenever ww edges are inferred.
G-single
    A cycle with exactly one rw edge, the others any of ww, wr, process,
    realtime. A consumer that did not read the next version yet may simply
    lag, so an rw edge is no proof of order (Jepsen's kafka ``graph`` leaves
    its rw-graph commented out); G-single is reported for information.

Every cycle is reported with its steps explained (which key and value make
each edge) and a ``variant`` (``G1c-realtime`` when a realtime edge closes it,
``-process`` when a process edge does, as Elle names them).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import networkx as nx  # type: ignore[import-untyped, unused-ignore]

from ._model import ClientOp, Model

Edge = tuple[int, int]
Example = dict[str, Any]

# How many rw edges of one component G-single tries, and how many nodes the
# breadth-first searches for one component may visit, before giving up on it.
GSINGLE_TRIES = 64
BFS_BUDGET = 200_000


class Graphs:
    """The edge lists of a model, by relationship."""

    def __init__(self, model: Model) -> None:
        self.model = model
        nodes = model.committed
        self.nodes = nodes
        self.ww: set[Edge] = set()
        self.wr: set[Edge] = set()
        self.rw: set[Edge] = set()
        self.process: list[Edge] = []
        self.realtime: list[Edge] = []

        for key, order in model.orders.items():
            for i in range(len(order.offsets) - 1):
                for v1 in order.values_at[i]:
                    w1 = model.writer_of.get((key, v1))
                    if w1 is None or w1.id not in nodes:
                        continue
                    for v2 in order.values_at[i + 1]:
                        w2 = model.writer_of.get((key, v2))
                        if w2 is not None and w2.id in nodes and w2 is not w1:
                            self.ww.add((w1.id, w2.id))

        for op in model.ops:
            if op.id not in nodes or not op.reads:
                continue
            for key, pairs in op.reads.items():
                if not pairs:
                    continue
                for _, value in pairs:
                    w = model.writer_of.get((key, value))
                    if w is not None and w.id in nodes and w is not op:
                        self.wr.add((w.id, op.id))
                order = model.orders[key]
                top = max(order.rank[offset] for offset, _ in pairs)
                if top + 1 < len(order.offsets):
                    for v2 in order.values_at[top + 1]:
                        w = model.writer_of.get((key, v2))
                        if w is not None and w.id in nodes and w is not op:
                            self.rw.add((op.id, w.id))

        last: dict[object, int] = {}
        for op in model.ops:  # completion order
            if op.type == "ok":
                prev = last.get(op.process)
                if prev is not None:
                    self.process.append((prev, op.id))
                last[op.process] = op.id

        self.realtime = list(_realtime_edges(model))


def _realtime_edges(model: Model) -> Iterator[Edge]:
    """Elle's realtime-graph reduction (see the module docstring)."""
    by_invoke = {op.invoke_index: op for op in model.ops}
    by_complete = {op.complete_index: op for op in model.ops if op.complete_index is not None}
    frontier: set[int] = set()
    linked: dict[int, list[int]] = {}  # invoke index -> frontier at that invoke
    for line in model.history.ops:
        if line.type == "invoke":
            op = by_invoke.get(line.index)
            if op is None:
                continue
            preds = list(frontier)
            if op.id in model.committed:
                for p in preds:
                    yield (p, op.id)
            if op.complete_index is not None:
                linked[op.invoke_index] = preds
        else:
            op = by_complete.get(line.index)
            if op is None:
                continue
            preds = linked.pop(op.invoke_index, [])
            if op.type == "ok":
                frontier.difference_update(preds)
                frontier.add(op.id)


# -- explanations -------------------------------------------------------------


class Explainer:
    """Why ``b`` depends on ``a``, recomputed from the model (so edges carry no data)."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def ww(self, a: ClientOp, b: ClientOp) -> Example | None:
        for key, value, _ in a.sends:
            order = self.model.orders.get(key)
            if order is None or value not in order.first_index:
                continue
            # Every index the value is at (more than one for a duplicate).
            for i in range(order.first_index[value], order.last_index[value] + 1):
                if value not in order.values_at[i] or i + 1 >= len(order.offsets):
                    continue
                for v2 in order.values_at[i + 1]:
                    if self.model.writer_of.get((key, v2)) is b:
                        return {"type": "ww", "key": key, "value": value, "next_value": v2}
        return None

    def wr(self, a: ClientOp, b: ClientOp) -> Example | None:
        for key, pairs in b.reads.items():
            for _, value in pairs:
                if self.model.writer_of.get((key, value)) is a:
                    return {"type": "wr", "key": key, "value": value}
        return None

    def rw(self, a: ClientOp, b: ClientOp) -> Example | None:
        for key, pairs in a.reads.items():
            if not pairs:
                continue
            order = self.model.orders[key]
            top = max(order.rank[offset] for offset, _ in pairs)
            if top + 1 < len(order.offsets):
                for v2 in order.values_at[top + 1]:
                    if self.model.writer_of.get((key, v2)) is b:
                        read = next(v for o, v in pairs if order.rank[o] == top)
                        return {"type": "rw", "key": key, "value": read, "next_value": v2}
        return None

    def process(self, a: ClientOp, b: ClientOp) -> Example | None:
        if (
            a.process == b.process
            and a.complete_index is not None
            and a.complete_index < b.invoke_index
        ):
            return {"type": "process", "process": a.process}
        return None

    def realtime(self, a: ClientOp, b: ClientOp) -> Example | None:
        if a.complete_index is not None and a.complete_index < b.invoke_index:
            return {"type": "realtime", "completed": a.complete_index, "invoked": b.invoke_index}
        return None

    def step(self, a: int, b: int, kinds: Iterable[str]) -> Example:
        op_a, op_b = self.model.by_id[a], self.model.by_id[b]
        for kind in kinds:
            why: Example | None = getattr(self, kind)(op_a, op_b)
            if why is not None:
                return {"from": a, "to": b, **why}
        return {"from": a, "to": b, "type": "unexplained"}  # a bug here; keep the report


def _variant(name: str, steps: list[Example]) -> str:
    types = {s["type"] for s in steps}
    if "realtime" in types:
        return name + "-realtime"
    if "process" in types:
        return name + "-process"
    return name


# -- search -------------------------------------------------------------------


def _bfs_path(
    succ: Any,
    start: int,
    goal: int,
    inside: set[int] | frozenset[int],
    skip: Callable[[int, int], bool] | None = None,
    budget: int = BFS_BUDGET,
) -> list[int] | None:
    """Shortest path start ->* goal within ``inside``, skipping edges ``skip`` says to."""
    if start == goal:
        return [start]
    parent: dict[int, int] = {start: start}
    queue = deque([start])
    while queue and len(parent) <= budget:
        u = queue.popleft()
        for v in succ[u]:
            if v in parent or v not in inside or (skip is not None and skip(u, v)):
                continue
            parent[v] = u
            if v == goal:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                path.reverse()
                return path
            queue.append(v)
    return None


def _components(graph: Any) -> list[set[int]]:
    return [c for c in nx.strongly_connected_components(graph) if len(c) > 1]


def _cycle_through(graph: Any, edge: Edge, comp: set[int]) -> list[int] | None:
    """Nodes of the shortest cycle closing ``edge`` (first node not repeated)."""
    a, b = edge
    back = _bfs_path(graph.succ, b, a, comp)
    return None if back is None else [a, *back[:-1]]


def _steps(explainer: Explainer, cycle: list[int], kinds: list[list[str]]) -> list[Example]:
    return [
        explainer.step(cycle[i], cycle[(i + 1) % len(cycle)], kinds[i]) for i in range(len(cycle))
    ]


def find_cycles(model: Model) -> dict[str, list[Example]]:
    """Examples of G0, G1c and G-single: at most one per strongly connected component."""
    graphs = Graphs(model)
    explainer = Explainer(model)
    found: dict[str, list[Example]] = {"G0": [], "G1c": [], "G-single": []}

    # G0: ww edges only.
    ww_graph: Any = nx.DiGraph()
    ww_graph.add_edges_from(graphs.ww)
    for comp in _components(ww_graph):
        a = next(iter(comp))
        b = next(v for v in ww_graph.succ[a] if v in comp)
        cycle = _cycle_through(ww_graph, (a, b), comp)
        assert cycle is not None
        steps = _steps(explainer, cycle, [["ww"]] * len(cycle))
        found["G0"].append(_example("G0", cycle, steps))
    del ww_graph

    # G1c: wr + process + realtime. Process and realtime edges both go from a
    # completion to a later invoke, so every cycle here holds a wr edge.
    graph: Any = nx.DiGraph()
    graph.add_edges_from(graphs.wr)
    graph.add_edges_from(graphs.process)
    graph.add_edges_from(graphs.realtime)
    for comp in _components(graph):
        best: list[int] | None = None
        for edge in _edges_within(graph, graphs.wr, comp, limit=8 if len(comp) < 1000 else 1):
            cycle = _cycle_through(graph, edge, comp)
            if cycle is not None and (best is None or len(cycle) < len(best)):
                best = cycle
        assert best is not None
        steps = _steps(explainer, best, [["wr", "process", "realtime"]] * len(best))
        found["G1c"].append(_example("G1c", best, steps))

    # G-single: add ww (giving the non-rw graph), then the edges that are rw only.
    graph.add_edges_from(graphs.ww)
    rw_only = {e for e in graphs.rw if not graph.has_edge(*e)}
    if rw_only:
        graph.add_edges_from(rw_only)

        def skip(u: int, v: int) -> bool:
            return (u, v) in rw_only

        comp_of: dict[int, int] = {}
        comps = _components(graph)
        for i, comp in enumerate(comps):
            for node in comp:
                comp_of[node] = i
        by_comp: dict[int, list[Edge]] = {}
        for a, b in sorted(rw_only):
            i = comp_of.get(a, -1)
            if i >= 0 and comp_of.get(b) == i:
                by_comp.setdefault(i, []).append((a, b))
        for i, candidates in sorted(by_comp.items()):
            comp = comps[i]
            # Try first the rw edges whose writer completed (ok) shortly before the
            # reader was invoked: a realtime path closes those, and a short one.
            candidates.sort(key=lambda e: _closeness(model, e))
            budget = BFS_BUDGET
            for a, b in candidates[:GSINGLE_TRIES]:
                if budget <= 0:
                    break
                back = _bfs_path(graph.succ, b, a, comp, skip, budget)
                budget -= BFS_BUDGET if back is None else len(back)
                if back is None:
                    continue
                cycle = [a, *back[:-1]]
                kinds = [["rw"]] + [["ww", "wr", "process", "realtime"]] * (len(cycle) - 1)
                steps = _steps(explainer, cycle, kinds)
                found["G-single"].append(_example("G-single", cycle, steps))
                break
    return found


def _closeness(model: Model, edge: Edge) -> tuple[int, int]:
    reader, writer = model.by_id[edge[0]], model.by_id[edge[1]]
    done = writer.complete_index
    if writer.type == "ok" and done is not None and done < reader.invoke_index:
        return (0, reader.invoke_index - done)
    return (1, 0)


def _edges_within(graph: Any, edges: set[Edge], comp: set[int], limit: int) -> list[Edge]:
    """Up to ``limit`` edges of ``edges`` with both ends in ``comp``."""
    out = []
    for a in comp:
        for b in graph.succ[a]:
            if b in comp and (a, b) in edges:
                out.append((a, b))
                if len(out) >= limit:
                    return out
    return out


def _example(name: str, cycle: list[int], steps: list[Example]) -> Example:
    return {"cycle": cycle, "variant": _variant(name, steps), "steps": steps}
