"""The ``meshplan`` command line: the JSON contract of ``estimate --json``, how options become a
plan (dp derivation, batch, presets), the human tables, ``explain``, and the catalogs.

The CLI runs in-process through ``main(argv)`` (the function the ``meshplan`` script calls), and
once as a real subprocess. Expected numbers come from the library called directly with the same
plan, or from arithmetic on the flags.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.accuracy.interval import estimate_interval
from meshplan.estimate_report import add_interval

from meshplan.advice import advise
from meshplan.calc.run_length import for_estimate
from meshplan.catalog import gpu_names, load_gpu, load_model, model_names
from meshplan.cli.app import main
from meshplan.cost.params import count_params
from meshplan.estimate import Budget, estimate
from meshplan.specs import ClusterSpec, TrainingPlan

ROOT = Path(__file__).resolve().parents[1]
HF_LLAMA = ROOT / "tests" / "data" / "hf" / "Llama-3.1-8B" / "config.json"
CUSTOM_YAML = ROOT / "tests" / "data" / "models" / "custom.yaml"

MODELS = ["llama3-8b", "llama3-70b", "llama3-405b", "llama2-7b", "llama2-13b", "llama2-70b", "gpt3-175b"]
GPUS = ["a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm-80gb", "h800-sxm-80gb", "h200-sxm-141gb", "b200", "mi300x"]


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def run_json(*args: str, whole: bool = False) -> dict:
    """``estimate --json``'s object; unless ``whole``, without the CLI's own additions to the
    library's ``Estimate.to_dict()`` (:mod:`meshplan.estimate_report`): ``advice``,
    ``run.failures`` and the step time's interval with the ranges that follow from it
    (tests/test_advice.py, tests/test_run_length.py, tests/test_estimate_interval.py, and
    test_json_equals_the_library_for_the_same_plan below)."""
    code, out, err = run_cli("estimate", "--json", *args)
    assert (code, err) == (0, ""), err
    d = json.loads(out)
    if not whole:
        d.pop("advice")
        for key in ("step_s_interval", "interval_level", "interval_basis"):
            d["time"].pop(key)
        d["throughput"].pop("mfu_interval")
        if d["run"]:
            d["run"].pop("failures", None)
            for key in ("days_interval", "gpu_hours_interval", "dollars_interval"):
                d["run"].pop(key, None)
    return d


def library(model: str, gpus: int, budget: Budget | None = None, cluster_kw: dict | None = None, **plan):
    cluster = ClusterSpec.of(load_gpu(plan.pop("gpu", "h100-sxm-80gb")), gpus, **(cluster_kw or {}))
    return estimate(load_model(model), cluster, TrainingPlan.build(**plan), budget)


def roundtrip(d: dict) -> dict:
    return json.loads(json.dumps(d))


# ---- estimate --json: the contract ----------------------------------------------------------


def test_json_is_one_object_with_the_contract_keys():
    code, out, err = run_cli("estimate", "--json")
    assert code == 0 and err == ""
    assert out.count("\n") == 1 and out.endswith("\n")  # one line, one object, nothing else
    d = json.loads(out)
    assert d["schema_version"] == 1
    assert d["model"]["params_total"] == 8_030_261_248  # llama3-8b, the default model
    for key in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "grad_accum"):
        assert isinstance(d["plan"][key], int), key
    assert d["flops"]["model_per_step"] > 0 and d["flops"]["hardware_per_step"] >= d["flops"]["model_per_step"]
    assert set(d["flops"]["breakdown"]) >= {"dense", "attention"}
    assert d["flops"]["breakdown"]["dense"] + d["flops"]["breakdown"]["attention"] == pytest.approx(d["flops"]["model_per_step"])
    mem = d["memory"]
    assert {"peak_bytes", "capacity_bytes", "fits"} <= set(mem)
    assert mem["capacity_bytes"] == 80 * 2**30
    for st in mem["stages"]:
        parts = [st[k] for k in ("weights", "gradients", "optimizer", "activations", "other")]
        assert st["total"] == pytest.approx(sum(parts))
    assert mem["peak_bytes"] == max(st["total"] for st in mem["stages"])
    assert d["time"]["step_s"] > 0
    assert sum(d["time"]["breakdown"].values()) == pytest.approx(d["time"]["step_s"], rel=1e-9)
    tp = d["throughput"]
    assert {"tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"} <= set(tp)
    assert tp["tokens_per_s"] == pytest.approx(d["plan"]["global_batch_tokens"] / d["time"]["step_s"])
    assert 0 < tp["mfu"] <= tp["hfu"] < 1


def _schema_keys() -> set[str]:
    """The keys docs/schema.md lists in its first column, ``a.{b, c}`` expanded to a.b and a.c."""
    keys: set[str] = set()
    for cell in re.findall(r"^\|([^|]*)\|", (ROOT / "docs" / "schema.md").read_text(), re.M):
        for key in re.findall(r"`([^`]+)`", cell):
            group = re.fullmatch(r"(.*)\.\{(.*)\}", key)
            keys |= {f"{group[1]}.{k.strip()}" for k in group[2].split(",")} if group else {key}
    return keys


def test_schema_doc_lists_every_plan_key():
    d = run_json("--tp", "2", "--tp-comm-overlap", "--set", "tp_overlap_kind=micro-pipeline")
    assert d["plan"]["stack"]["tp_overlap_kind"] == "micro-pipeline"
    assert sorted(f"plan.{k}" for k in d["plan"] if f"plan.{k}" not in _schema_keys()) == []


def test_schema_doc_lists_the_interval_keys():
    d = run_json("--tokens", "1e12", "--price", "2", whole=True)
    keys = [f"time.{k}" for k in ("step_s_interval", "interval_level", "interval_basis")] + [
        "throughput.mfu_interval", "run.days_interval", "run.gpu_hours_interval", "run.dollars_interval"]
    assert all(k.split(".")[1] in d[k.split(".")[0]] for k in keys)
    assert [k for k in keys if k not in _schema_keys()] == []


def test_default_plan():
    """8 GPUs, dp = 8, sequences of 4,096, a 4M-token batch: 1,024 sequences = 128 per DP rank."""
    p = run_json()["plan"]
    assert (p["tp"], p["cp"], p["pp"], p["dp"], p["ep"], p["vpp"]) == (1, 1, 1, 8, 1, 1)
    assert (p["seq_len"], p["micro_batch"], p["global_batch"], p["grad_accum"]) == (4096, 1, 1024, 128)
    assert p["global_batch_tokens"] == 4 * 2**20
    assert (p["schedule"], p["recompute"], p["zero"], p["sequence_parallel"]) == ("1f1b", "none", 1, True)


def test_json_equals_the_library_for_the_same_plan():
    args = ["--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--pp", "4", "--vpp", "2", "--micro-batch", "1",
            "--global-batch", "256", "--seq-len", "4096", "--recompute", "selective", "--zero", "2",
            "--tokens", "2T", "--price", "2.5", "--pue", "1.2", "--nic-gbps", "25", "--rank-order", "tp,cp,pp,dp"]
    d = run_json(*args, whole=True)
    est = library("llama3-70b", 64, Budget(tokens=2e12, price_per_gpu_hour=2.5, pue=1.2),
                  cluster_kw={"nic_bandwidth": 25e9}, tp=8, pp=4, dp=2, vpp=2, schedule="interleaved",
                  micro_batch=1, global_batch=256, seq_len=4096, recompute="selective", zero=2,
                  rank_order=("tp", "cp", "pp", "dp"))
    failures = d["run"].pop("failures")  # the CLI's run with failures (meshplan.calc.run_length)
    tips = d.pop("advice")  # and its advice (meshplan.advice)
    want = est.to_dict()
    add_interval(want, estimate_interval(est))  # the step's prediction interval (meshplan.accuracy.interval)
    assert d == roundtrip(want)
    assert failures == roundtrip(for_estimate(est))
    assert tips == roundtrip([a.to_dict() for a in advise(est.model, est.cluster, est.plan, est, est.budget)])
    assert d["plan"]["schedule"] == "interleaved"  # --vpp 2 selects it
    assert d["run"]["dollars"] == pytest.approx(d["run"]["gpu_hours"] * 2.5)


def test_every_plan_flag_reaches_the_plan():
    d = run_json("--gpus", "32", "--tp", "4", "--cp", "2", "--pp", "2", "--micro-batch", "2", "--global-batch", "64",
                 "--seq-len", "8192", "--recompute", "full", "--no-sequence-parallel", "--zero", "3", "--dp-shard", "1",
                 "--precision", "fp8", "--grad-dtype", "bf16", "--no-master-weights", "--grad-fp32-copy",
                 "--attention", "materialized", "--attention-flops", "full", "--schedule", "gpipe",
                 "--layer-split", "15,17", "--tp-comm-overlap", "--set", "kernels=eager", "--gpus-per-node", "4", "--pod-size", "16",
                 "--oversubscription", "3")
    p, c = d["plan"], d["cluster"]
    assert (p["tp"], p["cp"], p["pp"], p["dp"], p["dp_shard"]) == (4, 2, 2, 2, 1)
    assert (p["micro_batch"], p["global_batch"], p["grad_accum"], p["seq_len"]) == (2, 64, 16, 8192)
    assert (p["recompute"], p["sequence_parallel"], p["zero"], p["schedule"]) == ("full", False, 3, "gpipe")
    assert (p["precision"], p["grad_dtype"], p["master_weights"], p["grad_fp32_copy"]) == ("fp8", "bf16", False, True)
    assert (p["attention"], p["attention_flops"], p["layer_split"]) == ("materialized", "full", [15, 17])
    assert (p["stack"]["kernels"], p["stack"]["tp_comm_overlap"]) == ("eager", True)
    assert (c["num_gpus"], c["gpus_per_node"], c["pod_size"], c["oversubscription"]) == (32, 4, 16, 3.0)


@pytest.mark.parametrize(
    "args, tp, pp, dp, gpus",
    [
        (["--tp", "2", "--pp", "2", "--gpus", "16"], 2, 2, 4, 16),  # dp = gpus / (tp·cp·pp)
        (["--tp", "8", "--dp", "2"], 8, 1, 2, 16),  # gpus = tp·cp·pp·dp
        (["--tp", "2"], 2, 1, 4, 8),  # neither: 8 GPUs
        (["--tp", "2", "--cp", "2", "--pp", "2", "--dp", "3"], 2, 2, 3, 24),
    ],
)
def test_dp_and_gpu_derivation(args, tp, pp, dp, gpus):
    d = run_json(*args)
    assert (d["plan"]["tp"], d["plan"]["pp"], d["plan"]["dp"], d["cluster"]["num_gpus"]) == (tp, pp, dp, gpus)
    assert d["plan"]["tp"] * d["plan"]["cp"] * d["plan"]["pp"] * d["plan"]["dp"] == d["cluster"]["num_gpus"]


def test_global_batch_tokens_16M_is_16_mebi_tokens():
    d = run_json("--global-batch-tokens", "16M", "--seq-len", "8192")
    assert d["plan"]["global_batch"] == 2048 and d["plan"]["global_batch_tokens"] == 16 * 2**20
    assert d["plan"]["grad_accum"] == 2048 // 8
    assert run_json("--global-batch-tokens", "4194304")["plan"]["global_batch"] == 1024


def test_default_global_batch_rule():
    # 4,194,304 / (8,192 · 2 · 4) = 64 micro-batches per DP rank
    p = run_json("--gpus", "16", "--tp", "4", "--seq-len", "8192", "--micro-batch", "2")["plan"]
    assert (p["dp"], p["grad_accum"], p["global_batch"]) == (4, 64, 512)
    # short sequences: capped at 1,024 micro-batches per DP rank
    p = run_json("--seq-len", "64")["plan"]
    assert (p["grad_accum"], p["global_batch"]) == (1024, 8192)
    # huge micro-batches: at least one per DP rank
    p = run_json("--micro-batch", "4096", "--seq-len", "2048")["plan"]
    assert (p["grad_accum"], p["global_batch"]) == (1, 4096 * 8)
    # interleaved: rounded up to a multiple of pp; 4M / (4,096 · 1 · 1) = 1,024 = 3 · 341 + 1 -> 1,026
    p = run_json("--gpus", "3", "--gpus-per-node", "1", "--pp", "3", "--vpp", "2", "--model", "llama2-7b")["plan"]
    assert (p["schedule"], p["vpp"], p["grad_accum"]) == ("interleaved", 2, 1026)


def test_schedule_interleaved_alone_uses_two_virtual_stages():
    p = run_json("--gpus", "16", "--pp", "2", "--schedule", "interleaved")["plan"]
    assert (p["schedule"], p["vpp"]) == ("interleaved", 2)


def test_hf_config_and_yaml_models():
    d = run_json("--model", str(HF_LLAMA))
    assert d["model"]["params_total"] == 8_030_261_248
    assert d == run_json("--model", "llama3-8b") | {"model": d["model"]}  # same numbers as the catalog entry
    assert run_json("--model", str(CUSTOM_YAML))["model"]["params_total"] == 1_235_814_400


def test_hf_config_relative_path(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert run_json("--model", "tests/data/hf/Llama-3.1-8B/config.json")["model"]["params_total"] == 8_030_261_248


# ---- presets ----------------------------------------------------------------------------------


def _preset_library_estimate():
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 16384, pod_size=3072, oversubscription=7.0)
    plan = TrainingPlan.build(tp=8, cp=1, pp=16, dp=128, vpp=8, schedule="interleaved", micro_batch=1,
                              global_batch=2048, seq_len=8192, recompute="none", zero=2,
                              rank_order=("tp", "cp", "pp", "dp"), attention_kernel="flash2", tp_backward_overlap=False)
    return estimate(load_model("llama3-405b"), cluster, plan, Budget(tokens=15.6e12))


def test_preset_plan_is_llama3_405b_on_16k_gpus():
    d = run_json("--preset", "llama3-405b-16k")
    assert d == roundtrip(_preset_library_estimate().to_dict())
    p = d["plan"]
    assert (p["tp"], p["cp"], p["pp"], p["dp"], p["vpp"], p["schedule"]) == (8, 1, 16, 128, 8, "interleaved")
    assert (p["global_batch"], p["global_batch_tokens"], p["grad_accum"]) == (2048, 16 * 2**20, 16)
    assert p["rank_order"] == ["tp", "cp", "pp", "dp"] and p["zero"] == 2 and p["recompute"] == "none"
    assert p["stack"]["attention_kernel"] == "flash2"  # Meta's stack, not Transformer Engine: FlashAttention-2's rates
    per_rank = [st["layers"] for st in d["memory"]["stages"]]
    assert per_rank == [7] + [8] * 14 + [7]  # one layer fewer on the first and last stages
    assert d["plan"]["layer_split"] == [0] + [1] * 126 + [0]  # the default split for 128 chunks: one layer each, empty ends
    assert d["run"]["tokens"] == 15.6e12
    assert (d["cluster"]["pod_size"], d["cluster"]["oversubscription"]) == (3072, 7.0)


def test_preset_human_output_shows_published_figures_beside_the_estimate():
    code, out, err = run_cli("estimate", "--preset", "llama3-405b-16k")
    assert code == 0 and err == ""
    est = _preset_library_estimate()
    assert "Estimate vs published" in out and "2407.21783" in out
    # both sides on the authors' FLOP count, (6·N + 12·L·h·s) per token: their 400 TFLOP/s is a
    # step of F / (16,384 × 400e12) seconds; meshplan's step gives F / (16,384 × step) TFLOP/s
    F = 2048 * 8192 * (6 * 405_853_388_800 + 12 * 126 * 16384 * 8192)
    step_pub = F / (16384 * 400e12)
    step_row = next(line for line in out.splitlines() if line.strip().startswith("step time (s)"))
    assert f"{est.time.step_s:.3f}" in step_row and f"{step_pub:.3f}" in step_row
    assert f"{100 * (est.time.step_s - step_pub) / step_pub:+.1f}%" in step_row
    tflops = F / (16384 * est.time.step_s) / 1e12
    tflops_row = next(line for line in out.splitlines() if "TFLOP/s per GPU (their formula)" in line)
    assert f"{tflops:,.1f}" in tflops_row and f"{100 * (tflops - 400) / 400:+.1f}%" in tflops_row
    mfu = tflops * 1e12 / 989.4e12
    mfu_row = next(line for line in out.splitlines() if line.strip().startswith("MFU (their formula)"))
    assert f"{100 * mfu:.1f}%" in mfu_row and f"{100 * (mfu - 0.41) / 0.41:+.1f}%" in mfu_row
    assert f"{est.model_tflops_per_gpu:,.1f} TFLOP/s per GPU" in out  # meshplan's own convention, stated
    assert f"{est.run_cost()['days']:,.2f}" in out  # 15.6T tokens


def test_flags_override_the_preset():
    d = run_json("--preset", "llama3-405b-16k", "--dp", "64")
    assert (d["plan"]["dp"], d["cluster"]["num_gpus"], d["plan"]["grad_accum"]) == (64, 8192, 32)
    d = run_json("--preset", "llama3-405b-16k", "--vpp", "1")
    assert (d["plan"]["vpp"], d["plan"]["schedule"]) == (1, "1f1b")
    d = run_json("--preset", "llama3-405b-16k", "--global-batch-tokens", "32M", "--recompute", "full")
    assert (d["plan"]["global_batch"], d["plan"]["recompute"]) == (4096, "full")
    d = run_json("--preset", "llama3-405b-16k", "--pp", "8")
    assert (d["plan"]["pp"], d["plan"]["dp"], d["cluster"]["num_gpus"]) == (8, 256, 16384)


# ---- human output -----------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "shown"), [
    (("--tp", "8", "--tp-comm-overlap", "--set", "tp_overlap_kind=micro-pipeline"), "; TP overlap micro-pipeline"),
    (("--tp", "8", "--tp-comm-overlap"), "; TP overlap userbuffers"),
    (("--tp", "8", "--set", "tp_overlap_kind=micro-pipeline"), "; TP overlap off"),  # a kind without overlap does nothing
    (("--tp", "1", "--tp-comm-overlap"), ""),  # no TP, no TP overlap to speak of
])
def test_plan_line_says_how_tp_communication_overlaps(flags, shown):
    code, out, err = run_cli("estimate", "--model", "llama3-70b", "--gpus", "64", *flags)
    assert (code, err) == (0, "")
    plan_line = next(line for line in out.splitlines() if line.startswith("plan: TP"))  # not a wrapped "... this plan: x"
    assert plan_line.endswith("1f1b pipeline schedule" + shown)


def test_human_output_tables_and_units():
    code, out, err = run_cli("estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--pp", "2",
                             "--tokens", "1T", "--price", "2")
    assert code == 0 and err == ""
    est = library("llama3-70b", 64, Budget(tokens=1e12, price_per_gpu_hour=2.0), tp=8, pp=2, dp=4,
                  global_batch=1024, seq_len=4096)
    for title in ("Memory per GPU by pipeline rank, in GiB", "Step time on the critical pipeline rank",
                  "Throughput", "FLOPs per step", "Run: 1e+12 tokens"):
        assert title in out
    assert "fits" in out and "DOES NOT FIT" not in out
    assert f"{est.peak_bytes / 2**30:,.2f}" in out
    assert f"{est.time.step_s:.4f}" in out
    assert f"{est.tokens_per_s:,.0f}" in out
    run = est.run_cost()
    assert f"{run['days']:,.2f}" in out and f"{run['dollars']:,.0f}" in out and f"{run['energy_mwh']:,.1f}" in out
    # one row per pipeline rank, the worst one marked
    table = out.split("Memory per GPU")[1].split("peak ")[0]
    rows = [line.split() for line in table.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "1"]
    worst = max(est.stages, key=lambda st: st.total).rank
    assert [r[0] for r in rows if r[1] == "*"] == [str(worst)]


def test_does_not_fit_and_gb_unit():
    code, out, err = run_cli("estimate", "--model", "llama3-70b", "--gpus", "8", "--unit", "GB")
    assert code == 0 and err == ""
    assert "DOES NOT FIT" in out and "in GB (1e9 bytes)" in out
    est = library("llama3-70b", 8, tp=1, dp=8, global_batch=1024, seq_len=4096)
    assert not est.fits
    assert f"{(est.peak_bytes - est.capacity_bytes) / 1e9:,.2f} GB" in out


def test_all_pipeline_ranks_are_listed():
    code, out, _ = run_cli("estimate", "--preset", "llama3-405b-16k")
    table = out.split("Memory per GPU")[1].split("peak ")[0]
    ranks = [line.split()[0] for line in table.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert ranks == [str(r) for r in range(16)]


# ---- explain ----------------------------------------------------------------------------------


def test_explain_shows_formulas_with_values():
    code, out, err = run_cli("explain")
    assert code == 0 and err == ""
    pc = count_params(load_model("llama3-8b"))
    assert "6 · N_mm · T" in out
    assert f"{pc.matmul:,}" in out and f"{1024 * 4096:,} tokens per step" in out
    assert "[flops.breakdown.dense]" in out and "[throughput.mfu]" in out and "source:" in out
    est = library("llama3-8b", 8, dp=8, global_batch=1024, seq_len=4096)
    assert f"{est.flops.dense:.4e} FLOP" in out


def test_explain_figure_filter():
    code, out, err = run_cli("explain", "--figure", "memory", "--model", "llama3-70b", "--gpus", "16", "--tp", "8")
    assert code == 0 and err == ""
    assert "[memory.peak_bytes]" in out and "[memory.stages[0].weights]" in out
    assert "flops.breakdown.dense" not in out and "throughput.mfu" not in out


# ---- catalogs -----------------------------------------------------------------------------------


def test_models_table_and_json():
    code, out, err = run_cli("models")
    assert code == 0 and err == ""
    for name in MODELS:
        assert name in out
        assert f"{count_params(load_model(name)).total:,}" in out
    code, out, _ = run_cli("models", "--json")
    rows = json.loads(out)
    assert [r["name"] for r in rows] == model_names() and set(MODELS) <= set(model_names())
    by = {r["name"]: r for r in rows}
    assert by["llama3-405b"]["params_total"] == 405_853_388_800
    assert (by["llama3-70b"]["n_layers"], by["llama3-70b"]["n_heads"], by["llama3-70b"]["n_kv_heads"]) == (80, 64, 8)


def test_gpus_table_and_json():
    code, out, err = run_cli("gpus")
    assert code == 0 and err == ""
    for name in GPUS:
        assert name in out
    assert "989.4" in out and "1,978.9" in out  # H100 dense BF16 / FP8
    code, out, _ = run_cli("gpus", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert list(rows) == gpu_names() and set(GPUS) <= set(rows)
    h100 = rows["h100-sxm-80gb"]
    assert (h100["bf16_tflops"], h100["hbm_gib"], h100["scale_up_size"], h100["scale_up_gbps"], h100["nic_gbps"]) == (
        989.4, 80, 8, 450, 50)
    assert rows["a100-sxm-80gb"]["fp8_tflops"] is None


def test_help_and_no_arguments():
    code, out, err = run_cli()
    assert code == 0 and "estimate" in out and "explain" in out and err == ""
    code, out, _ = run_cli("estimate", "--help")
    assert code == 0 and "--global-batch-tokens" in out and "--preset" in out and "4,194,304" in out


# ---- as an installed command --------------------------------------------------------------------


def _subprocess(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "meshplan.cli.app", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_subprocess_json_and_error():
    proc = _subprocess("estimate", "--json", "--tp", "2")
    assert proc.returncode == 0 and proc.stderr == ""
    d = json.loads(proc.stdout)
    assert d == run_json("--tp", "2", whole=True)
    proc = _subprocess("estimate", "--tp", "3")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["error: tp: tp (3) must divide the number of attention heads (32)"]


def test_default_global_batch_fits_every_interleaved_schedule():
    """Without a batch, the default number of micro-batches is rounded up to a multiple of pp for
    both interleaved schedules, so that they split into equal rounds."""
    for schedule in ("interleaved", "interleaved-zb"):
        d = run_json("--model", "llama3-8b", "--gpus", "48", "--pp", "8", "--schedule", schedule, "--seq-len", "2048")
        assert d["plan"]["grad_accum"] % 8 == 0


def test_fsdp_head_in_root_flag_and_its_rule():
    d = run_json("--zero", "3", "--set", "kernels=eager", "--seq-len", "2048", "--global-batch", "8", "--set", "fsdp_head_in_root=true")
    assert d["plan"]["stack"]["fsdp_head_in_root"] is True and d["plan"]["bytes_per_param"] == 16  # FSDP2: fp32 shards as master
    assert "root_gradients_held" in d["memory"]["stages"][0]["other_detail"]
    # a ZeRO-1 plan has no FSDP2 units: the field is ignored by its rule, and the header says so
    d = run_json("--zero", "1", "--set", "kernels=eager", "--set", "fsdp_head_in_root=true")
    assert d["plan"]["stack"]["fsdp_head_in_root"] is False and d["plan"]["stack"]["overrides"] == {"kernels": "eager"}
    code, out, err = run_cli("estimate", "--zero", "1", "--set", "kernels=eager", "--set", "fsdp_head_in_root=true")
    # (at tp 1 the backward's own TP overlap is set aside too)
    assert code == 0 and "not used by this plan: tp_backward_overlap, fsdp_head_in_root" in " ".join(out.split())


def test_fsdp_fp8_all_gather_flag_in_the_json():
    args = ("--zero", "3", "--precision", "fp8", "--set", "kernels=compiled", "--seq-len", "2048", "--global-batch", "8")
    on, off = run_json(*args, "--set", "fsdp_fp8_all_gather=true"), run_json(*args)
    assert on["plan"]["stack"]["fsdp_fp8_all_gather"] is True and off["plan"]["stack"]["fsdp_fp8_all_gather"] is False
    # eight GPUs of Llama 3 8B peak at the loss, where the gathered unit is the LM head's (bf16 under
    # either); FSDP2's all-gather pool holds the head's buffer and one block's, an FP8 block 218,103,808 bytes less
    a, b = (d["memory"]["stages"][0]["other_detail"] for d in (off, on))
    assert "logits_grad" in a and a["gathered_weights"] == b["gathered_weights"]
    assert a["all_gather_pool"] - b["all_gather_pool"] == 218_103_808
    assert on["time"]["step_s"] < off["time"]["step_s"]


def test_estimate_help_stays_half_as_long_as_before_the_stacks():
    # 324 lines at 100 columns when the 15 behaviour fields were plan flags; at most half now
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb"}
    out = subprocess.run([sys.executable, "-c", "from meshplan.cli.app import main; raise SystemExit(main(['estimate', '--help']))"],
                         capture_output=True, text=True, env=env, check=True).stdout
    assert 100 < len(out.splitlines()) <= 324 // 2
