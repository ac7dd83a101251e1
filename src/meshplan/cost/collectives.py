"""Collective communication time per tier, following nccl-tests' conventions.

A collective over a group of ``n`` GPUs moving a buffer of ``S`` bytes (nccl-tests' "size": the
all-reduce buffer, the all-gather output, the reduce-scatter input, the all-to-all send buffer)
takes ``t = steps·α + wire_bytes / B_eff`` on each tier it crosses, where ``α`` is the tier's
per-step latency and ``B_eff = B·η`` its per-GPU, per-direction bandwidth times the calibrated
efficiency. Reported like nccl-tests: ``algbw = S / t`` and ``busbw = algbw × factor`` with factor
``2(n−1)/n`` for all-reduce, ``(n−1)/n`` for all-gather, reduce-scatter and all-to-all, 1 otherwise.

Ring (Patarasuk & Yuan 2009): all-reduce sends ``2(n−1)/n·S`` per GPU in ``2(n−1)`` steps;
all-gather and reduce-scatter ``(n−1)/n·S`` in ``n−1`` steps.
Tree (NCCL's double binary tree): all-reduce in ``2⌈log₂ n⌉`` latency steps, each GPU sending
about ``2·S``; faster than the ring only for small buffers.
Every all-reduce, all-gather, reduce-scatter, broadcast and reduce also pays a fixed ``α₀`` per
call (NCCL's ``baseLat``; ``Calibration.collective_base_latency``): ``t = α₀ + steps·α + …``.

A group that spans scale-up domains (``k`` members per domain, ``g = n/k`` domains) runs
hierarchically, as NCCL does with one NIC per GPU ("rail"): all-reduce = intra-domain
reduce-scatter of S + inter-domain all-reduce of S/k over each GPU's own NIC + intra-domain
all-gather of S. Its bandwidth terms are those three phases'; its latency is NCCL's flat ring's
(``src/graph/tuning.cc``, ``ncclTopoTuneModel``): a ring through all ``n`` members crosses the
``g`` domains once each, so of its ``n − 1`` steps per pass ``g − 1`` cross the fabric (``α_out``)
and ``n − g`` stay inside a domain (``α``): ``t_lat = α₀ + r·((n − g)·α + (g − 1)·α_out)`` with
``r = 2`` passes for all-reduce, 1 for all-gather and reduce-scatter. The latency of a ring thus
grows with the GPU count, not the domain count: for all-gathers over a thousand GPUs it is
milliseconds. A tree all-reduce keeps ``2((k − 1)·α + ⌈log₂ g⌉·α_out)``. A group that spans ``P`` pods of a fabric oversubscribed ``o``:1 above the pods
gets ``min(1, g/(o·P))`` of the NIC bandwidth across pods: each of the ``g``-member rings leaves a
pod once, and the pod's uplinks (1/o of its NIC capacity) are shared by the rings crossing them.

Which GPUs form a group follows the rank order (innermost axis first, Megatron's default
tp, cp, dp, pp): axis ``x``'s groups are strided by the product of the sizes of the axes inside it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from meshplan.cost.calibration import Calibration
from meshplan.specs.hardware import ClusterSpec

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv")


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor for ``op`` over ``n`` ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class GroupPlacement:
    """Where the members of one group of an axis (or set of axes) sit."""

    size: int  # n
    per_node: int  # k: members inside one scale-up domain
    nodes: int  # g = n / k scale-up domains spanned
    pods: int  # pods spanned (1 without pods)

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def placement(
    cluster: ClusterSpec,
    sizes: dict[str, int],
    rank_order: tuple[str, ...],
    axes: tuple[str, ...],
    every: int | dict[str, int] = 1,
    span: dict[str, int] | None = None,
) -> GroupPlacement:
    """Placement of the group spanned by ``axes`` that contains rank 0 (all groups of an axis set
    are alike under the rank order). ``sizes`` maps every axis of ``rank_order`` to its size.
    ``every`` > 1 takes every ``every``-th index along the (single) axis: the replica groups of
    HSDP, whose members sit ``dp_shard`` apart on the dp axis; a mapping gives the stride per axis
    (the expert data-parallel groups: every ep-th dp index, all cp indices). ``span`` limits an axis to its first
    indices: HSDP's shard groups cover ``dp_shard`` consecutive dp indices.

    Only the scale-up domain and pod sizes of ``cluster`` matter; the result is kept per mesh
    (:func:`_placement`), so repeated plans of one mesh shape do not rebuild the group."""
    steps = tuple(sorted(every.items())) if isinstance(every, dict) else every
    return _placement(cluster.gpus_per_node, cluster.pod_size, tuple(sizes[a] for a in rank_order), tuple(rank_order),
                      tuple(axes), steps, tuple(sorted((span or {}).items())))


@lru_cache(maxsize=4096)
def _placement(node_size: int, pod_size: int | None, sizes: tuple[int, ...], rank_order: tuple[str, ...],
               axes: tuple[str, ...], every: int | tuple[tuple[str, int], ...], span: tuple[tuple[str, int], ...]) -> GroupPlacement:
    """:func:`placement` on hashable arguments (``sizes`` in rank order; ``every`` and ``span`` as
    sorted pairs)."""
    steps, limits = (dict(every) if isinstance(every, tuple) else None), dict(span)
    members = np.zeros(1, dtype=np.int64)
    stride = 1
    for a, size in zip(rank_order, sizes):
        if a in axes and size > 1:
            step = steps.get(a, 1) if steps is not None else every
            idx = np.arange(0, limits.get(a, size), step, dtype=np.int64)
            members = (members[:, None] + stride * idx[None, :]).ravel()
        stride *= size
    n = int(members.size)
    if n == 1:
        return GroupPlacement(1, 1, 1, 1)
    # members per scale-up domain: uniform when the inner axes' sizes divide the domain size;
    # otherwise (e.g. tp = 3 on 8-GPU nodes) a group straddles domains unevenly: count every
    # domain it touches and take the fullest one as k (the slowest intra-domain piece)
    _, counts = np.unique(members // node_size, return_counts=True)
    nodes = int(counts.size)
    per_node = int(counts.max())
    pods = 1
    if pod_size:
        pods = int(np.unique(members // pod_size).size)
    return GroupPlacement(n, per_node, nodes, pods)


@dataclass(frozen=True)
class CollectiveCost:
    op: str
    nbytes: float
    n: int
    algorithm: str
    time: float
    latency_time: float

    @property
    def algbw(self) -> float:
        return self.nbytes / self.time if self.time > 0 else math.inf

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.op, self.n)


def _single(op: str, S: float, n: int, alpha: float, bw: float, algorithm: str) -> tuple[float, float]:
    """(latency part, bandwidth part) of ``op`` on one tier."""
    if n <= 1 or S <= 0:
        return 0.0, 0.0
    if op == "all_reduce":
        if algorithm == "tree":
            return 2 * math.ceil(math.log2(n)) * alpha, 2 * S / bw
        return 2 * (n - 1) * alpha, 2 * (n - 1) / n * S / bw
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) * alpha, (n - 1) / n * S / bw
    if op in ("broadcast", "reduce"):
        if algorithm == "tree":
            return math.ceil(math.log2(n)) * alpha, S / bw
        return (n - 1) * alpha, S / bw
    if op == "send_recv":
        return alpha, S / bw
    raise ValueError(f"unknown collective {op}")


def collective_cost(
    op: str,
    nbytes: float,
    pl: GroupPlacement,
    cluster: ClusterSpec,
    cal: Calibration,
    algorithm: str = "auto",
) -> CollectiveCost:
    """Time of one collective (see the module docstring for the model)."""
    if algorithm == "auto":
        if op in ("all_reduce", "broadcast", "reduce"):
            ring = collective_cost(op, nbytes, pl, cluster, cal, "ring")
            tree = collective_cost(op, nbytes, pl, cluster, cal, "tree")
            return ring if ring.time <= tree.time else tree
        algorithm = "ring"
    S = float(nbytes)
    lat, bw = _latency_bandwidth(op, S, pl, cluster, cal, algorithm)
    return CollectiveCost(op, S, pl.size, algorithm, lat + bw, lat)


def _latency_bandwidth(op: str, S: float, pl: GroupPlacement, cluster: ClusterSpec, cal: Calibration,
                       algorithm: str) -> tuple[float, float]:
    """(latency part, bandwidth part) of ``op`` on ``S`` bytes over the group ``pl`` with
    ``algorithm`` (ring or tree), across the tiers it spans (module docstring)."""
    n, k, g = pl.size, pl.per_node, pl.nodes
    up_a, up_bw = cluster.scale_up.latency, cluster.scale_up.bandwidth * cal.scale_up_efficiency
    out_a = cluster.scale_out.latency
    out_bw = cluster.scale_out.bandwidth * cal.scale_out_efficiency
    if pl.pods > 1:
        out_bw *= min(1.0, g / (cluster.oversubscription * pl.pods))
    flat = _flat_ring_repeats(op, g, algorithm)
    if op == "send_recv":
        lat, bw = _single(op, S, 2, out_a if g > 1 else up_a, out_bw if g > 1 else up_bw, algorithm)
    elif g == 1:
        lat, bw = _single(op, S, n, up_a, up_bw, algorithm)
    elif k == 1:
        lat, bw = _single(op, S, n, out_a, out_bw, algorithm)
    elif op == "all_reduce":
        l1, b1 = _single("reduce_scatter", S, k, up_a, up_bw, "ring")
        l2, b2 = _single("all_reduce", S / k, g, out_a, out_bw, algorithm)
        lat, bw = 2 * flat * l1 + l2, 2 * b1 + b2
    elif op in ("all_gather", "reduce_scatter"):
        l1, b1 = _single(op, S, k, up_a, up_bw, "ring")
        l2, b2 = _single(op, S / k, g, out_a, out_bw, "ring")
        lat, bw = flat * l1 + l2, b1 + b2
    elif op == "all_to_all":
        # intra- and inter-domain parts run concurrently over different links
        lat = (n - 1) * max(up_a, out_a)
        bw = max((k - 1) / n * S / up_bw, (n - k) / n * S / out_bw)
    else:  # broadcast / reduce: across domains, then inside them
        l1, b1 = _single(op, S, g, out_a, out_bw, algorithm)
        l2, b2 = _single(op, S, k, up_a, up_bw, algorithm)
        lat, bw = l1 + l2, b1 + b2
    return lat + base_latency(op, n, S, cal), bw


#: The collectives NCCL launches as one call with its base latency (send/recv and all-to-all are
#: grouped point-to-point calls, priced per step only).
LAUNCHED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def base_latency(op: str, n: int, nbytes: float, cal: Calibration) -> float:
    """``α₀``, the fixed cost of one call of ``op`` (NCCL's ``baseLat``, module docstring); 0
    for a group of one, an empty buffer, or a point-to-point operation."""
    return cal.collective_base_latency if op in LAUNCHED and n > 1 and nbytes > 0 else 0.0


def _flat_ring_repeats(op: str, g: int, algorithm: str) -> int:
    """How many times a flat ring's in-domain steps exceed one domain's ring: ``g`` (its
    ``n − g = g·(k − 1)`` steps inside domains, module docstring) for the ring all-reduce,
    all-gather and reduce-scatter; 1 for the tree and the other operations."""
    return g if algorithm == "ring" and op in ("all_reduce", "all_gather", "reduce_scatter") else 1


def collective_time(op: str, nbytes: float, pl: GroupPlacement, cluster: ClusterSpec, cal: Calibration) -> float:
    """Seconds for one collective with NCCL's faster algorithm (ring or tree): the time of
    ``collective_cost(op, nbytes, pl, cluster, cal)``, without building it (the search evaluates
    thousands)."""
    if pl.size <= 1 or nbytes <= 0:
        return 0.0
    S = float(nbytes)
    lat, bw = _latency_bandwidth(op, S, pl, cluster, cal, "ring")
    ring = lat + bw
    if op in ("all_reduce", "broadcast", "reduce"):
        lat, bw = _latency_bandwidth(op, S, pl, cluster, cal, "tree")
        return ring if ring <= lat + bw else lat + bw
    return ring


def wire(op: str, nbytes: float, n: int, algorithm: str = "ring") -> tuple[int, float]:
    """(latency steps, bytes each GPU sends) of ``op`` over ``n`` ranks on one tier: the two terms
    of the single-tier model above read with α = 1 and B = 1 (ring all-reduce: 2(n−1) steps and
    2(n−1)/n·S bytes; all-gather, reduce-scatter, all-to-all: n−1 steps, (n−1)/n·S; tree all-reduce
    2⌈log₂ n⌉ steps, about 2·S; broadcast/reduce n−1 ring or ⌈log₂ n⌉ tree steps, S; send/recv 1, S)."""
    steps, sent = _single(op, float(nbytes), max(n, 2) if op == "send_recv" else n, 1.0, 1.0, algorithm)
    return int(round(steps)), sent


@dataclass(frozen=True)
class Phase:
    """One piece of a (possibly hierarchical) collective, costed on one tier by ``collective_cost``."""

    name: str  # e.g. "intra-domain reduce-scatter"
    tier: str  # "scale-up" or "scale-out"
    cost: CollectiveCost
    steps: int
    sent: float  # bytes each GPU of the phase sends


def collective_phases(
    op: str,
    nbytes: float,
    pl: GroupPlacement,
    cluster: ClusterSpec,
    cal: Calibration,
    algorithm: str = "auto",
) -> tuple[Phase, ...]:
    """The phases whose times ``collective_cost`` adds up (module docstring), each costed by
    ``collective_cost`` itself on a one-tier group: a group inside one scale-up domain (or one
    GPU per domain) is one phase; a hierarchical all-reduce is intra-domain reduce-scatter of S,
    inter-domain all-reduce of S/k and intra-domain all-gather of S; an all-gather is inter-domain
    all-gather of S/k then intra-domain all-gather of S (a reduce-scatter the reverse);
    broadcast/reduce cross domains then run inside them. A hierarchical all-to-all runs its intra-
    and inter-domain parts concurrently, so it stays one phase. The phase times add up to
    ``collective_cost(...).time`` (tests check it)."""
    if algorithm == "auto":
        algorithm = collective_cost(op, nbytes, pl, cluster, cal, "auto").algorithm
    k, g = pl.per_node, pl.nodes
    S = float(nbytes)
    out_tier = "scale-out" if g > 1 else "scale-up"
    if op == "send_recv" or op == "all_to_all" or g == 1 or k == 1:
        parts = [(op.replace("_", "-"), out_tier, op, S, pl, algorithm)]
    else:
        intra, inter = GroupPlacement(k, k, 1, 1), GroupPlacement(g, 1, g, pl.pods)
        rs = ("intra-domain reduce-scatter", "scale-up", "reduce_scatter", S, intra, "ring")
        ag = ("intra-domain all-gather", "scale-up", "all_gather", S, intra, "ring")
        cross = (f"inter-domain {op.replace('_', '-')}", "scale-out", op, S / k, inter, algorithm)
        if op == "all_reduce":
            parts = [rs, cross, ag]
        elif op == "all_gather":
            parts = [cross, ag]
        elif op == "reduce_scatter":
            parts = [rs, cross]
        else:  # broadcast / reduce: the whole buffer crosses domains, then moves inside them
            parts = [
                (f"inter-domain {op}", "scale-out", op, S, inter, algorithm),
                (f"intra-domain {op}", "scale-up", op, S, intra, algorithm),
            ]
    repeats = _flat_ring_repeats(op, g, algorithm) if k > 1 else 1
    phases = []
    for name, tier, o, size, group, alg in parts:
        steps, sent = wire(o, size, group.size, alg)
        cost = collective_cost(o, size, group, cluster, cal, alg)
        if len(parts) > 1 and tier == "scale-up":
            # one call for the whole collective: its base latency sits in the inter-domain phase;
            # the flat ring repeats the in-domain steps in every domain (module docstring)
            steps_lat = cost.latency_time - base_latency(o, group.size, size, cal)
            cost = dataclasses.replace(cost, time=cost.time - cost.latency_time + repeats * steps_lat,
                                       latency_time=repeats * steps_lat)
            steps *= repeats
        phases.append(Phase(name, tier, cost, steps, sent))
    return tuple(phases)
