"""The search's expert-parallel and TP-overlap axes: the space (which ep, which plans each rule
rejects, exact counts), the screen against ``estimate`` to the bit on sampled plans of each ep,
and the CLI's flags."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.errors import InputError
from meshplan.estimate import estimate
from meshplan.search.engine import Engine
from meshplan.search.run import search
from meshplan.search.space import SearchLimits, enumerate_plans
from meshplan.specs.rules import REASONS
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.validate import check_plan
from test_bad_input import run_cli

H100 = load_gpu("h100-sxm-80gb")


def _deepseek_like() -> ModelSpec:
    """DeepSeek-V3's layer (MLA, 256 experts of which 8 per token, one shared expert, dense first
    layers) on 12 layers, so that a test can estimate every sampled plan."""
    ds = load_model("deepseek-v3-671b")
    return ModelSpec(**{**ds.model_dump(), "name": "deepseek-like-12l", "n_layers": 12, "dense_layers": (0, 1, 2)})


def _check_sampled(model, gpus, seq, gb, limits, per_ep=12, rank_order=("tp", "cp", "dp", "pp")):
    cluster = ClusterSpec.of(H100, gpus)
    base = TrainingPlan(global_batch=gb, seq_len=seq, rank_order=rank_order)
    table = enumerate_plans(model, gpus, cluster.gpus_per_node, seq, (gb,), limits)
    screen = Engine(model, cluster, base).evaluate(table)
    rng = np.random.default_rng(11)
    for ep in (1, 2, 4, 8):
        idx = np.flatnonzero(table.ep == ep)
        assert len(idx) > per_ep, ep
        for i in rng.choice(idx, per_ep, replace=False).tolist():
            plan = TrainingPlan.of(**{**base.model_dump(), **table.row(i)})
            assert plan.ep == ep
            check_plan(model, cluster, plan)  # every enumerated plan is valid for estimate
            est = estimate(model, cluster, plan)
            assert screen.peak_bytes[i] == est.peak_bytes, table.row(i)
            assert screen.worst_rank[i] == max(range(len(est.stages)), key=lambda r: est.stages[r].total)
            assert screen.step_lower_bound[i] <= est.time.step_s, table.row(i)
            assert screen.step_lower_bound[i] >= 0.5 * est.time.step_s  # a bound worth having
            if ep > 1 and model.dense_layers == ():  # every rank runs the all-to-all, the bound included
                assert est.time.ep_comm_s > 0
    return table


def test_mixtral_screen_is_estimate_for_every_ep():
    lim = SearchLimits(max_micro_batch=2, max_vpp=2, max_cp=2, max_pp=4, recompute=("selective", "full"), zero=(1, 3))
    table = _check_sampled(load_model("mixtral-8x7b"), 64, 4096, 128, lim)
    assert sorted(set(table.ep.tolist())) == [1, 2, 4, 8]
    assert np.all(table.dp % table.ep == 0) and np.all(8 % table.ep == 0)


def test_deepseek_like_screen_is_estimate_for_every_ep():
    # Llama 3's rank order puts the ep group across pipeline stages: other placements than Megatron's
    lim = SearchLimits(max_micro_batch=1, max_vpp=2, max_cp=1, max_pp=4, max_ep=8, recompute=("full",), zero=(1, 3), hsdp=True)
    table = _check_sampled(_deepseek_like(), 64, 4096, 64, lim, per_ep=8, rank_order=("tp", "cp", "pp", "dp"))
    assert int(table.ep.max()) == 8  # --max-ep holds below the 256 experts
    assert "ep_hsdp" in table.rejected and np.all((table.ep == 1) | (table.dp_shard == table.dp))


def test_ep_values_and_rejections_counted_exactly():
    model = load_model("mixtral-8x7b")
    # one mesh: TP2 CP1 PP1 DP32, b = 1, ZeRO 0..3, HSDP groups 2 4 8 16 for ZeRO >= 1
    lim = SearchLimits(tp=2, cp=1, pp=1, micro_batch=1, hsdp=True, tp_comm_overlap=(True, False))
    t = enumerate_plans(model, 64, 8, 4096, (64,), lim)
    # ep | gcd(8, 32): 1 2 4 8; TP overlap 2; recompute none selective full (op is dense only);
    # SP 2; ZeRO 4 + 3 x 4 HSDP groups = 16
    assert sorted(set(t.ep.tolist())) == [1, 2, 4, 8]
    ep1 = 2 * 3 * 2 * 16  # every combination
    ep_more = 3 * 2 * 3 * 1 * 4  # SP on only, no HSDP group
    assert len(t) == ep1 + ep_more
    assert t.rejected == {"ep_sp": 3 * 2 * 3 * 16, "ep_hsdp": 3 * 2 * 3 * 12}
    assert set(REASONS) >= set(t.rejected)
    # --ep fixes it, --max-ep limits it
    assert set(enumerate_plans(model, 64, 8, 4096, (64,), SearchLimits(tp=2, pp=1, cp=1, micro_batch=1, ep=4)).ep.tolist()) == {4}
    assert set(enumerate_plans(model, 64, 8, 4096, (64,), SearchLimits(tp=2, pp=1, cp=1, micro_batch=1, max_ep=2)).ep.tolist()) == {1, 2}
    # a fixed ep that divides no dp of the limits leaves nothing
    assert len(enumerate_plans(model, 64, 8, 4096, (64,), SearchLimits(tp=8, pp=8, cp=1, ep=2))) == 0


def test_dense_models_keep_ep_one_and_tp_overlap_only_with_tp():
    model = load_model("llama3-8b")
    assert not enumerate_plans(model, 8, 8, 4096, (32,), SearchLimits(max_micro_batch=2)).tpo.any()  # off by default
    t = enumerate_plans(model, 8, 8, 4096, (32,), SearchLimits(max_micro_batch=2, tp_comm_overlap=(True, False)))
    assert set(t.ep.tolist()) == {1}
    assert not t.tpo[t.tp == 1].any()
    with_tp = t.tp > 1
    # each tp > 1 plan twice, overlap on and off, all else equal
    assert int(t.tpo[with_tp].sum()) * 2 == int(with_tp.sum())
    fixed = enumerate_plans(model, 8, 8, 4096, (32,), SearchLimits(max_micro_batch=2, tp_comm_overlap=(True,)))
    assert len(fixed) == int((t.tp == 1).sum()) + int(t.tpo.sum())


@pytest.mark.parametrize("bad,field", [
    (dict(ep=2), "ep"),  # dense model
    (dict(max_ep=0), "max_ep"),
])
def test_bad_ep_limits_on_a_dense_model(bad, field):
    with pytest.raises(InputError) as exc:
        enumerate_plans(load_model("llama3-8b"), 8, 8, 4096, (32,), SearchLimits(**bad))
    assert exc.value.field == field


def test_ep_must_divide_the_experts():
    with pytest.raises(InputError) as exc:
        enumerate_plans(load_model("mixtral-8x7b"), 64, 8, 4096, (64,), SearchLimits(ep=16))
    assert exc.value.field == "ep" and "number of experts (8)" in exc.value.rule


def test_tp_overlap_screen_is_estimate_and_never_slower():
    model = load_model("llama3-70b")
    cluster = ClusterSpec.of(H100, 32)
    base = TrainingPlan(global_batch=64, seq_len=4096)
    lim = SearchLimits(max_micro_batch=2, max_vpp=2, max_cp=2, tp=8, recompute=("selective",), zero=(1,),
                       tp_comm_overlap=(True, False))
    table = enumerate_plans(model, 32, 8, 4096, (64,), lim)
    screen = Engine(model, cluster, base).evaluate(table)
    on = np.flatnonzero(table.tpo)
    rng = np.random.default_rng(3)
    for i in rng.choice(on, 10, replace=False).tolist():
        row = table.row(i)
        assert row["tp_comm_overlap"] is True
        est = estimate(model, cluster, TrainingPlan.of(**{**base.model_dump(), **row}))
        off = estimate(model, cluster, TrainingPlan.of(**{**base.model_dump(), **row, "tp_comm_overlap": False}))
        assert screen.peak_bytes[i] == est.peak_bytes == off.peak_bytes  # overlap moves no bytes
        assert screen.step_lower_bound[i] <= est.time.step_s < off.time.step_s
        assert est.time.tp_comm_s < off.time.tp_comm_s


def test_mixtral_search_top_plans_are_estimates():
    model = load_model("mixtral-8x7b")
    cluster = ClusterSpec.of(H100, 64)
    base = TrainingPlan(global_batch=128, seq_len=4096)
    lim = SearchLimits(max_micro_batch=2, max_vpp=2, max_cp=1, max_pp=4, recompute=("selective",), zero=(1, 3))
    res = search(model, cluster, base, lim, top_k=3)
    assert res.top and res.rejected.get("ep_sp", 0) > 0
    for r in res.top:
        again = estimate(model, cluster, r.estimate.plan)
        assert again.to_dict() == r.estimate.to_dict()
    steps = [r.estimate.time.step_s for r in res.top]
    assert steps == sorted(steps)


MIXTRAL = ("search", "--model", "mixtral-8x7b", "--gpus", "64", "--seq-len", "4096", "--global-batch", "128",
           "--max-micro-batch", "1", "--max-pp", "2", "--max-cp", "1", "--recompute", "selective", "--zero", "1")


def test_cli_ep_flags():
    code, out, err = run_cli(*MIXTRAL, "--ep", "4", "--tp", "2", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert {p["plan"]["ep"] for p in res["top"]} == {4}
    assert all(p["plan"]["sequence_parallel"] for p in res["top"])  # ep > 1 with tp > 1 needs SP
    code, out, err = run_cli(*MIXTRAL, "--max-ep", "2", "--no-tp-comm-overlap", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert {p["plan"]["ep"] for p in res["top"]} <= {1, 2}
    assert not any(p["plan"]["stack"]["tp_comm_overlap"] for p in res["top"])
    code, out, err = run_cli(*MIXTRAL, "--tp", "2", "--tp-comm-overlap", "--json")  # asked for: every TP plan overlaps
    assert code == 0, err
    assert all(p["plan"]["stack"]["tp_comm_overlap"] for p in json.loads(out)["top"])
    code, out, err = run_cli(*MIXTRAL, "--tp", "2", "--json")  # off unless asked for, as in estimate
    assert code == 0, err
    assert not any(p["plan"]["stack"]["tp_comm_overlap"] for p in json.loads(out)["top"])
    code, out, err = run_cli(*MIXTRAL, "--ep", "16")
    assert code == 2 and out == "" and err.strip() == "error: ep: ep (16) must divide the number of experts (8)"
    code, out, err = run_cli(*MIXTRAL, "--max-ep", "0")
    assert code == 2 and err.strip() == "error: max_ep: must be at least 1 (got 0)"
