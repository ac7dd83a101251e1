"""Search speed, from one run of this script (no timed tests: the machine is shared and noisy).

1. GPT-3 175B on 1,024 A100, batch 1,536 sequences of 2,048: plans screened per second on one
   core (enumeration + vectorized screening: exact peak memory per pipeline rank and a lower bound
   on the step, for every plan), the whole search (screening + exact simulation of the contenders)
   in plans per second, and the ratio against calling the scalar ``estimate`` (exact memory and
   the full pipeline simulation) in a loop on a sample of the same plans.
   Target: >= 1,000,000 plans/s.
2. Llama 3 405B on 16,384 H100, 8K sequences, 16M-token batches: the whole search's wall time.
   Target: < 5 s.

Every measurement starts from empty schedule caches (as a fresh ``meshplan search`` does) and is
reported as wall time and as this process's CPU time (``time.process_time``), which other jobs
on a shared machine disturb less.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402

from meshplan.catalog import load_gpu, load_model  # noqa: E402
from meshplan.estimate import estimate  # noqa: E402
from meshplan.pipeline.inflight import live_rows  # noqa: E402
from meshplan.pipeline.schedules import build_schedule, compile_schedule  # noqa: E402
from meshplan.pipeline.simulate import _simulate_once, live_count_peaks  # noqa: E402
from meshplan.search.engine import Engine  # noqa: E402
from meshplan.search.run import search  # noqa: E402
from meshplan.search.space import SearchLimits, enumerate_plans  # noqa: E402
from meshplan.specs import ClusterSpec, TrainingPlan  # noqa: E402

TARGET_RATE = 1_000_000
TARGET_405B_S = 5.0


def cold() -> None:
    """Empty the schedule caches, so that each measurement pays for what a fresh run pays."""
    for fn in (live_rows, compile_schedule, build_schedule, live_count_peaks, _simulate_once):
        fn.cache_clear()


class Clock:
    """Wall and CPU seconds of a block."""

    def __enter__(self) -> "Clock":
        cold()
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


def gpt3() -> None:
    model = load_model("gpt3-175b")
    cluster = ClusterSpec.of(load_gpu("a100-sxm-80gb"), 1024)
    base = TrainingPlan(global_batch=1536, seq_len=2048)
    limits = SearchLimits(max_tp=8, max_cp=1, max_pp=96, max_vpp=8, max_micro_batch=8)
    with Clock() as screen:
        table = enumerate_plans(model, 1024, cluster.gpus_per_node, 2048, (1536,), limits)
        Engine(model, cluster, base).evaluate(table)
    with Clock() as whole:
        res = search(model, cluster, base, limits, top_k=10)
    rng = np.random.default_rng(0)
    sample = rng.choice(len(table), min(200, len(table)), replace=False).tolist()
    with Clock() as loop:
        for i in sample:
            estimate(model, cluster, TrainingPlan(**{**base.model_dump(), **table.row(i)}))
    n = len(table)
    rate = lambda clock, k=n: (k / clock.wall, k / clock.cpu)  # noqa: E731
    print(f"GPT-3 175B / 1,024 A100 / batch 1,536: {n:,} plans evaluated "
          f"(+{sum(table.rejected.values()):,} rejected by structure)")
    print("                 wall (s)  CPU (s)   plans/s (wall)   plans/s (CPU)")
    for label, clock, k in (("screening", screen, n), ("whole search", whole, n), ("scalar loop", loop, len(sample))):
        w, c = rate(clock, k)
        print(f"  {label:<13} {clock.wall:8.2f} {clock.cpu:8.2f}  {w:15,.0f}  {c:14,.0f}")
    print(f"  whole search: {res.simulated:,} plans simulated exactly; scalar loop: {len(sample)} plans")
    scalar = rate(loop, len(sample))[1]
    print(f"  ratio to the scalar loop (CPU): screening {rate(screen)[1] / scalar:,.0f}x, "
          f"whole search {rate(whole)[1] / scalar:,.0f}x")
    best = max(rate(screen))
    print(f"  target {TARGET_RATE:,} plans/s screened: {'met' if best >= TARGET_RATE else 'NOT met'} "
          f"({best / TARGET_RATE:.3f} of it)")


def gpt3_full() -> None:
    """The same GPT-3 space with every micro-batch that divides the per-replica batch, every
    HSDP shard group and TP communication overlap on and off: more plans per pipeline shape, so
    per-plan arithmetic weighs more."""
    model = load_model("gpt3-175b")
    cluster = ClusterSpec.of(load_gpu("a100-sxm-80gb"), 1024)
    base = TrainingPlan(global_batch=1536, seq_len=2048)
    limits = SearchLimits(max_tp=8, max_cp=1, max_pp=96, max_vpp=8, max_micro_batch=1536, hsdp=True,
                          tp_comm_overlap=(True, False))
    with Clock() as screen:
        table = enumerate_plans(model, 1024, cluster.gpus_per_node, 2048, (1536,), limits)
        Engine(model, cluster, base).evaluate(table)
    n = len(table)
    print(f"  all micro-batches, HSDP shard groups, TP overlap on/off: {n:,} plans screened in {screen.wall:.2f} s wall, "
          f"{screen.cpu:.2f} s CPU ({n / screen.cpu:,.0f} plans/s CPU)")


def llama405b() -> None:
    model = load_model("llama3-405b")
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 16384, pod_size=3072, oversubscription=7)
    base = TrainingPlan(global_batch=2048, seq_len=8192, rank_order=("tp", "cp", "pp", "dp"))
    with Clock() as clock:
        res = search(model, cluster, base, SearchLimits(), top_k=10)
    best = res.top[0].estimate
    p = best.plan
    met = "met" if clock.wall < TARGET_405B_S else "NOT met"
    print(f"Llama 3 405B / 16,384 H100 / 16M tokens: {res.evaluated:,} plans evaluated, {res.feasible:,} fit, "
          f"{res.simulated:,} simulated exactly")
    print(f"  {clock.wall:.2f} s wall, {clock.cpu:.2f} s CPU (target < {TARGET_405B_S:.0f} s wall: {met})")
    print(f"  best: TP{p.tp} CP{p.cp} PP{p.pp} DP{p.dp} {p.schedule} v{p.vpp} b{p.micro_batch}, step {best.time.step_s:.3f} s, MFU {best.mfu:.1%}")


if __name__ == "__main__":
    gpt3()
    gpt3_full()
    llama405b()
