"""``meshplan estimate``'s advice (:mod:`meshplan.advice`): the best changes of one or two
settings when a plan does not fit or a change beats the estimate's error, each estimated exactly
as the flags it prints give it, in a few dozen estimates."""

from __future__ import annotations

import contextlib
import io
import json
import time

import pytest

import meshplan.advice as advice_mod
from meshplan.advice import MAX_CANDIDATES, PAIRS, STEP_ERROR, advise, flags_of, single_changes
from meshplan.cli.app import main
from meshplan.cli.options import PlanArgs, resolve
from meshplan.estimate import estimate
from meshplan.units import GiB

L405_Z1 = ["--preset", "llama3-405b-16k", "--zero", "1"]


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_done_when_405b_at_zero_1_gets_advice_whose_first_item_fits():
    code, out, err = run_cli("estimate", *L405_Z1)
    assert code == 0, err
    assert "peak 84.45 GiB on rank 1 (*) of 80.00 GiB per GPU: DOES NOT FIT" in out
    lines = out.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("advice: changes that fit"))
    assert lines[i + 1].startswith("  1. --") and "fits at" in lines[i + 1]
    # ZeRO-2 among the first three, with the figures of that plan's own estimate
    z2 = json.loads(run_cli("estimate", *L405_Z1[:-1], "2", "--json")[1])
    said = f"ZeRO-2: fits at {z2['memory']['peak_bytes'] / 2**30:.2f} GiB, step {z2['time']['step_s']:.3f} s"
    assert f"{z2['memory']['peak_bytes'] / 2**30:.2f}" == "74.91"
    assert any("--zero 2" in line and said in line for line in lines[i + 1:i + 4])
    code, out, _ = run_cli("estimate", *L405_Z1, "--json")
    d = json.loads(out)
    assert d["memory"]["fits"] is False and d["advice"]
    first = d["advice"][0]
    assert first["fits"] is True and first["peak_bytes"] <= d["memory"]["capacity_bytes"]
    assert set(first) == {"flags", "changes", "peak_bytes", "step_s", "fits", "why"}
    assert all(a["fits"] for a in d["advice"])
    assert [a["step_s"] for a in d["advice"]] == sorted(a["step_s"] for a in d["advice"])  # fastest first


def test_each_advice_is_what_its_flags_give():
    _, out, _ = run_cli("estimate", *L405_Z1, "--json")
    for a in json.loads(out)["advice"]:
        code, got, err = run_cli("estimate", *L405_Z1, *a["flags"], "--json", "--no-advice")
        assert code == 0, (a["flags"], err)
        g = json.loads(got)
        assert g["memory"]["peak_bytes"] == a["peak_bytes"] and g["time"]["step_s"] == a["step_s"], a["flags"]
        assert g["advice"] == []


def test_zero_2_figures_are_the_estimates():
    s = resolve(PlanArgs(preset="llama3-405b-16k", zero="1"))
    base = estimate(s.model, s.cluster, s.plan, s.budget)
    tips = advise(s.model, s.cluster, s.plan, base, s.budget)
    z2 = next(a for a in tips if a.changes == {"zero": 2})
    e2 = estimate(s.model, s.cluster, s.plan.replace(zero=2), s.budget)
    assert (z2.peak_bytes, z2.step_s, z2.fits) == (e2.peak_bytes, e2.time.step_s, True)
    assert z2.peak_bytes / GiB == pytest.approx(74.9065, abs=1e-4) and z2.flags == ("--zero", "2")


def test_candidates_of_the_405b_layout():
    s = resolve(PlanArgs(preset="llama3-405b-16k", zero="1"))
    labels = [label for label, _ in single_changes(s.plan, s.cluster.gpus_per_node)]
    assert {"ZeRO-2", "ZeRO-3", "recompute full", "micro-batch 2", "CP x2, DP /2", "vpp 4", "vpp 16"} <= set(labels)
    assert not any(label.startswith("TP x2") for label in labels)  # TP 8 fills the 8-GPU node
    assert len(labels) <= MAX_CANDIDATES
    ch = dict(single_changes(s.plan, s.cluster.gpus_per_node))["PP x2, DP /2"]
    assert ch == {"pp": 32, "dp": 64, "layer_split": None, "vpp": 4}  # the same 128 virtual stages
    new = s.plan.replace(**ch)
    assert flags_of(s.plan, new, ch, "--global-batch-tokens") == (
        "--pp", "32", "--dp", "64", "--schedule", "interleaved", "--vpp", "4", "--global-batch-tokens", "16777216")


def test_few_estimates_and_fast(monkeypatch):
    s = resolve(PlanArgs(preset="llama3-405b-16k", zero="1"))
    base = estimate(s.model, s.cluster, s.plan, s.budget)
    calls = []
    real = advice_mod.estimate
    monkeypatch.setattr(advice_mod, "estimate", lambda *a, **k: calls.append(1) or real(*a, **k))
    t = time.perf_counter()
    advise(s.model, s.cluster, s.plan, base, s.budget)
    assert len(calls) <= MAX_CANDIDATES + PAIRS * (PAIRS - 1) // 2
    assert time.perf_counter() - t < 5.0  # about 0.1 s


def test_a_plan_that_fits_gets_advice_only_beyond_the_error():
    _, out, _ = run_cli("estimate", "--preset", "llama3-405b-16k", "--json")  # fits; nothing 8 % faster
    assert json.loads(out)["advice"] == []
    args = ["--model", "llama3-70b", "--gpus", "256", "--tp", "8", "--pp", "4", "--zero", "0"]
    _, out, _ = run_cli("estimate", *args, "--json")
    d = json.loads(out)
    assert d["memory"]["fits"] and d["advice"]
    for a in d["advice"]:
        assert a["fits"] and a["step_s"] < (1 - STEP_ERROR) * d["time"]["step_s"]
    _, text, _ = run_cli("estimate", *args)
    assert "advice: changes faster by more than the estimate's error (8%)" in text
    _, out, _ = run_cli("estimate", *args, "--json", "--no-advice")
    assert json.loads(out)["advice"] == []


def test_advice_with_tp_runs_the_stack_as_the_same_flags_do():
    """A plan at tp 1 has the backward's own TP overlap set aside by its rule; advice that adds TP
    gets it back from the requested stack, so its step is what its flags estimate."""
    from meshplan.cli.options import PlanArgs, resolve

    setup = resolve(PlanArgs(model="mixtral-8x7b", gpus=64))
    base = estimate(setup.model, setup.cluster, setup.plan)
    first = advise(setup.model, setup.cluster, setup.plan, base)[0]
    assert "--tp" in first.flags and not setup.plan.stack.tp_backward_overlap
    flags = dict(zip(first.flags[::2], first.flags[1::2]))
    again = resolve(PlanArgs(model="mixtral-8x7b", gpus=64, tp=int(flags["--tp"]), dp=int(flags["--dp"]),
                             global_batch=int(flags["--global-batch"]), zero=int(flags["--zero"])))
    assert again.plan.stack.tp_backward_overlap
    assert first.step_s == estimate(again.model, again.cluster, again.plan).time.step_s
