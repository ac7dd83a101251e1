"""Time one ``estimate`` of Llama 3 405B on 16,384 H100 (TP8 PP16 DP128, interleaved v=2) and
print it next to the 5 ms target, from one run of this script (no timed tests: the machine is
shared and noisy, so the figure to read is the median and the ratio)."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from meshplan.catalog import load_gpu, load_model  # noqa: E402
from meshplan.estimate import estimate  # noqa: E402
from meshplan.specs import ClusterSpec, TrainingPlan  # noqa: E402

TARGET_S = 5e-3


def main(repeats: int = 200) -> None:
    model = load_model("llama3-405b")
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 16384, pod_size=3072, oversubscription=7)
    plan = TrainingPlan(
        tp=8, pp=16, dp=128, vpp=2, schedule="interleaved", micro_batch=1, global_batch=2048,
        seq_len=8192, zero=2, rank_order=("tp", "cp", "pp", "dp"),
    )
    estimate(model, cluster, plan)  # warm caches (catalog, imports)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        estimate(model, cluster, plan)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"estimate llama3-405b 16384xH100 TP8 PP16 DP128 v2: median {med * 1e3:.2f} ms, "
          f"min {min(times) * 1e3:.2f} ms over {repeats} runs; target {TARGET_S * 1e3:.0f} ms; "
          f"ratio median/target {med / TARGET_S:.2f} ({'meets' if med <= TARGET_S else 'misses'} target)")


if __name__ == "__main__":
    main()
