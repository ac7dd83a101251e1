"""``calc roofline`` and ``calc cost``: intensity, ridge point and verdicts (source 004); compute,
days, implied MFU, GPU cost and electricity (sources 000, 001), with the seeds' slips corrected."""

from __future__ import annotations

import pytest

from meshplan.calc.cost import cost, implied_mfu, training_flops
from meshplan.calc.roofline import elementwise_roofline, gemm_roofline, roofline
from meshplan.errors import InputError

DAY = 86400.0


# ---- roofline (source 004) -------------------------------------------------------------------------


def test_ridge_point_h100_bf16():
    """004: 'The H100 has 989 TFLOP/s compute and 3,352 GB/s bandwidth. The crossover point is
    989,000 / 3,352 ≈ 295 FLOPs/byte'; the catalog's 989.4 TFLOP/s and 3,350 GB/s give 295.3."""
    r = gemm_roofline("4096x4096x4096")
    assert r.data["ridge"] == pytest.approx(989.4e12 / 3350e9, rel=1e-12)
    assert round(r.data["ridge"]) == 295


def test_gemm_intensity_2048_counts_only_the_reads():
    """004: a 4096³ BF16 GEMM 'does 2MKN FLOPs, loads (MK + KN) × 2 bytes … ≈ 2048 FLOPs/byte'.
    That leaves out writing the 4096² result; counted, the intensity is 1,365 FLOP/byte. Both are
    far above the ridge: compute-bound."""
    reads_only = gemm_roofline("4096x4096x4096", output=False)
    assert reads_only.data["intensity"] == 2048.0
    full = gemm_roofline("4096x4096x4096")
    assert full.data["intensity"] == pytest.approx(4096 / 3, rel=1e-12)
    assert full.data["bound"] == "compute-bound" and full.data["attainable_flops"] == 989.4e12


def test_relu_is_memory_bound():
    """004: element-wise ReLU over 4096², 'loads N × 2 bytes. Intensity = 1/2': reading only. Read
    and write: 1 FLOP per 4 bytes = 0.25. Attainable 0.25 × 3,350 GB/s = 0.84 TFLOP/s."""
    n = 4096 * 4096
    assert elementwise_roofline(n, reads=1, writes=0).data["intensity"] == 0.5
    r = elementwise_roofline(n)
    assert r.data["intensity"] == 0.25 and r.data["bound"] == "memory-bound"
    assert r.data["attainable_flops"] == pytest.approx(0.25 * 3350e9)
    assert r.data["min_time_s"] == pytest.approx(4 * n / 3350e9)


def test_roofline_per_dtype_and_gpu():
    fp8 = roofline(1e12, 1e9, "h100", "fp8-e4m3")
    assert fp8.data["ridge"] == pytest.approx(1978.9e12 / 3350e9)
    with pytest.raises(InputError) as err:
        roofline(1e12, 1e9, "a100-sxm-80gb", "fp8-e4m3")
    assert err.value.field == "precision"  # A100 has no FP8 tensor cores


# ---- compute and cost (seeds 000 and 001) --------------------------------------------------------------


def test_seed001_compute_pf_days_and_68_days():
    """001: 6 × 405B × 15.6T = 3.79e25 FLOPs = ~439K petaFLOP-days; 16,384 H100s at 989 TFLOP/s and
    40% MFU: ~68 days (67.7)."""
    r = cost(16384, params=405e9, tokens=15.6e12, mfu=0.40)
    assert r.data["flops"] == pytest.approx(3.7908e25, rel=1e-12)
    assert r.data["pf_days"] == pytest.approx(438_750, rel=1e-12)
    assert r.data["days"] == pytest.approx(67.67, abs=0.01)


def test_seed001_implied_mfu_is_50_not_48_percent():
    """001: 'Meta reported ~54 days for pre-training (implying ~48% MFU)': 3.79e25 FLOPs on 16,384 ×
    989.4 TFLOP/s over 54 days is 50.1%, not 48% (the same as 40% × 67.7/54)."""
    r = cost(16384, params=405e9, tokens=15.6e12, seconds=54 * DAY)
    assert r.data["implied_mfu"] == pytest.approx(0.501, abs=1e-3)
    assert implied_mfu(training_flops(405e9, 15.6e12), 16384, 989.4e12, 54 * DAY) == pytest.approx(0.40 * 67.665 / 54, rel=1e-4)


def test_seed000_34_days_uses_the_sparse_peak():
    """000: 'Effective FLOPS = 16384 × 1979e12 × 0.40 ≈ 1.3e19 … ≈ 34 days': 1,979 TFLOP/s is H100's
    2:4-sparse figure; at the dense 989.4 the same 40% MFU takes 67.7 days. Likewise its MFU example
    (1M tokens in 0.3 s) is 50%, not 25%."""
    C = training_flops(405e9, 15.6e12)
    assert C / (16384 * 1979e12 * 0.40) / DAY == pytest.approx(33.8, abs=0.1)  # the seed's figure
    assert cost(16384, params=405e9, tokens=15.6e12, mfu=0.40).data["days"] == pytest.approx(67.7, abs=0.05)
    step = 6 * 405e9 * 1e6
    assert step / (16384 * 1979e12 * 0.3) == pytest.approx(0.25, abs=0.001)
    assert implied_mfu(step, 16384, 989.4e12, 0.3) == pytest.approx(0.4997, abs=1e-3)


def test_seed001_electricity_and_gpu_cost():
    """001: 16,384 GPUs × 700 W × 77 days at $0.05/kWh: '~$1.06 million' (21.19 GWh); with PUE 1.4
    '~$1.5M' ($1.48M); '$2/GPU-hr × 16384 × 77 × 24 ≈ $60.5M'. The closing 'every 1% improvement in
    MFU saves ~$600K' is 1% of the GPU bill, i.e. a 1% *relative* gain; one MFU point from 40% to
    41% shortens the run by 1/41 and saves $1.48M."""
    r = cost(16384, seconds=77 * DAY, price=2.0, kwh_price=0.05)
    assert r.data["energy_kwh"] == pytest.approx(21_194_342.4, rel=1e-12)
    assert r.data["energy_dollars"] == pytest.approx(1_059_717, abs=1)
    assert r.data["gpu_dollars"] == pytest.approx(60_555_264, rel=1e-12)
    pue = cost(16384, seconds=77 * DAY, kwh_price=0.05, pue=1.4)
    assert pue.data["energy_dollars"] == pytest.approx(1_483_604, abs=1)
    assert 0.01 * r.data["gpu_dollars"] == pytest.approx(605_553, abs=1)
    assert r.data["gpu_dollars"] * (1 - 40 / 41) == pytest.approx(1_476_958, abs=1)


@pytest.mark.parametrize("kw,field", [
    (dict(gpus=0, seconds=DAY), "gpus"), (dict(gpus=8), "days"), (dict(gpus=8, seconds=-1.0), "days"),
    (dict(gpus=8, params=1e9, tokens=1e12, mfu=1.5), "mfu"), (dict(gpus=8, seconds=DAY, pue=0.9), "pue"),
    (dict(gpus=8, seconds=DAY, dtype="fp4"), "dtype"), (dict(gpus=8, params=1e9, mfu=0.4), "tokens"),
])
def test_bad_input(kw, field):
    with pytest.raises(InputError) as err:
        cost(**kw)
    assert err.value.field == field
    with pytest.raises(InputError) as err:
        gemm_roofline("4096x0x4096")
    assert err.value.field == "gemm"
