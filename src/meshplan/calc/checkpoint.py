"""``calc checkpoint`` and ``calc zero``: what a checkpoint holds and costs, how often to take it,
and the model state each GPU keeps under ZeRO.

* Checkpoint size per precision recipe (:class:`~meshplan.specs.plan.PrecisionRecipe`): the
  weights, the fp32 master copy when there is one and the optimizer moments,
  ``P·(w + μ + σ)`` bytes plus a few bytes of step counter and scheduler state (gradients are
  not saved). Mixed-precision Adam: 2 + 4 + 8 = 14 bytes per parameter.
* Write time: ``T_w = size / min(W·b, B_fs)`` for ``W`` writers of ``b`` bytes/s each (1 when
  one process writes everything; every rank its own shard when sharded) and a filesystem
  that accepts at most ``B_fs``.
* Interval ``τ`` between checkpoints (compute time), for checkpoint cost ``C`` and mean time
  between failures ``M``: Young 1974 ("A first order approximation to the optimum checkpoint
  interval", CACM 17(9)) ``τ = √(2·C·M)``; Daly 2006 ("A higher order estimate of the optimum
  checkpoint interval for restart dumps", FGCS 22(3))
  ``τ = √(2CM)·[1 + ⅓·√(C/2M) + (1/9)·(C/2M)] − C`` for ``C < 2M``, else ``τ = M``.
* Expected waste, first order (Young): ``C/τ + (τ/2 + R)/M``: the checkpoint writes, on average
  half an interval of lost work per failure and the restart ``R``; goodput = 1 − waste. (The
  exact expectation for exponential failures is in :mod:`meshplan.calc.failures`.)
* Cost per crash: ``N·p·(τ/2 + R)`` for ``N`` GPUs at ``p`` per GPU-hour.
* ZeRO per-GPU model state (Rajbhandari et al. 2020, Sec. 5): :func:`meshplan.cost.memory.model_state_bytes`.
"""

from __future__ import annotations

import math

from meshplan.calc.inputs import count, positive
from meshplan.calc.result import CalcResult, derive, num, pct, secs, size
from meshplan.cost.collectives import wire
from meshplan.cost.memory import model_state_bytes
from meshplan.errors import InputError
from meshplan.specs.plan import PrecisionRecipe
from meshplan.units import GBPS, HOUR

STEP_STATE_BYTES = 8  # step counter / scheduler state: negligible, counted as the source does
#: restart after a failure (detect, reschedule, reload): 5 min, source 000's "5–10 minutes" per
#: failure; the default of ``calc checkpoint``, ``calc failures`` and ``estimate --tokens``
DEFAULT_RECOVERY_S = 300.0
YOUNG = "Young 1974, CACM 17(9): τ = √(2CM)"
DALY = "Daly 2006, A higher order estimate of the optimum checkpoint interval for restart dumps, FGCS 22(3)"
ZERO = "Rajbhandari et al. 2020 (ZeRO), Sec. 5; meshplan.cost.memory.model_state_bytes"


def recipe_text(r: PrecisionRecipe) -> str:
    master = f" + {r.master_bytes} master" if r.master_bytes else ""
    return f"{r.precision} weights ({r.weight_bytes}){master} + {r.state_bytes} {r.optimizer} moments"


def checkpoint_bytes_per_param(recipe: PrecisionRecipe) -> int:
    """Bytes per parameter a checkpoint stores: weights + fp32 master copy + optimizer moments."""
    return recipe.weight_bytes + recipe.master_bytes + recipe.state_bytes


def checkpoint_size(params: float, recipe: PrecisionRecipe) -> float:
    return params * checkpoint_bytes_per_param(recipe) + STEP_STATE_BYTES


def write_time(nbytes: float, writer_bw: float, writers: int = 1, fs_bw: float | None = None) -> float:
    """``size / min(W·b, B_fs)``."""
    agg = writers * writer_bw
    return nbytes / (min(agg, fs_bw) if fs_bw else agg)


def young_interval(C: float, M: float) -> float:
    return math.sqrt(2 * C * M)


def daly_interval(C: float, M: float) -> float:
    if C >= 2 * M:
        return M
    x = C / (2 * M)
    return math.sqrt(2 * C * M) * (1 + math.sqrt(x) / 3 + x / 9) - C


def first_order_waste(C: float, tau: float, M: float, R: float = 0.0) -> float:
    """Young's expected waste fraction: ``C/τ + (τ/2 + R)/M``."""
    return C / tau + (tau / 2 + R) / M


def cost_per_crash(gpus: int, price_per_gpu_hour: float, tau: float, R: float) -> float:
    return gpus * price_per_gpu_hour * (tau / 2 + R) / HOUR


def checkpoint(params: float, recipe: PrecisionRecipe, writer_bw: float, writers: int = 1, fs_bw: float | None = None,
               mtbf: float | None = None, recovery: float | None = None, interval: float | None = None,
               step_time: float | None = None, gpus: int | None = None, price: float | None = None,
               run_time: float | None = None) -> CalcResult:
    """Size, write time, optimal interval (Young and Daly), waste and the cost of a crash."""
    P = positive("params", params)
    b = positive("write_bw", writer_bw)
    W = count("writers", writers, 1, 100_000_000)
    if fs_bw is not None:
        positive("fs_bw", fs_bw)
    per_param = checkpoint_bytes_per_param(recipe)
    nbytes = checkpoint_size(P, recipe)
    C = write_time(nbytes, b, W, fs_bw)
    data = {"params": P, "bytes_per_param": per_param, "size_bytes": nbytes, "writers": W,
            "write_bw_per_writer": b, "fs_bw": fs_bw, "write_time_s": C}
    agg = f"min(W·b, B_fs) = {num(min(W * b, fs_bw) / GBPS)} GB/s" if fs_bw else f"W·b = {num(W * b / GBPS)} GB/s"
    derivs = [
        derive("checkpoint.size", "checkpoint size", "P·(w + μ + σ) + 8 B  (weights, fp32 master, moments; no gradients)",
               [("P", f"{num(P)} parameters"), ("w+μ+σ", f"{per_param} B/param: {recipe_text(recipe)}")], size(nbytes),
               "PrecisionRecipe (meshplan.specs.plan); seed 001 checkpoint exercise"),
        derive("checkpoint.write_time", "write time", "size / min(W·b, B_fs)",
               [("size", size(nbytes)), ("W", f"{W} writer(s)"), ("b", f"{num(b / GBPS)} GB/s each"),
                ("bandwidth", agg)], secs(C), "size over the aggregate write bandwidth (source 001: 98 s; sharded 98/N)"),
    ]
    if mtbf is None:
        return CalcResult("checkpoint", data, tuple(derivs))
    M = positive("mtbf", mtbf)
    R = C if recovery is None else positive("recovery", recovery, allow_zero=True)
    tau_y, tau_d = young_interval(C, M), daly_interval(C, M)
    tau = tau_y if interval is None else positive("interval", interval)
    waste = first_order_waste(C, tau, M, R)
    data.update({"mtbf_s": M, "recovery_s": R, "young_interval_s": tau_y, "daly_interval_s": tau_d, "interval_s": tau,
                 "checkpoint_overhead": C / tau, "lost_per_failure_s": tau / 2, "waste_fraction": waste,
                 "goodput": 1 - waste})
    derivs += [
        derive("checkpoint.young", "optimal interval (Young)", "√(2·C·M)", [("C", secs(C)), ("M", secs(M))],
               secs(tau_y), YOUNG),
        derive("checkpoint.daly", "optimal interval (Daly)", "√(2CM)·[1 + ⅓·√(C/2M) + (1/9)·(C/2M)] − C",
               [("C", secs(C)), ("M", secs(M))], secs(tau_d), DALY),
        derive("checkpoint.waste", "expected waste (first order)", "C/τ + (τ/2 + R)/M",
               [("C", secs(C)), ("τ", secs(tau) + (" (Young)" if interval is None else "")), ("R", secs(R) + (" (= write time: read back)" if recovery is None else "")),
                ("M", secs(M))],
               f"{pct(waste)} (checkpoints {pct(C / tau)}, lost work {pct(tau / 2 / M)}, restarts {pct(R / M)}); goodput {pct(1 - waste)}", YOUNG),
    ]
    if step_time is not None:
        st = positive("step_time", step_time)
        data["interval_steps"] = tau / st
        derivs.append(derive("checkpoint.steps", "interval in steps", "τ / t_step", [("τ", secs(tau)), ("t_step", secs(st))],
                             num(tau / st), YOUNG))
    if gpus is not None and price is not None:
        N = count("gpus", gpus, 1, 100_000_000)
        p = positive("price", price, allow_zero=True)
        crash = cost_per_crash(N, p, tau, R)
        data["cost_per_crash"] = crash
        derivs.append(derive("checkpoint.crash_cost", "cost per crash", "N·p·(τ/2 + R)",
                             [("N", f"{N:,} GPUs"), ("p", f"${num(p)} per GPU-hour"), ("τ/2", secs(tau / 2) + " lost work on average"), ("R", secs(R))],
                             f"${num(crash)}", "lost work τ/2 (Young's first order) plus the restart, at the GPU price (source 001)"))
        if run_time is not None:
            T = positive("run_time", run_time)
            crashes = T / M
            data["crashes"], data["crash_cost_total"] = crashes, crashes * crash
            derivs.append(derive("checkpoint.crash_cost_total", "cost of the run's crashes", "(T/M) · cost per crash",
                                 [("T", secs(T)), ("M", secs(M)), ("cost per crash", f"${num(crash)}")],
                                 f"{num(crashes)} crashes, ${num(crashes * crash)}", "a run of T at MTBF M sees T/M failures on average"))
    return CalcResult("checkpoint", data, tuple(derivs))


def zero_state(params: float, recipe: PrecisionRecipe, zero: int, shard: int, bw: float | None = None) -> CalcResult:
    """Model state per GPU under ZeRO stage ``zero`` sharded over ``shard`` ranks, and the data
    each GPU sends per step for the weights and gradients (ring collectives over the shard
    group): ZeRO-0/1/2 one all-reduce of the gradients, 2(N−1)/N·γP (ZeRO-2 as reduce-scatter +
    all-gather of the weights, the same bytes); ZeRO-3 all-gathers the weights in the forward and
    again in the backward and reduce-scatters the gradients, 3·(N−1)/N·wP with 16-bit gradients."""
    P = positive("params", params)
    if zero not in (0, 1, 2, 3):
        raise InputError("zero", f"must be 0, 1, 2 or 3 (got {zero})")
    N = count("dp", shard, 1, 100_000_000)
    st = model_state_bytes(P, recipe, zero, N)
    total = st.weights + st.gradients + st.optimizer
    unsharded = model_state_bytes(P, recipe, 0, 1)
    w, g, o = recipe.weight_bytes, recipe.grad_bytes, recipe.optimizer_bytes
    per_param = {0: f"{w} + {g} + {o}", 1: f"{w} + {g} + {o}/N", 2: f"{w} + ({g} + {o})/N", 3: f"({w} + {g} + {o})/N"}[zero]
    if zero == 3:
        comm = [("all_gather", P * w), ("all_gather", P * w), ("reduce_scatter", P * g)]
    else:
        comm = [("all_reduce", P * g)]
    sent = sum(wire(op, nb, N, "ring")[1] for op, nb in comm) if N > 1 else 0.0
    data = {"params": P, "zero": zero, "dp": N, "weights_bytes": st.weights, "gradients_bytes": st.gradients,
            "optimizer_bytes": st.optimizer, "total_bytes": total, "bytes_per_param": total / P,
            "unsharded_bytes": unsharded.weights + unsharded.gradients + unsharded.optimizer,
            "comm_sent_bytes_per_step": sent, "comm_ops": [op for op, _ in comm]}
    derivs = [
        derive("zero.state", f"model state per GPU, ZeRO-{zero}", f"P·({per_param}) bytes",
               [("P", f"{num(P)} parameters"), ("N", f"{N} ranks sharing the state"),
                ("w, γ, ω", f"{w}, {g}, {o} bytes per parameter ({recipe.bytes_per_param} unsharded)")],
               f"{size(total)} (weights {size(st.weights)}, gradients {size(st.gradients)}, optimizer {size(st.optimizer)})",
               ZERO),
        derive("zero.comm", "sent per GPU per step (weights and gradients)",
               "3·(N−1)/N·w·P (AG fwd + AG bwd + RS)" if zero == 3 else "2(N−1)/N·γ·P (all-reduce)",
               [("N", str(N)), ("P", num(P))], size(sent), "Rajbhandari et al. 2020, Sec. 7 (communication analysis)"),
    ]
    if bw is not None:
        B = positive("bw", bw)
        data["comm_time_s"] = sent / B
        derivs.append(derive("zero.comm_time", "its time at the link bandwidth", "sent / B",
                             [("sent", size(sent)), ("B", f"{num(B / GBPS)} GB/s")], secs(sent / B), "bandwidth term of the ring model (meshplan.cost.collectives)"))
    return CalcResult("zero", data, tuple(derivs))
