"""``calc formats`` and ``calc loss-scale``: formats from their bit layout, cross-checked against
numpy (float16, float32), torch and ml_dtypes (bf16, fp8) when importable, and against exact
bit-layout arithmetic always; rounding; FP8 activation memory; GradScaler's scale walk."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshplan.calc.formats import FORMATS, decode, formats, get_format, parse_elements, round_to, tensor_bytes
from meshplan.calc.loss_scale import ScalerConfig, loss_scale, parse_flags, synthetic, walk
from meshplan.errors import InputError

GB = 1e9


# ---- the formats' figures -------------------------------------------------------------------------


def test_seed001_fp16_range():
    """001: 'FP16 has 5 exponent bits with bias 15. The smallest positive normal number is
    2^(1−15) = 2^−14' = 6.1e-5; 'a range of roughly 6 × 10^−8 to 65504'."""
    f = get_format("fp16")
    assert (f.exp_bits, f.man_bits, f.bias) == (5, 10, 15)
    assert f.min_normal == 2.0**-14 and f"{f.min_normal:.1e}" == "6.1e-05"
    assert f.min_subnormal == 2.0**-24 and f"{f.min_subnormal:.0e}" == "6e-08"
    assert f.max == 65504.0


def test_seed001_fp8_formats():
    """001: e4m3 has 3 mantissa bits, '8 representable fractions per exponent'; e5m2's '5 exponent
    bits = range up to 57344'. e4m3 (OCP 'fn') has no infinities: its largest value is 448."""
    e4, e5 = get_format("e4m3"), get_format("e5m2")
    assert 2**e4.man_bits == 8
    assert e5.max == 57344.0 and e4.max == 448.0
    assert (e4.bias, e5.bias) == (7, 15)
    assert not e4.has_inf and e5.has_inf


@pytest.mark.parametrize("name,exp,man,max_,eps", [
    ("fp32", 8, 23, 3.4028234663852886e38, 2**-23), ("tf32", 8, 10, (2 - 2**-10) * 2**127, 2**-10),
    ("bf16", 8, 7, 3.3895313892515355e38, 2**-7), ("fp16", 5, 10, 65504.0, 2**-10),
    ("fp8-e4m3", 4, 3, 448.0, 0.125), ("fp8-e5m2", 5, 2, 57344.0, 0.25),
])
def test_layout_figures(name, exp, man, max_, eps):
    f = FORMATS[name]
    assert (f.exp_bits, f.man_bits) == (exp, man)
    assert f.max == max_ and f.eps == eps
    assert f.decimal_digits == pytest.approx((man + 1) * math.log10(2))


def _all_values(f) -> np.ndarray:
    return np.array([decode(b, f) for b in range(2**f.bits)])


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp8-e4m3", "fp8-e5m2"])
def test_figures_equal_the_extremes_of_every_bit_pattern(name):
    """The closed forms against all 2^bits values decoded from the bit layout."""
    f = FORMATS[name]
    v = _all_values(f)
    finite = v[np.isfinite(v)]
    assert finite.max() == f.max and finite.min() == -f.max
    pos = finite[finite > 0]
    assert pos.min() == f.min_subnormal
    assert pos[pos >= f.min_normal].min() == f.min_normal
    above_one = pos[pos > 1]
    assert above_one.min() - 1 == f.eps
    assert np.isinf(v).sum() == (2 if f.has_inf else 0)
    nans = int(np.isnan(v).sum())
    assert nans == (2 if name == "fp8-e4m3" else 2 * (2**f.man_bits - 1))


def test_numpy_float16_and_float32():
    for name, dt in (("fp16", np.float16), ("fp32", np.float32)):
        fi, f = np.finfo(dt), FORMATS[name]
        assert (float(fi.max), float(fi.smallest_normal), float(fi.smallest_subnormal), float(fi.eps)) == (
            f.max, f.min_normal, f.min_subnormal, f.eps)
        assert (fi.nexp, fi.nmant) == (f.exp_bits, f.man_bits)
    bits = np.arange(2**16, dtype=np.uint16)
    ref = bits.view(np.float16).astype(np.float64)
    assert np.array_equal(_all_values(FORMATS["fp16"]), ref, equal_nan=True)
    # bf16 is the upper half of a float32: decode every pattern through numpy
    with np.errstate(invalid="ignore"):
        ref_bf16 = (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert np.array_equal(_all_values(FORMATS["bf16"]), ref_bf16, equal_nan=True)


def test_torch_finfo_and_casts():
    torch = pytest.importorskip("torch")
    pairs = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
             "fp8-e4m3": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2}
    for name, dt in pairs.items():
        fi, f = torch.finfo(dt), FORMATS[name]
        assert (fi.max, fi.smallest_normal, fi.eps, fi.bits) == (f.max, f.min_normal, f.eps, f.bits)
    for name in ("fp8-e4m3", "fp8-e5m2"):
        ref = torch.arange(256, dtype=torch.uint8).view(pairs[name]).to(torch.float64).numpy()
        assert np.array_equal(_all_values(FORMATS[name]), ref, equal_nan=True)
    # rounding float32 inputs (single rounding) agrees with torch's casts; torch saturates e4m3
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4000) * np.exp(rng.uniform(-30, 14, 4000))).astype(np.float32)
    for name in ("bf16", "fp8-e4m3", "fp8-e5m2"):
        xs = x if name == "bf16" else (x / 100).astype(np.float32)
        got = np.array([round_to(float(v), FORMATS[name], saturate=True) for v in xs])
        ref = torch.from_numpy(xs).to(pairs[name]).to(torch.float64).numpy()
        assert np.array_equal(got, ref, equal_nan=True), name


def test_ml_dtypes_when_installed():
    ml = pytest.importorskip("ml_dtypes")
    for name, dt in (("bf16", ml.bfloat16), ("fp8-e4m3", ml.float8_e4m3fn), ("fp8-e5m2", ml.float8_e5m2)):
        fi, f = ml.finfo(dt), FORMATS[name]
        assert (float(fi.max), float(fi.smallest_normal), float(fi.smallest_subnormal), float(fi.eps)) == (
            f.max, f.min_normal, f.min_subnormal, f.eps)


def test_rounding_matches_numpy_float16():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(5000) * np.exp(rng.uniform(-25, 12, 5000))
    x = np.concatenate([x, [65519.99, 65520.0, 65536.0, 2.0**-25, 3 * 2.0**-25, 2.0**-26, 1 + 2**-11, 1 + 3 * 2**-11]])
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).astype(np.float64)
    got = np.array([round_to(float(v), FORMATS["fp16"]) for v in x])
    assert np.array_equal(got, ref)


def test_e4m3_overflow_is_nan_unless_saturating():
    f = FORMATS["fp8-e4m3"]
    assert round_to(460.0, f) == 448.0  # below the rounding boundary 464
    assert math.isnan(round_to(500.0, f)) and round_to(500.0, f, saturate=True) == 448.0
    assert round_to(1e6, FORMATS["fp8-e5m2"]) == math.inf


# ---- FP8 activation memory (seed 001) --------------------------------------------------------------------


def test_seed001_fp8_activation_saving_is_21_5GB_not_172():
    """001: 70B, sequence 4096, batch 4, 80 layers, each layer storing ~2 × b × s × d values
    (d = 8192): FP16 vs FP8 activations. 2·4·4096·8192·80 = 21.5 G values: 42.9 GB in FP16, 21.5
    GB in FP8, a saving of 21.5 GB (20 GiB). The seed's '172 GB saved … more than 2 full
    A100-80GB GPUs' counts bits as bytes (16 and 8 per value: 343.6 vs 171.8 'GB'): the saving is
    8x smaller, about a quarter of one 80 GB GPU."""
    n = parse_elements("2x4x4096x8192x80")
    assert n == 2 * 4 * 4096 * 8192 * 80
    fp16, fp8 = tensor_bytes(n, FORMATS["fp16"]), tensor_bytes(n, FORMATS["fp8-e4m3"])
    assert fp16 / GB == pytest.approx(42.95, abs=0.01) and fp8 / GB == pytest.approx(21.47, abs=0.01)
    assert (fp16 - fp8) == 20 * 2**30
    assert (16 - 8) * n / GB == pytest.approx(171.8, abs=0.1)  # the seed's bits-as-bytes figure
    r = formats(["fp16", "e4m3"], elements=n)
    assert [row["tensor_bytes"] for row in r.data["formats"]] == [fp16, fp8]


# ---- loss scaling -------------------------------------------------------------------------------------


def test_seed001_loss_scale_walk_to_16384():
    """001: 'S = 16384 = 2^14. Each overflow halves S. Doubling requires W = 2000 consecutive good
    steps, so it never triggers here': from GradScaler's initial 2^16, two overflows within the
    first 2,000 steps leave 2^14."""
    w = walk(parse_flags("steps=100:10,50"))
    assert w.final_scale == 16384.0 == 2.0**14
    assert (w.skipped, w.growths) == (2, 0)
    assert w.scales[10] == 65536 and w.scales[11] == 32768 and w.scales[51] == 16384


def test_growth_after_interval_and_reset_on_overflow():
    cfg = ScalerConfig(init_scale=8.0, growth_interval=3)
    w = walk([False, False, False, False, True, False, False, False], cfg)
    assert list(w.scales) == [8, 8, 8, 16, 16, 8, 8, 8]
    assert w.final_scale == 16.0 and w.growths == 2


def test_walk_matches_torch_amp_update_scale():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    flags = rng.random(400) < 0.03
    cfg = ScalerConfig(init_scale=2.0**16, growth_interval=17)
    scale, tracker = torch.tensor([cfg.init_scale]), torch.tensor([0], dtype=torch.int32)
    ours = walk(flags, cfg)
    for i, bad in enumerate(flags):
        assert scale.item() == ours.scales[i]
        torch._amp_update_scale_(scale, tracker, torch.tensor([float(bad)]), cfg.growth_factor, cfg.backoff_factor, cfg.growth_interval)
    assert scale.item() == ours.final_scale


def test_synthetic_gradients_find_a_stable_scale():
    """Spikes overflow fp16 at 2^16; the scale backs off until typical gradients fit, and bf16
    (fp32's range) never overflows."""
    w, under, flags = synthetic(3000, per_step=200, median=0.1, sigma=1.0, spike_prob=0.0, spike_factor=1.0)
    assert w.skipped > 0 and w.final_scale < 2.0**16
    assert not flags[-500:].any()
    wb, _, _ = synthetic(3000, per_step=200, median=0.1, sigma=1.0, spike_prob=0.0, spike_factor=1.0, fmt="bf16")
    assert wb.skipped == 0 and wb.growths == 1
    assert 0.0 <= under <= 1.0
    r = loss_scale(None, synthetic_args=dict(steps=1000, per_step=100))
    assert r.data["steps"] == 1000 and "underflow_fraction" in r.data


@pytest.mark.parametrize("call,field", [
    (lambda: get_format("fp7"), "format"), (lambda: parse_elements("4x0"), "elements"),
    (lambda: parse_flags("01a"), "overflow"), (lambda: parse_flags("steps=10:12"), "overflow"),
    (lambda: walk([True], ScalerConfig(growth_factor=0.5)), "growth_factor"),
    (lambda: walk([True], ScalerConfig(backoff_factor=1.5)), "backoff_factor"),
    (lambda: walk([True], ScalerConfig(init_scale=0.0)), "init_scale"),
    (lambda: loss_scale([]), "overflow"),
])
def test_bad_input(call, field):
    with pytest.raises(InputError) as err:
        call()
    assert err.value.field == field
