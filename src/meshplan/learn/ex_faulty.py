"""'Find the faulty line' exercises (seed 001's buggy calculators, and more of the same kind).

Each is a short Python function with one planted mistake. The right output for the call shown
comes from meshplan's library (the ring model, the pipeline simulator, ``accumulation_steps``,
GradScaler's rule, Young's interval); the fixed variant plants the source's mistake, the random
ones pick one of several plausible mistakes and a call on which it shows.
"""

from __future__ import annotations

import math

from meshplan.calc.batch import accumulation_steps
from meshplan.calc.checkpoint import young_interval
from meshplan.calc.collective import Network, collective
from meshplan.calc.loss_scale import ScalerConfig, walk
from meshplan.calc.result import derive, num
from meshplan.learn.ex_pipeline import run
from meshplan.learn.model import FaultyLine
from meshplan.learn.registry import Problem, Variant, command, exercise, url

TRIES = 200


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
    return a == b


def _plant(v: Variant, lines: list[str], bugs: list[tuple[int, str]], fixed_bug: int, make_args, expected_of, name: str) -> FaultyLine:
    """Plant one of ``bugs`` (line number, wrong text) in the correct ``lines``; pick arguments
    (``make_args(rng or None)``) on which the planted function's output differs from
    ``expected_of(args)``."""
    line, wrong = bugs[fixed_bug] if v.fixed else v.rng.choice(bugs)
    shown = list(lines)
    correct = shown[line - 1]
    shown[line - 1] = wrong
    for _ in range(TRIES):
        args = make_args(v.rng)
        ex = FaultyLine(tuple(shown), line, correct, name, tuple(args), expected_of(args))
        if not _same(ex.run(), ex.expected):
            return ex
        if v.fixed:
            break
    raise AssertionError(f"{name}: no call shows the planted mistake")


@exercise("faulty-allreduce-time", "collectives", "Find the faulty line: ring all-reduce time", "easy", "001, ring all-reduce (buggy calculator)")
def faulty_allreduce(v: Variant) -> Problem:
    lines = [
        "def all_reduce_time(size, n, bw):",
        "    data_per_gpu = 2 * size * (n - 1) / n",
        "    steps = 2 * (n - 1)",
        "    per_step_data = size / n",
        "    per_step_time = per_step_data / bw",
        "    total_time = steps * per_step_time",
        "    return total_time",
    ]
    bugs = [(6, "    total_time = 2 * steps * per_step_time"), (3, "    steps = 2 * n"),
            (4, "    per_step_data = size / (n - 1)"), (5, "    per_step_time = per_step_data * bw")]

    def args(rng):
        return (2e9, 8, 50e9) if rng is None else (rng.choice([0.5e9, 1e9, 2e9, 4e9]), rng.choice([4, 8, 16, 64]), rng.choice([25e9, 50e9, 450e9]))

    def expected(a):
        return collective("all_reduce", a[0], a[1], Network(bw=a[2], latency=0.0), "ring").data["time_s"]

    f = _plant(v, lines, bugs, 0, args, expected, "all_reduce_time")
    S, n, bw = f.args
    return Problem(
        prompt=f"This ring all-reduce time calculator (seconds, for size bytes over n GPUs at bw bytes/s per direction, "
               f"no latency) returns {num(f.run())} s for all_reduce_time({num(S)}, {n}, {num(bw)}) instead of "
               f"{num(f.expected)} s. Which line is wrong?",
        answer=f,
        solution=[derive("faulty.expected", "ring all-reduce time", "2(n−1) steps × (S/n) / B = 2(n−1)/n · S/B",
                         [("S", num(S)), ("n", str(n)), ("B", num(bw))], f"{num(f.expected)} s", "meshplan.calc.collective")],
        hints=("Check each line against t = 2(n−1)·(S/n)/B.", "steps already counts both phases."),
        params={"size_bytes": S, "n": n, "bw": bw, "bug": f.bug},
        command=command("calc", "collective", size=f"{S / 1e9:g}GB", n=n, bw=bw / 1e9, latency="0us", algorithm="ring"),
        url=url("/calc/collective", size=f"{S / 1e9:g}GB", n=n, bw=bw / 1e9, latency="0us", algorithm="ring"),
    )


@exercise("faulty-bubble", "pipeline", "Find the faulty line: bubble overhead", "medium", "001, pipeline parallelism (buggy calculator)")
def faulty_bubble(v: Variant) -> Problem:
    lines = [
        "def bubble_overhead(pp, microbatches, virtual_stages=1):",
        '    """Idle time relative to the ideal compute (1F1B, or interleaved with virtual_stages chunks)."""',
        "    bubble_steps = pp - 1",
        "    total_steps = microbatches * virtual_stages",
        "    return bubble_steps / total_steps",
    ]
    bugs = [(5, "    return bubble_steps / (bubble_steps + total_steps)"), (3, "    bubble_steps = pp"),
            (4, "    total_steps = microbatches")]

    def args(rng):
        if rng is None:
            return (4, 12, 1)
        p = rng.choice([2, 4, 8])
        return (p, p * rng.choice([1, 2, 3, 4]), rng.choice([1, 2, 4]))

    def expected(a):
        p, m, vpp = a
        return run("interleaved" if vpp > 1 else "1f1b", p, m, vpp).bubble_overhead

    f = _plant(v, lines, bugs, 0, args, expected, "bubble_overhead")
    p, m, vpp = f.args
    return Problem(
        prompt=f"bubble_overhead({p}, {m}, {vpp}) should give the idle time relative to the ideal compute, "
               f"{num(f.expected)}, but returns {num(f.run())}. Which line is wrong?",
        answer=f,
        solution=[derive("faulty.expected", "bubble overhead (simulated)", "idle / busy = (p−1)/(m·v)",
                         [("p", str(p)), ("m", str(m)), ("v", str(vpp))], num(f.expected), "meshplan.pipeline.simulate")],
        hints=("Overhead divides by the ideal compute; the bubble fraction divides by the whole step.",),
        params={"pp": p, "microbatches": m, "vpp": vpp, "bug": f.bug},
        command=command("pipeline", pp=p, microbatches=m, vpp=vpp if vpp > 1 else None),
        url=url("/pipeline", pp=p, microbatches=m, vpp=vpp if vpp > 1 else None),
        source_note="001 says (p−1)/((p−1) + m·v) is wrong for 1F1B. It is the bubble fraction (idle share of the step) of "
                    "1F1B and GPipe alike; it is a mistake only in a function that promises the overhead (p−1)/(m·v), as here.",
    )


@exercise("faulty-accumulation", "batch", "Find the faulty line: accumulation steps", "easy", "001, gradient accumulation (code exercise)")
def faulty_accumulation(v: Variant) -> Problem:
    lines = [
        "def accumulation_steps(target_batch, micro_batch, dp):",
        "    per_step = micro_batch * dp",
        "    steps = -(-target_batch // per_step)",
        "    return steps",
    ]
    bugs = [(3, "    steps = target_batch // per_step"), (2, "    per_step = micro_batch + dp"),
            (3, "    steps = target_batch // per_step + 1")]

    def args(rng):
        return (2000, 4, 8) if rng is None else (rng.randint(100, 5000), rng.choice([1, 2, 4, 8]), rng.choice([2, 4, 8, 16]))

    f = _plant(v, lines, bugs, 0, args, lambda a: accumulation_steps(*a), "accumulation_steps")
    B, b, D = f.args
    return Problem(
        prompt=f"accumulation_steps({B}, {b}, {D}) must return the micro-batches per optimizer step that reach at least "
               f"the target batch ({f.expected}); it returns {f.run()}. Which line is wrong?",
        answer=f,
        solution=[derive("faulty.expected", "gradient accumulation steps", "⌈B / (b·D)⌉",
                         [("B", str(B)), ("b", str(b)), ("D", str(D))], str(f.expected), "meshplan.calc.batch.accumulation_steps")],
        hints=("The target must be reached: round up.",),
        params={"target": B, "micro_batch": b, "dp": D, "bug": f.bug},
        command=command("calc", "batch", target=B, micro=b, dp=D), url=url("/calc/batch", target=B, micro=b, dp=D),
    )


@exercise("faulty-loss-scale", "precision", "Find the faulty line: dynamic loss scaling", "medium", "001, mixed precision (code exercise)")
def faulty_loss_scale(v: Variant) -> Problem:
    lines = [
        "def final_scale(overflows, scale, growth_interval):",
        "    good = 0",
        "    for overflow in overflows:",
        "        if overflow:",
        "            scale = scale / 2",
        "            good = 0",
        "        else:",
        "            good += 1",
        "            if good == growth_interval:",
        "                scale = scale * 2",
        "                good = 0",
        "    return scale",
    ]
    bugs = [(6, "            good = good"), (9, "            if good > growth_interval:"),
            (5, "            scale = scale * 2"), (11, "                good = 1")]

    def args(rng):
        if rng is None:
            return ([False, False, True, False, False, False, False], 1024.0, 3)
        return ([rng.random() < 0.3 for _ in range(rng.randint(8, 16))], 2.0 ** rng.randint(8, 16), rng.choice([2, 3, 4]))

    def expected(a):
        return walk(a[0], ScalerConfig(init_scale=a[1], growth_interval=a[2])).final_scale

    f = _plant(v, lines, bugs, 0, args, expected, "final_scale")
    flags, s0, gi = f.args
    text = "".join("1" if x else "0" for x in flags)
    return Problem(
        prompt=f"final_scale follows GradScaler: halve on overflow (and restart the count of good steps), double after "
               f"growth_interval good steps in a row. For overflows {text}, scale {num(s0)}, growth_interval {gi} it "
               f"returns {num(f.run())} instead of {num(f.expected)}. Which line is wrong?",
        answer=f,
        solution=[derive("faulty.expected", "final loss scale", "backoff ×½ on overflow; ×2 after growth_interval good steps",
                         [("flags", text), ("S₀", num(s0)), ("interval", str(gi))], num(f.expected), "meshplan.calc.loss_scale (torch GradScaler)")],
        hints=("Walk the flags by hand and compare with each line.",),
        params={"flags": text, "init_scale": s0, "growth_interval": gi, "bug": f.bug},
        command=command("calc", "loss-scale", overflow=text, init_scale=s0, growth_interval=gi),
        url=url("/calc/loss-scale", overflow=text, init_scale=s0, growth_interval=gi),
    )


@exercise("faulty-young", "checkpoint", "Find the faulty line: checkpoint interval", "easy", "001, checkpointing (code exercise)")
def faulty_young(v: Variant) -> Problem:
    lines = [
        "def checkpoint_interval(write_seconds, mtbf_seconds):",
        "    c = write_seconds",
        "    m = mtbf_seconds",
        "    return math.sqrt(2 * c * m)",
    ]
    bugs = [(4, "    return math.sqrt(c * m)"), (3, "    m = mtbf_seconds / 3600"), (4, "    return 2 * math.sqrt(c * m)")]

    def args(rng):
        return (98.0, 86400.0) if rng is None else (float(rng.choice([10, 30, 98, 300])), rng.choice([6.0, 12.0, 24.0, 72.0]) * 3600)

    f = _plant(v, lines, bugs, 0, args, lambda a: young_interval(*a), "checkpoint_interval")
    C, M = f.args
    return Problem(
        prompt=f"checkpoint_interval({num(C)}, {num(M)}) should return Young's optimal interval in seconds, "
               f"{num(f.expected)}, but returns {num(f.run())}. Which line is wrong?",
        answer=f,
        solution=[derive("faulty.expected", "optimal interval (Young)", "√(2·C·M)", [("C", f"{num(C)} s"), ("M", f"{num(M)} s")],
                         f"{num(f.expected)} s", "Young 1974; meshplan.calc.checkpoint.young_interval")],
        hints=("Young: τ = √(2CM), C and M in the same unit.",),
        params={"write_s": C, "mtbf_s": M, "bug": f.bug},
        command=command("calc", "checkpoint", params="70B", mtbf=f"{M / 3600:g}h"), url=url("/calc/checkpoint", params="70B", mtbf=f"{M / 3600:g}h"),
    )
