"""Search speed, from one run of this script (no timed tests: the machine is shared and noisy).

1. GPT-3 175B on 1,024 A100, batch 1,536 sequences of 2,048: plans screened per second on one
   core (enumeration + vectorized screening), the whole search (screening + exact simulation of
   the contenders) in plans per second, and the ratio against calling the scalar ``estimate``
   in a loop on a sample of the same plans. Target: >= 1,000,000 plans/s.
2. Llama 3 405B on 16,384 H100, 8K sequences, 16M-token batches: the whole search's wall time.
   Target: < 5 s.
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
from meshplan.search.engine import Engine  # noqa: E402
from meshplan.search.run import search  # noqa: E402
from meshplan.search.space import SearchLimits, enumerate_plans  # noqa: E402
from meshplan.specs import ClusterSpec, TrainingPlan  # noqa: E402

TARGET_RATE = 1_000_000
TARGET_405B_S = 5.0


def gpt3() -> None:
    model = load_model("gpt3-175b")
    cluster = ClusterSpec.of(load_gpu("a100-sxm-80gb"), 1024)
    base = TrainingPlan(global_batch=1536, seq_len=2048)
    limits = SearchLimits(max_tp=8, max_cp=1, max_pp=96, max_vpp=8, max_micro_batch=8)
    t0 = time.perf_counter()
    table = enumerate_plans(model, 1024, cluster.gpus_per_node, 2048, (1536,), limits)
    engine = Engine(model, cluster, base)
    engine.evaluate(table)
    screen_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    res = search(model, cluster, base, limits, top_k=10)
    search_s = time.perf_counter() - t1
    rng = np.random.default_rng(0)
    sample = rng.choice(len(table), min(200, len(table)), replace=False).tolist()
    t2 = time.perf_counter()
    for i in sample:
        estimate(model, cluster, TrainingPlan(**{**base.model_dump(), **table.row(i)}))
    scalar_rate = len(sample) / (time.perf_counter() - t2)
    screen_rate = len(table) / screen_s
    search_rate = len(table) / search_s
    print(f"GPT-3 175B / 1,024 A100 / batch 1,536: {len(table):,} plans evaluated "
          f"(+{sum(v for k, v in table.rejected.items()):,} rejected by structure)")
    print(f"  screening      {screen_s:8.2f} s   {screen_rate:12,.0f} plans/s")
    print(f"  whole search   {search_s:8.2f} s   {search_rate:12,.0f} plans/s  ({res.simulated:,} simulated exactly)")
    print(f"  scalar loop    {len(sample) / scalar_rate:8.2f} s   {scalar_rate:12,.0f} plans/s  ({len(sample)} plans)")
    print(f"  ratio search / scalar loop: {search_rate / scalar_rate:,.0f}x; target {TARGET_RATE:,} plans/s: "
          f"{'met' if search_rate >= TARGET_RATE else 'NOT met'} ({search_rate / TARGET_RATE:.2f} of it)")


def llama405b() -> None:
    model = load_model("llama3-405b")
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 16384, pod_size=3072, oversubscription=7)
    base = TrainingPlan(global_batch=2048, seq_len=8192, rank_order=("tp", "cp", "pp", "dp"))
    t0 = time.perf_counter()
    res = search(model, cluster, base, SearchLimits(), top_k=10)
    s = time.perf_counter() - t0
    best = res.top[0].estimate
    p = best.plan
    print(f"Llama 3 405B / 16,384 H100 / 16M tokens: {res.evaluated:,} plans evaluated, {res.feasible:,} fit, "
          f"{res.simulated:,} simulated exactly, {s:.2f} s (target < {TARGET_405B_S:.0f} s: {'met' if s < TARGET_405B_S else 'NOT met'})")
    print(f"  best: TP{p.tp} CP{p.cp} PP{p.pp} DP{p.dp} {p.schedule} v{p.vpp} b{p.micro_batch}, step {best.time.step_s:.3f} s, MFU {best.mfu:.1%}")


if __name__ == "__main__":
    gpt3()
    llama405b()
