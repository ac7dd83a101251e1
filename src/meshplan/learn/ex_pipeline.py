"""Exercises on pipeline parallelism (seeds 000 exercise 1 and 001).

Every answer is read off meshplan's event simulation of the schedule
(:func:`meshplan.pipeline.simulate.simulate` over :func:`meshplan.pipeline.schedules.build_schedule`)
with equal stages, a backward twice the forward and free transfers; the worked solution puts the
simulated figures next to the closed forms (Narayanan et al. 2021): with ``p`` stages and ``m``
micro-batches, the bubble fraction (idle share of the step) is ``(p−1)/(m+p−1)`` and the bubble
overhead (idle relative to the ideal compute) ``(p−1)/m``; interleaving with ``v`` chunks per rank
divides the idle time by ``v``.
"""

from __future__ import annotations

from meshplan.calc.result import derive, num, pct, size
from meshplan.learn.model import Numeric
from meshplan.learn.registry import Problem, Variant, command, exercise, url
from meshplan.pipeline.lockstep import torch_grid
from meshplan.pipeline.schedules import build_schedule, compile_schedule, stage_style
from meshplan.pipeline.simulate import SimResult, simulate, uniform_makespan
from meshplan.pipeline.stages import rank_of
from meshplan.units import GB

NARAYANAN = "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters, Sec. 2.2"
F, B = 1.0, 2.0  # forward and backward of a whole stage, in units of the forward


def run(schedule: str, p: int, m: int, v: int = 1) -> SimResult:
    """The simulated schedule with equal stages: per chunk forward F/v, backward B/v."""
    ranks = build_schedule(schedule, p, m, v)
    S = p * v
    return simulate(ranks, S, [F / v] * S, [B / v] * S)


def _links(schedule: str, p: int, m: int, v: int = 1):
    opts = dict(pp=p, microbatches=m, vpp=v if v > 1 else None, schedule=schedule)
    return command("pipeline", **opts), url("/pipeline", **{**opts, "vpp": v})  # v stated: the view bounds p·v·m


def _bubble_derivs(sim: SimResult, p: int, m: int, v: int = 1) -> list:
    idle = sum(sim.idle) / len(sim.idle)
    busy = sum(sim.busy) / len(sim.busy)
    ideal = "m·v" if v > 1 else "m"
    return [
        derive("pipeline.makespan", "step (simulated)", "makespan of the schedule; closed form (m·v + p − 1)·(f + b)/v" if v > 1
               else "makespan of the schedule; closed form (m + p − 1)·(f + b)",
               [("p", str(p)), ("m", str(m))] + ([("v", str(v))] if v > 1 else []) + [("f + b", "3 (forward = 1)")],
               num(sim.makespan), NARAYANAN),
        derive("pipeline.bubble_fraction", "bubble fraction (idle share of the step)", f"idle / step = (p−1)/({ideal} + p − 1)",
               [("idle", f"{num(idle)} per rank"), ("step", num(sim.makespan))], pct(sim.bubble_fraction), NARAYANAN),
        derive("pipeline.bubble_overhead", "bubble overhead (idle relative to ideal compute)", f"idle / busy = (p−1)/{ideal}",
               [("idle", num(idle)), ("busy", num(busy))], pct(sim.bubble_overhead), NARAYANAN),
    ]


def _bubble_1f1b(v: Variant, ask: str, field: str, hints: tuple[str, ...], note: str | None = None) -> Problem:
    p = v.pick(4, [2, 4, 8, 16])
    m = v.pick(12, [4, 8, 12, 16, 32, 64])
    sim = run("1f1b", p, m)
    cmd, link = _links("1f1b", p, m)
    return Problem(
        prompt=f"PP = {p} stages, m = {m} micro-batches, 1F1B schedule, equal stages. {ask}",
        answer=Numeric(getattr(sim, field), "%", 0.01, 0.005), solution=_bubble_derivs(sim, p, m), hints=hints,
        params={"pp": p, "microbatches": m}, command=cmd, url=link, source_note=note,
    )


@exercise("bubble-1f1b", "pipeline", "Bubble fraction of 1F1B", "easy", "001, pipeline parallelism, question 1")
def bubble_1f1b(v: Variant) -> Problem:
    return _bubble_1f1b(
        v, "What share of the step is bubble (the bubble fraction: idle time / step time), in %?", "bubble_fraction",
        ("Warm-up and drain take p − 1 slots.", "The step lasts m + p − 1 slots."),
        "001 answers 25%, which is the bubble overhead (p−1)/m = 3/12, idle time relative to the ideal compute. "
        "As a share of the step the bubble is (p−1)/(m+p−1) = 3/15 = 20%.")


@exercise("bubble-overhead", "pipeline", "Bubble overhead relative to compute", "easy", "001, pipeline parallelism, question 1")
def bubble_overhead(v: Variant) -> Problem:
    return _bubble_1f1b(
        v, "By how much does the bubble lengthen the step relative to the ideal compute (the bubble overhead: idle "
           "time / busy time), in %?", "bubble_overhead", ("Ideal compute: m slots; idle: p − 1 slots.",))


@exercise("bubble-interleaved", "pipeline", "Bubble fraction with interleaving", "medium", "001, pipeline parallelism, question 3")
def bubble_interleaved(v: Variant) -> Problem:
    p = v.pick(4, [2, 4, 8])
    m = p * v.pick(3, [1, 2, 3, 4])
    vpp = v.pick(4, [2, 3, 4])
    sim = run("interleaved", p, m, vpp)
    cmd, link = _links("interleaved", p, m, vpp)
    return Problem(
        prompt=f"PP = {p}, m = {m} micro-batches, interleaved 1F1B with v = {vpp} chunks per rank, equal stages. What "
               f"is the bubble fraction (idle share of the step), in %?",
        answer=Numeric(sim.bubble_fraction, "%", 0.01, 0.005),
        solution=_bubble_derivs(sim, p, m, vpp), hints=("Each chunk is 1/v of a stage: the warm-up shrinks v-fold.",),
        params={"pp": p, "microbatches": m, "vpp": vpp}, command=cmd, url=link,
        source_note="001 answers 6.25% = (p−1)/(m·v), the bubble overhead; as a share of the step it is "
                    "(p−1)/(m·v + p − 1) = 3/51 = 5.88%.",
    )


@exercise("inflight-activations", "pipeline", "Activations held by the first stage", "medium", "001, pipeline parallelism, question 2")
def inflight(v: Variant) -> Problem:
    p = v.pick(4, [2, 4, 8, 16])
    m = v.pick(12, [p, 2 * p, 12, 32])
    a = v.pick(2 * GB, [0.5 * GB, 1 * GB, 2 * GB, 4 * GB])
    schedule = v.pick("1f1b", ["1f1b", "gpipe"])
    sim = run(schedule, p, m)
    peak = sim.peak_inflight[0]
    cmd, link = _links(schedule, p, m)
    return Problem(
        prompt=f"PP = {p}, m = {m}, {'1F1B' if schedule == '1f1b' else 'GPipe'} schedule. Each micro-batch's activations "
               f"on a stage take {num(a / GB)} GB. How many GB of activations does the first stage (rank 0) hold at its peak?",
        answer=Numeric(peak * a, "GB", GB, 0.01),
        solution=[derive("pipeline.inflight", "micro-batches in flight on rank 0 (simulated)",
                         "1F1B: min(p, m); GPipe: m", [("p", str(p)), ("m", str(m))], str(peak), NARAYANAN),
                  derive("pipeline.activations", "peak activations of rank 0", "in flight × a",
                         [("a", size(a))], size(peak * a), NARAYANAN)],
        hints=("Rank 0 runs p − 1 warm-up forwards, then one more before its first backward.",),
        params={"pp": p, "microbatches": m, "act_bytes": a, "schedule": schedule}, command=cmd, url=link,
        source_note="001 counts p − 1 = 3 micro-batches in flight (6 GB, '4× less' than GPipe's 24 GB). The first stage "
                    "holds p = 4 before its first backward frees one: 8 GB, 3× less than GPipe.",
    )


@exercise("p2p-volume", "pipeline", "Point-to-point traffic of an interleaved step", "hard", "001, pipeline parallelism, question 4")
def p2p_volume(v: Variant) -> Problem:
    p = v.pick(4, [2, 4, 8])
    m = p * v.pick(3, [1, 2, 4])
    vpp = v.pick(4, [1, 2, 4])
    a = v.pick(0.5 * GB, [0.25 * GB, 0.5 * GB, 1 * GB])
    schedule = "interleaved" if vpp > 1 else "1f1b"
    ranks = build_schedule(schedule, p, m, vpp)
    S = p * vpp
    sends = sum(1 for acts in ranks for x in acts
                if (x.kind == "F" and x.stage < S - 1) or (x.kind in ("B", "I") and x.stage > 0))
    cmd, link = _links(schedule, p, m, vpp)
    return Problem(
        prompt=f"PP = {p}, v = {vpp} virtual stages per rank, m = {m} micro-batches. Each boundary between consecutive "
               f"virtual stages carries {num(a / GB)} GB per micro-batch forward (activations) and the same backward "
               f"(gradients). How many GB of point-to-point traffic does one step send in total?",
        answer=Numeric(sends * a, "GB", GB, 0.01),
        solution=[derive("pipeline.sends", "sends in the schedule (counted)", "2·m·(p·v − 1)",
                         [("p·v − 1", f"{S - 1} boundaries"), ("m", str(m))], str(sends), NARAYANAN),
                  derive("pipeline.p2p", "point-to-point bytes per step", "sends × a", [("a", size(a))], size(sends * a), NARAYANAN)],
        hints=("Boundaries: p·v − 1.", "Each micro-batch crosses each boundary twice."),
        params={"pp": p, "microbatches": m, "vpp": vpp, "act_bytes": a}, command=cmd, url=link,
    )


@exercise("min-microbatches", "pipeline", "Micro-batches for a small bubble", "medium", "001, pipeline parallelism, question 6")
def min_microbatches(v: Variant) -> Problem:
    p = v.pick(8, [4, 8, 16, 32])
    # p·m stays within the 20,000 micro-batch stages the web explorer draws (p = 32 at 2% needs m = 1,551)
    target = v.pick(0.05, [0.05, 0.1] if p == 32 else [0.02, 0.05, 0.1])
    m = 1
    while True:
        span = uniform_makespan("1f1b", p, m, 1, F, B)
        if span / (m * (F + B)) - 1 < target * (1 - 1e-9):  # strictly below, whatever the rounding
            break
        m += 1
    cmd, link = _links("1f1b", p, m)
    return Problem(
        prompt=f"PP = {p}, 1F1B, equal stages. What is the smallest number of micro-batches m that keeps the bubble "
               f"overhead (idle relative to ideal compute, (p−1)/m) strictly below {pct(target, 0)}?",
        answer=Numeric(m, "", 1.0, 0.0),
        solution=[derive("pipeline.min_m", "smallest m", "(p−1)/m < target  ⇔  m > (p−1)/target",
                         [("p", str(p)), ("target", pct(target, 0))], str(m), NARAYANAN)],
        hints=("Solve (p−1)/m < target for m.", "At equality the bubble is not strictly below the target."),
        params={"pp": p, "target": target}, command=cmd, url=link,
    )


@exercise("pp-tradeoff", "pipeline", "Bubble against pipeline depth", "easy", "000, exercise 1")
def pp_tradeoff(v: Variant) -> Problem:
    p = v.pick(16, [8, 16, 32])
    m = v.pick(64, [16, 32, 64, 128])
    sim = run("1f1b", p, m)
    cmd, link = _links("1f1b", p, m)
    return Problem(
        prompt=f"Llama 3 405B with PP = {p} and m = {m} micro-batches per step, 1F1B, equal stages. What is the "
               f"bubble fraction (idle share of the step), in %?",
        answer=Numeric(sim.bubble_fraction, "%", 0.01, 0.005),
        solution=_bubble_derivs(sim, p, m), hints=("(p−1)/(m+p−1).",),
        params={"pp": p, "microbatches": m}, command=cmd, url=link,
        explanation="Doubling p halves the layers (and weights) per GPU but roughly doubles the bubble.",
    )


TORCH_2024 = "torch.distributed.pipelining, PipelineScheduleMulti._step_microbatches (torch 1963fc8, 2024-12)"


def _grid_row(row) -> str:
    """One rank's row of torch's grid in torch's notation (``2F1``: stage 2's forward of micro-batch 1),
    ``·`` for an idle slot."""
    return " ".join("·" if a is None else str(a) for a in row)


def _sends_to(a, p: int, S: int, style: str) -> int | None:
    """The rank action ``a`` sends to: a forward of stage s < S − 1 to the rank of s + 1, a
    backward of stage s > 0 to the rank of s − 1 (as :mod:`meshplan.pipeline.lockstep` links them)."""
    if a is None:
        return None
    if a.kind == "F":
        return rank_of(a.stage + 1, p, style) if a.stage < S - 1 else None
    return rank_of(a.stage - 1, p, style) if a.stage > 0 else None


def first_wait(grid, dependency: SimResult, lockstep: SimResult, S: int, style: str) -> str | None:
    """The first action lockstep starts later than the dependency-driven run does, and the
    exchange of an earlier slot its rank waited for, in words; None when no action starts later."""
    p = len(grid)
    slots = [[t for t, a in enumerate(row) if a is not None] for row in grid]
    late = [(lk[1], r, i) for r in range(p) for i, (dp, lk) in enumerate(zip(dependency.timeline[r], lockstep.timeline[r]))
            if lk[1] > dp[1] + 1e-9]
    if not late:
        return None
    start, r, i = min(late)
    action, t = lockstep.timeline[r][i][0], slots[r][i]
    end = {(q, slots[q][j]): e for q in range(p) for j, (_, _, e) in enumerate(lockstep.timeline[q])}
    text = (f"rank {r}'s {action} (slot {t}) could start at {num(dependency.timeline[r][i][1])}, its rank free and its "
            f"input there, yet starts at {num(start)}")
    cell = lambda q, u: grid[q][u] if u < len(grid[q]) else None  # noqa: E731
    for u in range(t - 1, -1, -1):
        mine = cell(r, u)
        for q in range(p):
            other = cell(q, u)
            if q != r and _sends_to(other, p, S, style) == r:
                return (f"{text}: in slot {u} it receives rank {q}'s {other}, which ends at {num(end[(q, u)])}, "
                        f"and it leaves that slot only at {num(start)}" + (", when the transfer is done" if start > end[(q, u)] else ""))
            if q != r and _sends_to(mine, p, S, style) == q:
                return (f"{text}: in slot {u} it sends its {mine} to rank {q} and leaves that slot only at "
                        f"{num(start)}, when the transfer is done")
        if mine is not None:
            break
    return text


@exercise("lockstep-runtime", "pipeline", "Lockstep against dependency-driven pipeline runtime", "hard",
          "meshplan.pipeline.lockstep; torch's PipelineScheduleMulti (2024)")
def lockstep_runtime(v: Variant) -> Problem:
    p, vpp = 2, 2
    m = v.pick(4, [2, 3, 4])
    tau = v.pick(0.0, [0.0, 0.25, 0.5])
    S = p * vpp
    sched = compile_schedule("interleaved", p, m, vpp)
    timed = [simulate(sched, S, [F] * S, [B] * S, tau, keep_timeline=True, runtime=rt) for rt in ("dependency", "lockstep")]
    dep, lock = timed
    extra = lock.makespan - dep.makespan
    grid = torch_grid("interleaved", p, m, vpp)
    wait = first_wait(grid, *timed, S, stage_style("interleaved"))
    opts = dict(pp=p, microbatches=m, vpp=vpp, schedule="interleaved", fwd=F * vpp, bwd=B * vpp, transfer=tau or None,
                pipeline_runtime="lockstep")
    sends = f", and every send to the other rank takes τ = {num(tau)}" if tau else ", and sends take no time"
    return Problem(
        prompt=f"Interleaved 1F1B on p = {p} ranks with v = {vpp} chunks each (stages 0 and 2 on rank 0, 1 and 3 on "
               f"rank 1), m = {m} micro-batches; every chunk's forward takes F = {num(F)} and its backward B = {num(B)}"
               f"{sends}. Run dependency-driven (Megatron-LM; an action waits only for its rank and its input) the step "
               f"takes {num(dep.makespan)}. torch's 2024 runtime runs the same actions slot by slot over its grid: a rank "
               f"leaves a slot only when its action is done and every send and receive it shares with a neighbour in "
               f"that slot has completed. What is the step's makespan under that lockstep runtime, in units of F?",
        answer=Numeric(lock.makespan, "", 1.0, 0.005),
        solution=[
            derive("lockstep.grid", "torch's grid (pipeline_order), one column per slot; 2F1: stage 2's forward of micro-batch 1",
                   "rank r: r idle slots, warm-up forwards, idle slots, F/B pairs, cool-down B's after idle slots",
                   [(f"rank {r}", _grid_row(row)) for r, row in enumerate(grid)], f"{max(len(r) for r in grid)} slots",
                   "torch _get_1f1b_rank_ops; meshplan.pipeline.lockstep.torch_grid"),
            derive("lockstep.dependency", "step, dependency-driven (simulated)", "an action starts when its rank is free and its input has arrived",
                   [("F", num(F)), ("B", num(B)), ("τ", num(tau))], num(dep.makespan), "meshplan.pipeline.simulate.simulate"),
            derive("lockstep.makespan", "step, lockstep (simulated)",
                   "c_r(t) = e_r(t−1) + d_r(t);  e_r(t) = max(c_r(t), max over linked q of max(c_r(t), c_q(t)) + τ)",
                   [("d_r(t)", "the action's time, 0 in an idle slot"), ("linked q", "the rank r sends to or receives from in slot t")],
                   num(lock.makespan), f"{TORCH_2024}; meshplan.pipeline.lockstep.simulate_lockstep"),
            derive("lockstep.extra", "lockstep costs", "T_lockstep − T_dependency", [("T_lockstep", num(lock.makespan)), ("T_dependency", num(dep.makespan))],
                   f"{num(extra)} ({pct(extra / dep.makespan)} longer)", "meshplan.pipeline.lockstep"),
        ],
        hints=("Write down torch's grid first: each slot holds at most one action per rank.",
               "A forward of stage s is received in the same slot by the rank of s + 1, which cannot leave that slot "
               "until the forward and the transfer are done, even when its own action finished long before."),
        params={"pp": p, "vpp": vpp, "microbatches": m, "fwd": F, "bwd": B, "transfer": tau, "dependency": dep.makespan},
        command=command("pipeline", **opts), url=url("/pipeline", **opts),
        explanation=(f"Here {wait}. " if wait else "Here no action starts later than dependency-driven. ") +
                    "In lockstep a rank that finishes its slot early still waits for the neighbour it exchanges with in "
                    "that slot (a send and its receive are posted in the same batch_isend_irecv and waited together), so "
                    "its next action starts late even when its input arrived long ago; a transfer time is paid inside "
                    "every linked slot instead of hiding behind other work. Later torch runtimes "
                    "(_PipelineScheduleRuntime) post receives ahead and run dependency-driven.",
    )
