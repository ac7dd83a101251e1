"""How long a run takes with failures: the failure-free work of ``meshplan estimate --tokens``
stretched by checkpoints, lost work and restarts, expected and as a p10–p90 range.

Inputs, each with a stated default (:class:`FailureModel`):

* Cluster MTBF from the GPU count: ``M = 1 / (N·λ)`` for ``N`` GPUs failing at ``λ`` per
  GPU-hour (:func:`meshplan.calc.failures.cluster_mtbf` with one component). Default
  ``λ = 419 / (16,384 × 54 × 24 h) = 1.973e-5`` per GPU-hour: Llama 3 405B's pre-training saw
  419 unexpected interruptions in 54 days on 16,384 H100 GPUs (Dubey et al. 2024, "The Llama 3
  Herd of Models", Sec. 3.3.4, Table 5), about one every 3.1 hours; it counts every job
  interruption (GPU, HBM, network, host, software), so it is the rate a synchronous job sees.
* Checkpoint size from the plan: ``P·(w + μ + σ)`` bytes
  (:func:`meshplan.calc.checkpoint.checkpoint_size`, the plan's precision recipe).
* Write time ``C = size / min(N·b, B_fs)`` (:func:`meshplan.calc.checkpoint.write_time`): every
  GPU writes its own shard at ``b`` = 1 GB/s (assumed: 8 GB/s a node, a parallel-filesystem
  client's order of magnitude), capped by the filesystem's ``B_fs`` = 2 TB/s (Llama 3's Tectonic
  store, Sec. 3.3.1: 2 TB/s sustained, 7 TB/s peak).
* Restart ``R`` = 5 min (:data:`meshplan.calc.checkpoint.DEFAULT_RECOVERY_S`: detect, reschedule,
  reload the checkpoint; source 000's "5–10 minutes" per failure), the same default as
  ``meshplan calc checkpoint`` and ``calc failures``.
* Interval: Daly's optimum (:func:`meshplan.calc.checkpoint.daly_interval`).

Expected wall-clock time: Daly's exact expectation for this model
(:func:`meshplan.calc.failures.analyze`, ``E[T] = Σ_segments M·e^{R/M}·(e^{(τ+C)/M} − 1)``);
goodput = W / E[T]. The range: the 10th and 90th percentiles of :data:`MC_RUNS` runs of the
failures Monte Carlo (:func:`meshplan.calc.failures.simulate`, seed :data:`MC_SEED`), left out
(``monte_carlo`` None, with the reason) when a run would see more than
:data:`MC_MAX_FAILURES` failures, so the estimate stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from meshplan.calc.checkpoint import DEFAULT_RECOVERY_S, checkpoint_size, write_time
from meshplan.calc.failures import Component, Scenario, analyze, cluster_mtbf, simulate
from meshplan.calc.inputs import count, positive
from meshplan.errors import InputError
from meshplan.specs.plan import PrecisionRecipe
from meshplan.units import DAY, GBPS, HOUR

#: Llama 3 405B pre-training (Dubey et al. 2024, Sec. 3.3.4): unexpected interruptions, GPUs, days.
LLAMA3_INTERRUPTIONS, LLAMA3_GPUS, LLAMA3_DAYS = 419, 16_384, 54
FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_DAYS * 24)
RATE_SOURCE = ("Llama 3 (Dubey et al. 2024, Sec. 3.3.4): 419 unexpected interruptions in 54 days "
               "on 16,384 H100 GPUs")
WRITE_BW_PER_GPU = 1.0 * GBPS  # assumed: each GPU writes its shard at 1 GB/s
FS_BW = 2000.0 * GBPS  # Llama 3's Tectonic: 2 TB/s sustained (Sec. 3.3.1)
MC_RUNS = 400
MC_SEED = 0
MC_MAX_FAILURES = 5_000  # about 1 s of simulation at most


@dataclass(frozen=True)
class FailureModel:
    """The failure and checkpoint inputs of a run (module docstring): ``rate`` failures per
    GPU-hour, or the cluster's ``mtbf`` in seconds instead; ``write_bw`` bytes/s per GPU;
    ``fs_bw`` bytes/s in total (None: no cap); ``restart`` seconds; Monte Carlo ``runs``
    (0: none) and ``seed``."""

    rate: float = FAILURES_PER_GPU_HOUR
    mtbf: Optional[float] = None
    write_bw: float = WRITE_BW_PER_GPU
    fs_bw: Optional[float] = FS_BW
    restart: float = DEFAULT_RECOVERY_S
    runs: int = MC_RUNS
    seed: int = MC_SEED

    def __post_init__(self) -> None:
        positive("failure_rate", self.rate)
        if self.mtbf is not None:
            positive("mtbf", self.mtbf)
        positive("ckpt_write_bw", self.write_bw)
        if self.fs_bw is not None:
            positive("ckpt_fs_bw", self.fs_bw)
        positive("restart", self.restart, allow_zero=True)
        if self.runs:
            count("runs", self.runs, 2, 100_000)


def gpu_mtbf(gpus: int, rate: float = FAILURES_PER_GPU_HOUR) -> float:
    """Cluster MTBF in seconds, ``M = 1 / (N·λ)``, for ``gpus`` GPUs failing at ``rate`` per GPU-hour."""
    return cluster_mtbf([Component("gpu", count("gpus", gpus, 1, 100_000_000), HOUR / positive("failure_rate", rate))])


def run_with_failures(work: float, gpus: int, params: float, recipe: PrecisionRecipe,
                      model: FailureModel = FailureModel()) -> dict[str, Any]:
    """Checkpoint size and write time, MTBF, Daly's interval, the expected wall-clock time with
    failures, goodput, and the Monte Carlo's p10/p50/p90 (module docstring). Seconds and bytes."""
    W = positive("work", work)
    size = checkpoint_size(positive("params", params), recipe)
    C = write_time(size, model.write_bw, gpus, model.fs_bw)
    M = model.mtbf if model.mtbf is not None else gpu_mtbf(gpus, model.rate)
    out: dict[str, Any] = {
        "mtbf_s": M, "mtbf_from": "given" if model.mtbf is not None else "gpus",
        "failures_per_gpu_hour": None if model.mtbf is not None else model.rate,
        "rate_source": None if model.mtbf is not None else (RATE_SOURCE if model.rate == FAILURES_PER_GPU_HOUR else "given"),
        "checkpoint_bytes": size, "checkpoint_write_s": C, "write_bw_per_gpu": model.write_bw, "fs_bw": model.fs_bw,
        "restart_s": model.restart,
    }
    try:
        a = analyze(W, M, Scenario("disk", C, model.restart))
    except InputError as err:  # a run that practically never finishes
        return {**out, "finishes": False, "why": err.rule}
    out.update({"finishes": True, "interval_s": a["interval_s"], "expected_failures": a["expected_failures"],
                "expected_seconds": a["expected_time_s"], "expected_days": a["expected_time_s"] / DAY,
                "goodput": a["expected_goodput"], "monte_carlo": None})
    if not model.runs:
        return out
    if a["expected_failures"] > MC_MAX_FAILURES:
        out["monte_carlo_skipped"] = f"about {a['expected_failures']:,.0f} failures per run, more than {MC_MAX_FAILURES:,} to simulate"
        return out
    mc = simulate(W, a["interval_s"], C, model.restart, M, model.runs, model.seed, keep_timeline=False)
    p10, p50, p90 = (float(x) for x in np.percentile(mc.total, (10, 50, 90)))
    out["monte_carlo"] = {"runs": mc.runs, "seed": model.seed, "days_p10": p10 / DAY, "days_p50": p50 / DAY,
                          "days_p90": p90 / DAY, "days_mean": float(mc.total.mean()) / DAY,
                          "failures_mean": float(mc.failures.mean())}
    return out


def for_estimate(est, model: FailureModel = FailureModel()) -> Optional[dict[str, Any]]:
    """:func:`run_with_failures` for an :class:`~meshplan.estimate.Estimate` with tokens: its
    pure step-time seconds as the work, its GPUs, parameters and precision recipe (None without
    tokens)."""
    run = est.run_cost()
    if not run:
        return None
    return run_with_failures(run["seconds"], est.plan.num_gpus, est.params.total, est.plan.precision, model)
