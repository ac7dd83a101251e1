"""``calc collective``: the cost of one collective, its ring-vs-tree crossover, and a step-by-step
ring all-reduce on real numpy arrays.

Every time comes from :mod:`meshplan.cost.collectives` (the model ``meshplan estimate`` uses):
for ``S`` bytes over ``n`` GPUs on one tier of per-GPU, per-direction bandwidth ``B`` (times an
efficiency η) and per-step latency ``α``,

* ring all-reduce: ``t = 2(n−1)·α + 2(n−1)/n · S/(η·B)``, each GPU sending ``2(n−1)/n·S``
  (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations");
* all-gather / reduce-scatter / all-to-all: ``(n−1)·α + (n−1)/n · S/(η·B)``;
* tree all-reduce (NCCL's double binary tree): ``2⌈log₂ n⌉·α + 2·S/(η·B)``;
* broadcast/reduce: ``(n−1)·α`` (ring) or ``⌈log₂ n⌉·α`` (tree) ``+ S/(η·B)``; send/recv ``α + S/(η·B)``;
* hierarchical (the group spans ``g = n/k`` domains of ``k`` GPUs): all-reduce = intra-domain
  reduce-scatter of S + inter-domain all-reduce of S/k on each GPU's NIC + intra-domain
  all-gather of S (NCCL's rail-aligned rings);
* nccl-tests' reporting (``nccl-tests/doc/PERFORMANCE.md``): ``algbw = S/t``,
  ``busbw = algbw·2(n−1)/n`` (all-reduce), ``·(n−1)/n`` (all-gather, reduce-scatter, all-to-all),
  ``·1`` otherwise.

The ring/tree crossover follows from both times being affine in S, ``t = L + S·c``:
``S* = (L_ring − L_tree)/(c_tree − c_ring)``; on one tier for all-reduce that is
``S* = (n − 1 − ⌈log₂ n⌉)·α·n·η·B``: below it the tree's fewer latency steps win, above it the
ring's smaller volume.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from meshplan.calc.inputs import choice, count, positive
from meshplan.calc.result import CalcResult, derive, num, rate, secs, size
from meshplan.catalog import load_gpu
from meshplan.cost.calibration import calibration_for
from meshplan.cost.collectives import LAUNCHED, OPS, bus_factor, collective_cost, collective_phases, placement, wire
from meshplan.errors import InputError
from meshplan.specs.hardware import ClusterSpec, NetworkTier
from meshplan.specs.plan import AXES

OP_ALIASES = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce", "ar": "all_reduce",
    "all_gather": "all_gather", "allgather": "all_gather", "ag": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter", "rs": "reduce_scatter",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "a2a": "all_to_all",
    "broadcast": "broadcast", "bcast": "broadcast", "reduce": "reduce",
    "send_recv": "send_recv", "sendrecv": "send_recv", "p2p": "send_recv", "send": "send_recv",
}
ALGORITHMS = ("auto", "ring", "tree")
SOURCE = "Patarasuk & Yuan 2009 (ring); NCCL double binary tree; NCCL src/graph/tuning.cc (latencies); nccl-tests PERFORMANCE.md (algbw, busbw)"
MAX_N = 1_000_000
MAX_SIM_RANKS = 256
MAX_SIM_ELEMENTS = 10_000_000


@dataclass(frozen=True)
class Network:
    """One or two tiers: ``bw``/``latency`` inside a scale-up domain of ``gpus_per_node`` GPUs (the
    whole group when None), ``inter_bw``/``inter_latency`` across domains. Bandwidths in bytes/s
    per GPU per direction; ``efficiency`` multiplies both (1 = line rate, as the sources assume)."""

    bw: float
    latency: float
    gpus_per_node: int | None = None
    inter_bw: float | None = None
    inter_latency: float | None = None
    efficiency: float = 1.0
    gpu: str = "h100-sxm-80gb"
    base_latency: float = 0.0  # α₀ per call; 0 is the α–β model the sources teach


def network_for_gpu(gpu: str = "h100-sxm-80gb", **overrides) -> Network:
    """A :class:`Network` with the catalog GPU's scale-up and NIC bandwidths and the calibration's
    per-step latencies, overridden by whatever is given (None leaves the default)."""
    spec = load_gpu(gpu)
    cal = calibration_for(spec)
    base = dict(bw=spec.scale_up_bandwidth, latency=cal.scale_up_latency, inter_bw=spec.nic_bandwidth,
                inter_latency=cal.scale_out_latency, gpu=spec.name, base_latency=cal.collective_base_latency)
    base.update({k: v for k, v in overrides.items() if v is not None})
    return Network(**base)


def _cluster(n: int, net: Network):
    """The ClusterSpec, calibration and group placement of ``n`` GPUs on ``net``."""
    gpu = load_gpu(net.gpu)
    k = n if net.gpus_per_node is None else count("gpus_per_node", net.gpus_per_node, 1, MAX_N)
    k = min(k, n)
    if n % k:
        raise InputError("gpus_per_node", f"must divide n ({n}) for a hierarchical collective (got {k})")
    positive("bw", net.bw)
    positive("latency", net.latency, allow_zero=True)
    inter_bw = positive("inter_bw", net.inter_bw if net.inter_bw is not None else net.bw)
    inter_lat = positive("inter_latency", net.inter_latency if net.inter_latency is not None else net.latency, allow_zero=True)
    eff = positive("efficiency", net.efficiency)
    if eff > 1:
        raise InputError("efficiency", f"must be at most 1 (got {eff})")
    cluster = ClusterSpec.build(
        gpu=gpu, num_gpus=n,
        scale_up=NetworkTier(name="scale-up", size=k, bandwidth=net.bw, latency=net.latency),
        scale_out=NetworkTier(name="scale-out", size=n, bandwidth=inter_bw, latency=inter_lat),
    )
    cal = dataclasses.replace(calibration_for(gpu), scale_up_efficiency=eff, scale_out_efficiency=eff,
                              collective_base_latency=positive("base_latency", net.base_latency, allow_zero=True))
    sizes = {a: 1 for a in AXES} | {"dp": n}
    return cluster, cal, placement(cluster, sizes, AXES, ("dp",))


def check_op(op: str, n: int) -> tuple[str, int]:
    op = choice("op", op, OP_ALIASES)
    assert op in OPS
    n = count("n", n, 2, MAX_N)
    return op, (2 if op == "send_recv" else n)


def crossover(op: str, n: int, net: Network) -> float | None:
    """Buffer size where ring and tree take equally long (None when one always wins or the op has
    no tree variant): both times are affine in S, so two evaluations of ``collective_cost`` give it."""
    if op not in ("all_reduce", "broadcast", "reduce"):
        return None
    cluster, cal, pl = _cluster(n, net)
    probe = 1e9
    ring = collective_cost(op, probe, pl, cluster, cal, "ring")
    tree = collective_cost(op, probe, pl, cluster, cal, "tree")
    c_ring = (ring.time - ring.latency_time) / probe
    c_tree = (tree.time - tree.latency_time) / probe
    if c_tree <= c_ring or ring.latency_time <= tree.latency_time:
        return None
    return (ring.latency_time - tree.latency_time) / (c_tree - c_ring)


def collective(op: str, nbytes: float, n: int, net: Network, algorithm: str = "auto") -> CalcResult:
    """Time, steps, bytes sent per GPU, algbw and busbw of one collective (module docstring)."""
    op, n = check_op(op, n)
    S = positive("size", nbytes)
    algorithm = choice("algorithm", algorithm, ALGORITHMS)
    if algorithm == "tree" and op not in ("all_reduce", "broadcast", "reduce"):
        raise InputError("algorithm", f"tree applies to all-reduce, broadcast and reduce, not {op.replace('_', '-')}")
    cluster, cal, pl = _cluster(n, net)
    cost = collective_cost(op, S, pl, cluster, cal, algorithm)
    phases = collective_phases(op, S, pl, cluster, cal, cost.algorithm)
    steps = sum(p.steps for p in phases)
    sent = sum(p.sent for p in phases)
    cross = crossover(op, n, net)
    factor = bus_factor(op, n)
    k, g = pl.per_node, pl.nodes
    hier = g > 1 and k > 1
    name = op.replace("_", "-")
    data = {
        "op": op, "n": n, "size_bytes": S, "algorithm": cost.algorithm, "hierarchical": hier,
        "gpus_per_node": k, "domains": g, "efficiency": cal.scale_up_efficiency,
        "steps": steps, "sent_bytes_per_gpu": sent, "time_s": cost.time, "latency_s": cost.latency_time,
        "bandwidth_s": cost.time - cost.latency_time, "algbw": cost.algbw, "busbw": cost.busbw,
        "bus_factor": factor, "ring_tree_crossover_bytes": cross,
        "phases": [
            {"name": p.name, "tier": p.tier, "op": p.cost.op, "n": p.cost.n, "size_bytes": p.cost.nbytes,
             "algorithm": p.cost.algorithm, "steps": p.steps, "sent_bytes_per_gpu": p.sent,
             "time_s": p.cost.time, "latency_s": p.cost.latency_time}
            for p in phases
        ],
    }
    tier_syms = [("B", f"{rate(net.bw)} per GPU per direction" + (" inside a domain" if hier else "")),
                 ("α", f"{secs(net.latency)} per step"), ("α₀", f"{secs(cal.collective_base_latency)} per call"),
                 ("η", f"{cal.scale_up_efficiency:g} (efficiency)")]
    if hier:
        tier_syms += [("k", f"{k} GPUs per domain"), ("g", f"{g} domains"),
                      ("B_out", f"{rate(cluster.scale_out.bandwidth)} per GPU across domains"),
                      ("α_out", f"{secs(cluster.scale_out.latency)} per step across domains")]
    formula = _formula(op, cost.algorithm, hier)
    derivs = [
        derive("collective.sent", f"bytes each GPU sends ({name})", _sent_formula(op, cost.algorithm, hier),
               [("S", size(S)), ("n", str(n))] + ([("k", str(k))] if hier else []), size(sent), SOURCE),
        derive("collective.steps", "latency steps", _steps_formula(op, cost.algorithm, hier),
               [("n", str(n))] + ([("k", str(k)), ("g", str(g))] if hier else []), str(steps), SOURCE),
        derive("collective.time", f"{name} time ({cost.algorithm}{', hierarchical' if hier else ''})", formula,
               [("S", size(S)), ("n", str(n))] + tier_syms,
               f"{secs(cost.time)} (latency {secs(cost.latency_time)}, bandwidth {secs(cost.time - cost.latency_time)})", SOURCE),
        derive("collective.algbw", "algbw (nccl-tests)", "S / t", [("S", size(S)), ("t", secs(cost.time))],
               rate(cost.algbw), "nccl-tests doc/PERFORMANCE.md"),
        derive("collective.busbw", "busbw (nccl-tests)", f"algbw × {_factor_text(op)}",
               [("algbw", rate(cost.algbw)), ("factor", num(factor))], rate(cost.busbw), "nccl-tests doc/PERFORMANCE.md"),
    ]
    if hier:
        for i, p in enumerate(phases):
            derivs.append(derive(f"collective.phases[{i}]", f"  phase {i + 1}: {p.name}",
                                 f"{p.cost.op.replace('_', '-')} of {size(p.cost.nbytes)} over {p.cost.n} GPUs on the {p.tier} tier",
                                 [("sent", size(p.sent)), ("steps", str(p.steps))], secs(p.cost.time), SOURCE))
    if cross is not None:
        single = "(n − 1 − ⌈log₂ n⌉)·α·n·η·B on one tier" if op == "all_reduce" else "(L_ring − L_tree)/(c_tree − c_ring)"
        derivs.append(derive("collective.crossover", "ring = tree at buffer size",
                             f"S* = (L_ring − L_tree)/(c_tree − c_ring) = {single}",
                             [("L", "latency part of each time"), ("c", "seconds per byte of each")],
                             f"{size(cross)}: tree below, ring above", SOURCE))
    return CalcResult("collective", data, tuple(derivs))


def _factor_text(op: str) -> str:
    return {"all_reduce": "2(n−1)/n", "all_gather": "(n−1)/n", "reduce_scatter": "(n−1)/n", "all_to_all": "(n−1)/n"}.get(op, "1")


def _sent_formula(op: str, alg: str, hier: bool) -> str:
    if hier and op == "all_reduce":
        return "2(k−1)/k·S (intra RS + AG) + 2(g−1)/g·S/k (inter all-reduce)"
    if hier and op in ("all_gather", "reduce_scatter"):
        return "(k−1)/k·S + (g−1)/g·S/k"
    return {("all_reduce", "ring"): "2(n−1)/n · S", ("all_reduce", "tree"): "2·S"}.get(
        (op, alg), {"broadcast": "S", "reduce": "S", "send_recv": "S"}.get(op, "(n−1)/n · S"))


def _steps_formula(op: str, alg: str, hier: bool) -> str:
    if hier and op == "all_reduce":
        return ("2(k−1) + 2⌈log₂ g⌉" if alg == "tree"
                else "2(n−g) inside domains + 2(g−1) across (NCCL's flat ring)")
    if hier and op in ("all_gather", "reduce_scatter"):
        return "(n−g) inside domains + (g−1) across (NCCL's flat ring)"
    if alg == "tree":
        return "2⌈log₂ n⌉" if op == "all_reduce" else "⌈log₂ n⌉"
    return {"all_reduce": "2(n−1)", "send_recv": "1"}.get(op, "n−1")


def _formula(op: str, alg: str, hier: bool) -> str:
    base = "α₀ + " if op in LAUNCHED else ""
    if hier and op == "all_reduce":
        return (base + ("2(k−1)·α + 2⌈log₂ g⌉·α_out" if alg == "tree" else "2(n−g)·α + 2(g−1)·α_out")
                + " + 2(k−1)/k·S/(η·B) + " + ("2·(S/k)/(η·B_out)" if alg == "tree" else "2(g−1)/g·(S/k)/(η·B_out)"))
    if hier and op in ("all_gather", "reduce_scatter"):
        return base + "(n−g)·α + (g−1)·α_out + (k−1)/k·S/(η·B) + (g−1)/g·(S/k)/(η·B_out)"
    if hier and op == "all_to_all":
        return "(n−1)·max(α, α_out) + max((k−1)/n·S/(η·B), (n−k)/n·S/(η·B_out))  (intra and inter concurrently)"
    if hier:
        return base + "t(inter, g) + t(intra, k)"
    steps, sent = _steps_formula(op, alg, False), _sent_formula(op, alg, False)
    return f"{base}{steps}·α + {sent}/(η·B)"


# ---- the ring all-reduce, step by step, on numpy arrays -----------------------------------------


@dataclass(frozen=True)
class RingSim:
    n: int
    elements: int
    itemsize: int
    trace: tuple[tuple[str, int, int, int, int, int], ...]  # (phase, step, src, dst, chunk, bytes)
    sent: tuple[int, ...]  # bytes each rank sent
    received: tuple[int, ...]
    correct: bool  # every rank ended with the element-wise sum of all inputs
    max_abs_error: float

    @property
    def steps(self) -> int:
        return len({(p, s) for p, s, *_ in self.trace})


def simulate_ring_all_reduce(n: int, elements: int, seed: int = 0) -> RingSim:
    """Run the ring all-reduce on ``n`` random float32 arrays of ``elements`` values: each rank
    splits its array into n chunks; reduce-scatter: at step s (0..n−2) rank r sends chunk
    (r − s) mod n to rank r+1, which adds it to its own; after n−1 steps rank r holds the fully
    reduced chunk (r+1) mod n; all-gather: at step s rank r sends chunk (r + 1 − s) mod n to rank
    r+1, which overwrites its copy. All sends of a step happen at once (they are taken from the
    state before the step). The inputs are small integers, so float32 sums are exact in any order
    and the check is equality with ``sum(inputs)``."""
    n = count("n", n, 2, MAX_SIM_RANKS)
    elements = count("elements", elements, 1, MAX_SIM_ELEMENTS)
    rng = np.random.default_rng(seed)
    inputs = rng.integers(-1000, 1001, size=(n, elements)).astype(np.float32)
    buf = inputs.copy()
    bounds = np.linspace(0, elements, n + 1).round().astype(int)
    chunk = [slice(bounds[c], bounds[c + 1]) for c in range(n)]
    item = buf.itemsize
    sent, received, trace = [0] * n, [0] * n, []
    for phase, first in (("reduce-scatter", 0), ("all-gather", 1)):
        for s in range(n - 1):
            moves = [(r, (r + 1) % n, (r + first - s) % n) for r in range(n)]
            payload = [buf[src, chunk[c]].copy() for src, _, c in moves]
            for (src, dst, c), data in zip(moves, payload):
                if phase == "reduce-scatter":
                    buf[dst, chunk[c]] += data
                else:
                    buf[dst, chunk[c]] = data
                nb = data.size * item
                sent[src] += nb
                received[dst] += nb
                trace.append((phase, s, src, dst, c, nb))
    expected = inputs.sum(axis=0)
    err = float(np.abs(buf - expected[None, :]).max())
    return RingSim(n, elements, item, tuple(trace), tuple(sent), tuple(received), bool(err == 0.0), err)


def ring_sim_result(sim: RingSim) -> dict:
    """The simulation next to the model: bytes each rank sent vs ``wire('all_reduce', S, n)``."""
    S = sim.elements * sim.itemsize
    steps, model_sent = wire("all_reduce", S, sim.n, "ring")
    return {
        "n": sim.n, "elements": sim.elements, "size_bytes": S, "steps": sim.steps, "model_steps": steps,
        "sent_bytes": list(sim.sent), "received_bytes": list(sim.received), "model_sent_bytes": model_sent,
        "correct": sim.correct, "max_abs_error": sim.max_abs_error,
    }


def format_trace(sim: RingSim) -> list[str]:
    """One line per step: which chunk moves from which rank to which (source 004's step-through)."""
    lines, by_step = [], {}
    for phase, s, src, dst, c, nb in sim.trace:
        by_step.setdefault((phase, s), []).append(f"{src}→{dst} c{c}")
    for (phase, s), moves in by_step.items():
        lines.append(f"{phase} step {s + 1}/{sim.n - 1}: " + ", ".join(moves))
    owner = [f"rank {r}: c{(r + 1) % sim.n}" for r in range(sim.n)]
    lines.insert(sim.n - 1, "after reduce-scatter, fully reduced: " + ", ".join(owner))
    return lines
