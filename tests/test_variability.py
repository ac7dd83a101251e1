"""The slowest GPU sets the pace (meshplan.cost.variability): z(N), the straggler factor, and
their place in an estimate and a search."""

from __future__ import annotations

import importlib
from statistics import NormalDist

import numpy as np
import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.calibration import calibration_for, synchronized
from meshplan.cost.variability import THROUGHPUT_CV, expected_max_z, straggler_factor
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import TrainingPlan

estimate = importlib.import_module("meshplan.estimate").estimate
H100 = load_gpu("h100-sxm-80gb")


def _exact_expected_max(n: int) -> float:
    """E[max of n standard normals] = ∫ x·n·Φ(x)^(n−1)·φ(x) dx, by the trapezoid rule."""
    x = np.linspace(-10, 10, 200_001)
    pdf = np.exp(-x * x / 2) / np.sqrt(2 * np.pi)
    cdf = np.array([NormalDist().cdf(v) for v in x[::100]])
    cdf = np.interp(x, x[::100], cdf)
    return float(np.trapezoid(x * n * cdf ** (n - 1) * pdf, x))


def test_blom_z_against_the_exact_expected_maximum():
    assert expected_max_z(1) == 0.0
    assert _exact_expected_max(2) == pytest.approx(1 / np.sqrt(np.pi), abs=1e-4)  # 0.5642, in closed form
    for n, tol in ((2, 0.03), (8, 0.012), (64, 0.008), (512, 0.014), (16384, 0.016)):
        assert expected_max_z(n) == pytest.approx(_exact_expected_max(n), abs=tol), n
    assert [round(expected_max_z(n), 3) for n in (8, 512, 16384)] == [1.434, 3.031, 3.956]


def test_factor_grows_with_the_gpus_that_meet():
    assert THROUGHPUT_CV == 0.01
    assert straggler_factor(1) == 1.0
    assert straggler_factor(16384) == pytest.approx(1 + 0.01 * 3.956, abs=1e-5)
    factors = [straggler_factor(2**k) for k in range(15)]
    assert factors == sorted(factors) and factors[-1] - factors[3] == pytest.approx(0.01 * (expected_max_z(2**14) - expected_max_z(8)))


def test_synchronized_calibration_slows_compute_only():
    cal = calibration_for(H100)
    assert synchronized(cal, 1) is cal
    s = synchronized(cal, 1024)
    f = straggler_factor(1024)
    assert s.gemm_efficiency == cal.gemm_efficiency / f and s.attention_bwd_efficiency == cal.attention_bwd_efficiency / f
    assert (s.hbm_efficiency, s.scale_out_efficiency, s.kernel_overhead) == (cal.hbm_efficiency, cal.scale_out_efficiency, cal.kernel_overhead)


def test_estimate_compute_takes_the_slowest_gpus_time():
    # the same per-GPU plan on 8 and on 1,024 GPUs (dp only): a GEMM-bound layer's forward grows by
    # about f(1024)/f(8); the DP synchronization is its own
    model = load_model("llama3-8b")
    times = {}
    for n in (8, 1024):
        plan = TrainingPlan.of(dp=n, global_batch=n, micro_batch=1, seq_len=8192, zero=1)
        est = estimate(model, ClusterSpec.of(H100, n), plan)
        times[n] = est
    gemm = {n: e.time.compute_s for n, e in times.items()}
    ratio = straggler_factor(1024) / straggler_factor(8)
    assert gemm[1024] / gemm[8] == pytest.approx(ratio, rel=0.01)
    assert any(d.key == "time.variability" and "1,024 GPUs" in d.symbols[0][1] for d in times[1024].derivations)
