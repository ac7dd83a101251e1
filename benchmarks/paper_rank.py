"""Where Llama 3's own layout ranks among the feasible plans of its search, counted exactly.

Llama 3 405B on 16,384 H100 (8K sequences, 16M-token batches, 3,072-GPU pods with 7:1
oversubscription, rank order tp, cp, pp, dp): every plan whose step-time lower bound is below the
paper layout's exact step (TP8 CP1 PP16 DP128, interleaved with v = 8 and one layer per chunk,
the first chunk holding only the embedding and the last only the LM head, micro-batch 1, no
recompute, ZeRO-2: the ``llama3-405b-16k`` preset) is estimated exactly, so the count of faster plans is exact. Percentiles are
given over plans (every setting a separate plan, as the search counts them), over distinct layouts
(tp, cp, pp, dp, schedule, vpp, micro-batch; each at its best setting) and over the plans without
context parallelism. Takes a few minutes (about 12,000 exact estimates).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402

from meshplan.catalog import load_gpu, load_model  # noqa: E402
from meshplan.estimate import estimate  # noqa: E402
from meshplan.presets import get_preset  # noqa: E402
from meshplan.search.engine import Engine  # noqa: E402
from meshplan.search.run import plan_of  # noqa: E402
from meshplan.search.space import SCHEDULE_NAMES, SearchLimits, enumerate_plans  # noqa: E402
from meshplan.specs import ClusterSpec, TrainingPlan  # noqa: E402

PUBLISHED_STEP_S = 6.753  # 400 TFLOP/s per GPU on the paper's FLOP count (README, "Worked example")


def main() -> None:
    t0 = time.perf_counter()
    model = load_model("llama3-405b")
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 16384, pod_size=3072, oversubscription=7)
    v = get_preset("llama3-405b-16k").values
    # the preset's stack: Megatron-Core with FlashAttention-2's rates (Meta's kernels)
    base = TrainingPlan.of(global_batch=2048, seq_len=8192, rank_order=("tp", "cp", "pp", "dp"), attention_kernel=v["attention_kernel"])
    paper = base.replace(**{k: v[k] for k in ("tp", "cp", "pp", "dp", "vpp", "schedule", "micro_batch", "recompute", "zero")})
    ref = estimate(model, cluster, paper).time.step_s
    table = enumerate_plans(model, 16384, cluster.gpus_per_node, 8192, (2048,), SearchLimits())
    screen = Engine(model, cluster, base).evaluate(table)
    fits = screen.peak_bytes <= cluster.gpu.hbm_bytes
    maybe = np.flatnonzero(fits & (screen.step_lower_bound < ref))
    step = {i: estimate(model, cluster, plan_of(base, table, i)).time.step_s for i in maybe.tolist()}
    faster = [i for i, s in step.items() if s < ref]
    n_fit = int(fits.sum())
    print(f"paper layout TP8 CP1 PP16 DP128 interleaved v{paper.vpp}: step {ref:.3f} s (published {PUBLISHED_STEP_S} s)")
    print(f"feasible plans {n_fit:,}; bound below the paper's step {len(maybe):,}, simulated exactly")
    print(f"  faster plans: {len(faster):,} ({len(faster) / n_fit:.1%}): the paper's layout is in the top {len(faster) / n_fit:.1%}")
    key = lambda i: tuple(int(getattr(table, c)[i]) for c in ("tp", "cp", "pp", "dp", "schedule", "vpp", "micro_batch"))  # noqa: E731
    layouts = {key(i) for i in np.flatnonzero(fits).tolist()}
    fast_layouts = {key(i) for i in faster}
    print(f"  over distinct layouts: {len(fast_layouts):,} of {len(layouts):,} faster ({len(fast_layouts) / len(layouts):.1%})")
    cp1 = int((fits & (table.cp == 1)).sum())
    f1 = sum(1 for i in faster if table.cp[i] == 1)
    print(f"  without CP: {f1:,} of {cp1:,} plans faster ({f1 / cp1:.2%})")
    at_pub = sum(1 for s in step.values() if s < PUBLISHED_STEP_S)
    print(f"  at the published step {PUBLISHED_STEP_S} s it would be in the top {at_pub / n_fit:.1%} ({at_pub:,} faster)")
    for col in ("cp", "tp", "pp"):
        print(f"  faster plans by {col}: " + ", ".join(f"{k}: {v:,}" for k, v in sorted(Counter(int(getattr(table, col)[i]) for i in faster).items())))
    sched = Counter(SCHEDULE_NAMES[int(table.schedule[i])] for i in faster)
    print("  faster plans by schedule: " + ", ".join(f"{k}: {v:,}" for k, v in sched.most_common()))
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
