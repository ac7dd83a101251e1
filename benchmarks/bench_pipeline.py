"""Time the pipeline simulator on a large schedule: p = 64 ranks, m = 1,024 micro-batches,
v = 8 virtual stages per rank (524,288 micro-batch chunks, about a million actions), against the
1-second target, from one run of this script (no timed tests: the machine is shared and noisy)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from meshplan.pipeline.schedules import compile_schedule  # noqa: E402
from meshplan.pipeline.simulate import simulate  # noqa: E402

TARGET_S = 1.0


def one(schedule: str, pp: int, m: int, vpp: int) -> None:
    compile_schedule.cache_clear()
    t0 = time.perf_counter()
    sched = compile_schedule(schedule, pp, m, vpp)
    t1 = time.perf_counter()
    n = pp * vpp
    sim = simulate(sched, n, [1.0 / vpp] * n, [2.0 / vpp] * n, transfer=0.01, act_bytes=[1.0] * n)
    t2 = time.perf_counter()
    actions = sum(k.size for k in sched.kind)
    total = t2 - t0
    print(f"{schedule:>15} p={pp} m={m} v={vpp}: {actions:,} actions; build {t1 - t0:.3f} s + simulate "
          f"{t2 - t1:.3f} s = {total:.3f} s; target {TARGET_S:.0f} s, ratio {total / TARGET_S:.2f} "
          f"({'meets' if total <= TARGET_S else 'misses'}); makespan {sim.makespan:.2f}")


if __name__ == "__main__":
    one("interleaved", 64, 1024, 8)
    one("interleaved-zb", 64, 1024, 8)
    one("zbv", 64, 1024, 2)
    one("1f1b", 64, 1024, 1)
