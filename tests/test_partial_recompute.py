"""Full recompute of the first N layers of each virtual stage (``recompute_layers``; Megatron-LM's
``--recompute-method block``, torchtitan 0.2's layer-level SAC): the two ends are no recompute and
full recompute to the bit, a middle is the exact mix, and the engines' configs carry it both ways."""

from __future__ import annotations

import pytest
from test_cli import run_cli

from meshplan.catalog import load_gpu, load_model
from meshplan.errors import InputError
from meshplan.estimate import estimate
from meshplan.interop import export, parse_text
from meshplan.interop.torchtitan_ac import layer_sac_every
from meshplan.specs import ClusterSpec
from meshplan.specs.plan import TrainingPlan
from meshplan.specs.validate import check_plan

LLAMA8 = load_model("llama3-8b")
H100 = load_gpu("h100-sxm-80gb")


def _numbers(est):
    return (est.time.step_s, est.time.recompute_s, est.time.compute_s, est.flops.hardware,
            [(s.activations, s.other, s.total) for s in est.stages])


@pytest.fixture(scope="module")
def ends():
    """llama3-8b on 8 GPUs, PP 2 (16 layers a stage), ZeRO-1, 8K tokens: no recompute, full, and N."""
    cluster = ClusterSpec.of(H100, 8)
    plan = lambda **kw: TrainingPlan.of(pp=2, dp=4, global_batch=32, seq_len=8192, **kw)  # noqa: E731
    return {key: estimate(LLAMA8, cluster, plan(**kw)) for key, kw in {
        "none": dict(recompute="none"), "full": dict(recompute="full"), "0": dict(recompute="full", recompute_layers=0),
        "8": dict(recompute="full", recompute_layers=8), "16": dict(recompute="full", recompute_layers=16),
        "99": dict(recompute="full", recompute_layers=99)}.items()}


def test_no_layer_is_no_recompute_and_every_layer_is_full_recompute_to_the_bit(ends):
    assert _numbers(ends["0"]) == _numbers(ends["none"])
    assert _numbers(ends["16"]) == _numbers(ends["full"]) == _numbers(ends["99"])


def test_half_the_layers_recompute_half(ends):
    none, full, half = ends["none"], ends["full"], ends["8"]
    assert half.time.recompute_s == pytest.approx(full.time.recompute_s / 2, rel=1e-12)
    assert half.flops.recompute == pytest.approx(full.flops.recompute / 2, rel=1e-12)
    assert half.flops.model == full.flops.model
    # each stage stores 8 layers' activations whole and 8 layers' inputs
    for s_none, s_full, s_half in zip(none.stages, full.stages, half.stages):
        stored = lambda s: s.activation_items["stored"]  # noqa: E731
        per_mb = lambda s: stored(s) / s.peak_inflight  # noqa: E731
        assert per_mb(s_half) == pytest.approx((per_mb(s_none) + per_mb(s_full)) / 2, rel=1e-9)
    assert none.time.step_s < half.time.step_s < full.time.step_s
    assert full.peak_bytes < half.peak_bytes < none.peak_bytes


def test_the_k_of_torchtitan_layer_sac():
    assert layer_sac_every((16, 16), 8) == 2 and layer_sac_every((16, 16), 16) == 1 and layer_sac_every((32,), 10) == 3
    assert layer_sac_every((5, 6, 5), 2) is None  # 5//2 = 2 but 6//2 = 3: no k gives 2 on every stage
    assert layer_sac_every((16, 16), 0) is None


def test_megatron_block_and_torchtitan_layer_sac_round_trip():
    plan = TrainingPlan.of(pp=2, dp=4, global_batch=32, seq_len=8192, zero=3, recompute="full", recompute_layers=8,
                           kernels="compiled")
    text = export("megatron", LLAMA8, plan).text
    assert "--recompute-method block" in text and "--recompute-num-layers 8" in text
    assert parse_text(text).plan["recompute_layers"] == 8
    r = export("torchtitan@0.2", LLAMA8, plan)
    assert "--activation_checkpoint.mode selective" in r.text and "--activation_checkpoint.selective_ac_option 2" in r.text
    back = parse_text(r.text)
    assert (back.plan["recompute"], back.plan["recompute_layers"]) == ("full", 8)
    # torchtitan 0.3 has no layer-level checkpointing: full, warned by name
    assert [w.split(":")[0] for w in export("torchtitan", LLAMA8, plan).warnings if w.startswith("recompute")] == ["recompute_layers"]


def test_a_torchtitan_toml_with_every_second_layer_reads_half_the_layers(tmp_path):
    """torchtitan's debug and 8B configs: ``mode = "selective"``, ``selective_ac_option = "2"``:
    every second block of the rank, 16 of llama3-8b's 32."""
    path = tmp_path / "llama3_8b.toml"
    path.write_text('[model]\nname = "llama3"\nflavor = "8B"\n\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n\n'
                    '[parallelism]\ndata_parallel_shard_degree = 8\n\n[activation_checkpoint]\nmode = "selective"\n'
                    'selective_ac_option = "2"\n')
    code, out, err = run_cli("estimate", "--plan", str(path), "--gpus", "8", "--json")
    assert code == 0, err
    import json

    plan = json.loads(out)["plan"]
    assert (plan["recompute"], plan["recompute_layers"]) == ("full", 16)


def test_refusals_name_the_field(tmp_path):
    mixtral, cluster = load_model("mixtral-8x7b"), ClusterSpec.of(H100, 8)
    with pytest.raises(InputError, match="recompute_layers"):
        check_plan(mixtral, cluster, TrainingPlan.of(dp=8, global_batch=8, seq_len=4096, recompute="full", recompute_layers=4))
    code, _, err = run_cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--recompute", "selective", "--recompute-layers", "4")
    assert code == 2 and err.startswith("error: recompute_layers:") and "needs --recompute full" in err
    code, _, err = run_cli("search", "--model", "llama3-8b", "--gpus", "8", "--recompute", "full", "--recompute-layers", "4")
    assert code == 2 and err.startswith("error: recompute_layers:")
    # a plan file's layer count goes when another recompute mode is asked for
    path = tmp_path / "plan.json"
    code, out, _ = run_cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--recompute", "full", "--recompute-layers", "4", "--json")
    path.write_text(out)
    code, out, err = run_cli("estimate", "--plan", str(path), "--recompute", "selective", "--json")
    import json

    assert code == 0 and json.loads(out)["plan"]["recompute_layers"] is None, err
    code, out, err = run_cli("estimate", "--plan", str(path), "--json")
    assert code == 0 and json.loads(out)["plan"]["recompute_layers"] == 4
