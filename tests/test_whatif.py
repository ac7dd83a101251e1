"""What-if and sensitivity of ``meshplan estimate``: ``--vs FIELD=VALUE`` beside the baseline,
``--sensitivity`` (elasticities of the step to the hardware, ``--out`` a tornado chart), and
``meshplan search --vs``.

Every figure is the engine's own: an alternative is checked against ``meshplan estimate`` with the
flags it names, an elasticity against the estimates it comes from, and the elasticities together
against the scale identity of the model (meshplan.sensitivity's docstring)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import xml.etree.ElementTree as ET

import pytest

from meshplan.cli.app import main
from meshplan.cli.options import PlanArgs, resolve
from meshplan.cli.whatif import alternatives, split_fields, vs_entries
from meshplan.cost import calibration
from meshplan.errors import InputError
from meshplan.estimate import estimate
from meshplan.sensitivity import DELTA, FACTORED, central, scale_hardware, scaled, sensitivity

PRESET = ("--preset", "llama3-405b-16k")


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def run_json(*args: str) -> dict:
    code, out, err = run_cli("estimate", "--json", "--no-advice", *args)
    assert (code, err) == (0, ""), err
    return json.loads(out)


@pytest.fixture(scope="module")
def preset_vs() -> dict:
    """The 405B preset with one alternative and the sensitivity, in one JSON object."""
    return run_json(*PRESET, "--price", "2", "--vs", "nic_gbps=100", "--sensitivity")


def setup_of(**kw):
    s = resolve(PlanArgs(**kw))
    return s, estimate(s.model, s.cluster, s.plan, s.budget)


def step_on(s, cluster) -> float:
    return estimate(s.model, cluster, s.plan, s.budget).time.step_s


# ---- --vs ----------------------------------------------------------------------------------------


def test_vs_nic_is_the_estimate_with_its_flag(preset_vs):
    """The alternative is exactly `estimate --nic-gbps 100` on the preset; its deltas are the
    differences and ratios of the two; the faster NIC does not slow the step nor change memory."""
    base, (alt,) = preset_vs, preset_vs["vs"]
    assert alt["vs"] == "nic_gbps=100" and alt["fields"] == {"nic_gbps": 100.0} and alt["flags"] == ["--nic-gbps", "100"]
    direct = run_json(*PRESET, "--price", "2", "--nic-gbps", "100")
    assert alt["step_s"] == direct["time"]["step_s"] and alt["step_s_interval"] == direct["time"]["step_s_interval"]
    assert alt["mfu"] == direct["throughput"]["mfu"] and alt["tokens_per_s"] == direct["throughput"]["tokens_per_s"]
    assert alt["peak_bytes"] == direct["memory"]["peak_bytes"] and alt["fits"] is direct["memory"]["fits"]
    assert alt["days"] == direct["run"]["days"] and alt["dollars"] == direct["run"]["dollars"]
    assert alt["dollars_interval"] == direct["run"]["dollars_interval"]
    t0, t1 = base["time"]["step_s"], alt["step_s"]
    assert alt["delta"]["step_s"] == t1 - t0 and alt["change"]["step_s"] == t1 / t0 - 1
    assert alt["delta"]["mfu"] == alt["mfu"] - base["throughput"]["mfu"]
    assert t1 < t0 and alt["delta"]["peak_bytes"] == 0.0
    # days are steps x step time at the same tokens and batch: they change as the step does
    assert alt["change"]["days"] == pytest.approx(alt["change"]["step_s"], rel=1e-12)
    assert alt["change"]["tokens_per_s"] == pytest.approx(t0 / t1 - 1, rel=1e-12)


@pytest.mark.parametrize("vs", ["tp=4,cp=2", "zero=1", "sequence_parallel=off", "kernels=eager", "gpus=8192",
                                "global_batch_tokens=8M", "gpu=b200", "gpu_power=500"])
def test_vs_flags_reproduce_the_alternative(vs):
    """Each alternative's ``flags`` added to the baseline's options give its step and memory."""
    d = run_json(*PRESET, "--vs", vs)
    (alt,) = d["vs"]
    direct = run_json(*PRESET, *alt["flags"])
    assert (alt["step_s"], alt["peak_bytes"]) == (direct["time"]["step_s"], direct["memory"]["peak_bytes"])
    assert alt["num_gpus"] == direct["cluster"]["num_gpus"]


def test_vs_gpus_and_dp_replace_each_other():
    """gpus=8192 on the preset (whose plan gives dp) keeps tp·cp·pp = 128: dp 64."""
    (alt,) = run_json(*PRESET, "--vs", "gpus=8192")["vs"]
    assert alt["num_gpus"] == 8192 and alt["layout"] == f"TP8 CP1 PP16 DP{8192 // (8 * 16)}"
    (alt,) = run_json("--gpus", "16", "--vs", "dp=4")["vs"]
    assert alt["num_gpus"] == 4


def test_vs_gpu_figures_are_a_gpu_file(tmp_path):
    """A GPU figure in --vs is the same GPU as a GPU file with base: the baseline's GPU."""
    f = tmp_path / "fast-hbm.yaml"
    f.write_text("base: h100-sxm-80gb\nhbm_gbps: 4000\nscale_up_gbps: 900\n")
    (alt,) = run_json(*PRESET, "--vs", "hbm_gbps=4000,scale_up_gbps=900")["vs"]
    direct = run_json(*PRESET, "--gpu", str(f))
    assert (alt["step_s"], alt["peak_bytes"]) == (direct["time"]["step_s"], direct["memory"]["peak_bytes"])
    assert alt["flags"] == [] and alt["fields"] == {"hbm_gbps": 4000, "scale_up_gbps": 900}


def test_vs_peak_is_the_sensitivitys_scaled_peak(preset_vs):
    """peak_tflops=X sets the bf16 peak and every other dtype's in proportion: at 1.1 x 989.4 it is
    the sensitivity's step at a 10 % faster peak; an fp8 peak alone leaves a bf16 plan as it is."""
    row = next(r for r in preset_vs["sensitivity"] if r["parameter"] == "peak_flops")
    d = run_json(*PRESET, "--vs", f"peak_tflops={989.4 * (1 + DELTA)!r}", "--vs", "peak_tflops.fp8=3000")
    faster, fp8 = d["vs"]
    assert faster["step_s"] == pytest.approx(row["step_s_plus"], rel=1e-12)
    assert fp8["step_s"] == d["time"]["step_s"]


def test_vs_commas_join_fields_and_keep_list_values():
    assert split_fields("rank_order=tp,cp,pp,dp,tp=4") == [("rank_order", "tp,cp,pp,dp"), ("tp", "4")]
    assert split_fields("global-batch=512, micro_batch=2") == [("global_batch", "512"), ("micro_batch", "2")]
    d = run_json(*PRESET, "--vs", "pp=8,vpp=16", "--vs", "zero=1")
    assert [a["vs"] for a in d["vs"]] == ["pp=8,vpp=16", "zero=1"]
    assert d["vs"][0]["layout"] == "TP8 CP1 PP8 DP256" and d["vs"][0]["pipeline"] == "interleaved v16"


@pytest.mark.parametrize("vs, words", [
    ("foo=1", "--vs: unknown field 'foo' (plan options: model, gpu,"),
    ("nic_gbps=abc", "--vs: nic_gbps: must be a finite number (got 'abc')"),
    ("zero=5", "--vs: zero: must be one of 0, 1, 2, 3 (got '5')"),
    ("tp=3", "--vs: 'tp=3': tp: tp (3) must divide the number of attention heads (128)"),
    ("hbm_gbps=-1", "--vs: 'hbm_gbps=-1': gpu.hbm_gbps: must be a positive number (got -1)"),
    ("peak_tflops.fp4=9", "--vs: 'peak_tflops.fp4=9': gpu.peak_tflops.fp4: unknown dtype"),
    ("tp", "--vs: must be FIELD=VALUE"),
    ("tp=4,tp=2", "--vs: tp is given twice in 'tp=4,tp=2'"),
])
def test_vs_errors_are_one_line(vs, words):
    code, out, err = run_cli("estimate", *PRESET, "--vs", vs)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"error: {words}")


def test_vs_text_puts_both_side_by_side(preset_vs):
    code, out, err = run_cli("estimate", *PRESET, "--price", "2", "--vs", "nic_gbps=100")
    assert code == 0 and err == ""
    text = " ".join(out.split())
    (alt,) = preset_vs["vs"]
    assert "What if" in text and "nic_gbps=100" in text
    assert f"step (s) {preset_vs['time']['step_s']:.3f} {alt['step_s']:.3f} {100 * alt['change']['step_s']:+.1f}%" in text
    assert f"cost ($M) {preset_vs['run']['dollars'] / 1e6:,.2f} {alt['dollars'] / 1e6:,.2f}" in text


def test_vs_text_keeps_the_other_options():
    """--unit sets the memory unit of the comparison; the failure options are checked as without --vs."""
    (alt,) = run_json("--vs", "zero=3")["vs"]
    code, out, _ = run_cli("estimate", "--vs", "zero=3", "--unit", "GB")
    assert code == 0 and "peak memory (GB)" in out and f"{alt['peak_bytes'] / 1e9:.2f}" in out
    code, out, err = run_cli("estimate", "--vs", "zero=3", "--mtbf", "x")
    assert code == 2 and out == "" and err.startswith("error: mtbf: ")


# ---- --sensitivity -------------------------------------------------------------------------------


def test_sensitivity_rows_are_their_own_central_differences(preset_vs):
    rows = preset_vs["sensitivity"]
    assert sorted(r["parameter"] for r in rows) == sorted((*FACTORED, "gpus"))
    assert [abs(r["elasticity"]) for r in rows] == sorted((abs(r["elasticity"]) for r in rows), reverse=True)
    for r in rows:
        assert r["elasticity"] == central(r["step_s_minus"], r["step_s_plus"], r["factor_minus"], r["factor_plus"])
        if r["parameter"] != "gpus":
            assert (r["factor_minus"], r["factor_plus"]) == (1 - DELTA, 1 + DELTA)
    # a faster rate never slows the step; a longer latency never speeds it
    for r in rows:
        sign = 1 if r["parameter"] == "latency" else -1
        assert sign * (r["step_s_plus"] - r["step_s_minus"]) >= 0


def test_sensitivity_points_are_the_estimates_of_the_options(preset_vs):
    """The NIC row's steps are `estimate --nic-gbps 45` and `55`; the GPU row's are `--gpus` at the
    nearest data-parallel sizes dividing the 2,048-sequence batch around dp 128: 64 and 256."""
    rows = {r["parameter"]: r for r in preset_vs["sensitivity"]}
    nic = rows["scale_out_bandwidth"]
    assert nic["step_s_minus"] == pytest.approx(run_json(*PRESET, "--nic-gbps", "45")["time"]["step_s"], rel=1e-12)
    assert nic["step_s_plus"] == pytest.approx(run_json(*PRESET, "--nic-gbps", "55")["time"]["step_s"], rel=1e-12)
    gpus = rows["gpus"]
    inner = 8 * 1 * 16
    assert (gpus["gpus_minus"], gpus["gpus_plus"]) == (inner * 64, inner * 256)
    for n, t in ((gpus["gpus_minus"], gpus["step_s_minus"]), (gpus["gpus_plus"], gpus["step_s_plus"])):
        assert t == run_json(*PRESET, "--gpus", str(n))["time"]["step_s"]
    assert gpus["step_s_minus"] > preset_vs["time"]["step_s"] > gpus["step_s_plus"]


@pytest.fixture
def overhead(monkeypatch):
    """Set the calibration's fixed costs of a generation, its per-kernel overhead t_k and the
    collectives' per-call latency α₀, to ``factor`` times their own (the times no hardware figure
    sets)."""
    own = dict(calibration.CALIBRATIONS)

    def set_(generation: str, factor: float) -> None:
        cal = own[generation]
        monkeypatch.setitem(calibration.CALIBRATIONS, generation, dataclasses.replace(
            cal, kernel_overhead=cal.kernel_overhead * factor, collective_base_latency=cal.collective_base_latency * factor))
    return set_


@pytest.mark.parametrize("kw", [dict(preset="llama3-405b-16k"), dict(), dict(gpus=1, global_batch=2)])
def test_scaling_all_hardware_scales_the_step_exactly(kw, overhead):
    """Every rate x2 and every latency /2 halve the step, bit for bit, once the per-kernel overhead
    and the collectives' per-call latency are halved too; with them as they are the step lies
    strictly between t/2 and t."""
    s, est = setup_of(**kw)
    t = est.time.step_s
    fast = scale_hardware(s.cluster, 2.0)
    assert t / 2 < step_on(s, fast) < t
    overhead("hopper", 0.5)
    assert step_on(s, fast) == t / 2


def _overhead_elasticity(s, overhead, delta: float = DELTA) -> float:
    steps = []
    for f in (1 - delta, 1 + delta):
        overhead("hopper", f)
        steps.append(step_on(s, s.cluster))
    overhead("hopper", 1.0)
    return central(steps[0], steps[1], 1 - delta, 1 + delta)


@pytest.mark.parametrize("kw", [dict(preset="llama3-405b-16k"), dict(gpus=1, global_batch=2)])
def test_elasticities_obey_the_scale_identity(kw, overhead):
    """e_F + e_W + e_up + e_out − e_α − e_tk = −1 (Euler's theorem on the model's scale identity)
    for exact derivatives; central differences at ±δ miss it by O(δ²): under δ²/2 at δ = 10 %
    (what the command uses), 1 % and 0.1 %."""
    s, est = setup_of(**kw)
    for delta in (DELTA, 1e-2, 1e-3):
        e = {r.parameter: r.elasticity for r in sensitivity(est, delta)}
        total = e["peak_flops"] + e["hbm_bandwidth"] + e["scale_up_bandwidth"] + e["scale_out_bandwidth"] - e["latency"]
        assert abs(total - _overhead_elasticity(s, overhead, delta) + 1.0) < delta**2 / 2


def test_one_gpu_moves_with_its_compute_side_only(overhead):
    """On one GPU no collective runs: the network's elasticities are exactly 0 and the compute side
    (peak, HBM, per-kernel overhead) carries the whole −1."""
    s, est = setup_of(gpus=1, global_batch=2)
    rows = {r.parameter: r for r in sensitivity(est)}
    for p in ("scale_up_bandwidth", "scale_out_bandwidth", "latency"):
        assert rows[p].step_s_minus == rows[p].step_s_plus == est.time.step_s and rows[p].elasticity == 0.0
    compute_side = rows["peak_flops"].elasticity + rows["hbm_bandwidth"].elasticity - _overhead_elasticity(s, overhead)
    assert abs(compute_side + 1.0) < DELTA**2 / 2
    # one GPU has no fewer: one-sided from the baseline to the next count (2 GPUs, dp 2)
    g = rows["gpus"]
    assert g.gpus_minus is None and g.step_s_minus is None and g.gpus_plus == 2
    assert g.elasticity == central(est.time.step_s, g.step_s_plus, 1, 2)


def test_compute_bound_plan_has_peak_elasticity_minus_one(overhead):
    """Made compute-bound (HBM a million times faster, no per-kernel overhead, one GPU), the step is
    FLOPs over the peak: e_F = −1 to the rounding of the memory-bound remainder."""
    s, _ = setup_of(model="llama3-70b", gpus=1, global_batch=1, seq_len=8192)
    overhead("hopper", 0.0)
    cluster = scaled(s.cluster, "hbm_bandwidth", 1e6)
    est = estimate(s.model, cluster, s.plan, s.budget)
    rows = {r.parameter: r.elasticity for r in sensitivity(est)}
    assert rows["peak_flops"] == pytest.approx(-1.0, abs=1e-5)
    assert abs(rows["hbm_bandwidth"]) < 1e-5 and rows["gpus"] is None  # a batch of one sequence: no other count


def test_sensitivity_text_and_tornado(tmp_path, preset_vs):
    path = tmp_path / "tornado.svg"
    code, out, err = run_cli("estimate", *PRESET, "--sensitivity", "--out", str(path))
    assert code == 0 and err == ""
    text = " ".join(out.split())
    rows = preset_vs["sensitivity"]
    assert "Sensitivity of the step" in text
    lines = [ln for ln in out.splitlines() if any(r["label"] in ln for r in rows)]
    assert [next(r["label"] for r in rows if r["label"] in ln) for ln in lines] == [r["label"] for r in rows]
    assert f"{rows[0]['elasticity']:+.3f}" in lines[0]
    svg = ET.parse(path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    bars = [r for r in svg.iter(f"{ns}rect") if r.get("class") == "bar"]
    assert len(bars) == 2 * len(rows)
    words = " ".join(t.text or "" for t in svg.iter(f"{ns}text"))
    assert all(r["label"] in words for r in rows) and f"e = {rows[0]['elasticity']:+.3f}" in words
    # never over a file, only .svg, only with --sensitivity
    assert run_cli("estimate", "--sensitivity", "--out", str(path))[0] == 2
    code, _, err = run_cli("estimate", "--sensitivity", "--out", str(tmp_path / "t.png"))
    assert code == 2 and "must be a .svg file" in err
    code, _, err = run_cli("estimate", "--out", str(tmp_path / "t.svg"))
    assert code == 2 and err.startswith("error: out: draws the sensitivity's tornado chart")


# ---- search --vs ---------------------------------------------------------------------------------


def test_search_vs_reports_whether_the_best_plan_changes():
    """Within one node the NIC carries nothing: the best plan and its step stay; a B200 is faster."""
    code, out, err = run_cli("search", "--model", "llama3-8b", "--gpus", "8", "--top", "1", "--json",
                             "--vs", "nic_gbps=100", "--vs", "gpu=b200")
    assert code == 0 and err == ""
    d = json.loads(out)
    nic, b200 = d["vs"]
    assert nic["changed"] is False and nic["best"] == nic["baseline_best"]
    assert nic["baseline_best"]["step_s"] == d["top"][0]["time"]["step_s"]
    assert b200["best"]["gpu"] == "b200" and b200["best"]["step_s"] < b200["baseline_best"]["step_s"]
    code, _, err = run_cli("search", "--model", "llama3-8b", "--gpus", "8", "--vs", "tp=2", "--stacks", "torchtitan")
    assert code == 2 and err.startswith("error: --vs: ")


def test_schema_doc_lists_the_new_keys(preset_vs):
    from test_cli import _schema_keys

    documented = _schema_keys()
    (alt,) = preset_vs["vs"]
    keys = ["vs", "sensitivity"] + [f"vs[].{k}" for k in alt] + [f"sensitivity[].{k}" for r in preset_vs["sensitivity"] for k in r]
    code, out, _ = run_cli("search", "--model", "llama3-8b", "--gpus", "8", "--top", "1", "--json", "--vs", "zero=3")
    assert code == 0
    keys += [f"vs[].{k}" for k in json.loads(out)["vs"][0]]
    assert sorted({k for k in keys if k not in documented}) == []


@pytest.mark.parametrize("field", ["tp", "gpus", "nic_gbps", "hbm_gbps", "peak_tflops", "peak_tflops.fp8", "zero", "kernels",
                                   "global_batch_tokens", "tokens", "sequence_parallel", "sm_count", "generation", "gpu_power"])
def test_vs_hostile_values_keep_the_error_contract(field):
    """Every value of the CLI fuzz's hostile list gives an alternative whose figures are finite
    (JSON refuses the others) or one ``--vs`` error on one line, what the CLI prints as
    ``error: --vs: ...`` with exit status 2 (test_vs_errors_are_one_line)."""
    from test_fuzz import HOSTILE

    args = PlanArgs()
    s = resolve(args)
    est = estimate(s.model, s.cluster, s.plan, s.budget)
    for value in HOSTILE:
        try:
            _, entries = vs_entries(est, alternatives(args, [f"{field}={value}"]), 0.8)
        except InputError as err:
            assert err.field == "--vs" and "\n" not in str(err), (value, str(err))
            continue
        json.dumps(entries, allow_nan=False)
