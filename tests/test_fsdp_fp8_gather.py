"""FSDP2's FP8 all-gather (``fsdp_fp8_all_gather``; torchao's ``enable_fsdp_float8_all_gather``):
the blocks' Float8Linear weights gathered, copied out and held as FP8 bytes, and no weight cast
in the forward (meshplan.cost.fsdp_copies, .float8). Exact byte counts by hand."""

from __future__ import annotations

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost import collectives as coll
from meshplan.cost.calibration import calibration_for
from meshplan.cost.comm import dp_sync_times, fsdp_unit_times, plan_placements
from meshplan.cost.float8 import CAST_KERNELS, torchao_float8_passes
from meshplan.cost.fsdp_copies import copy_out_bytes, fp8_gather_saving, fsdp2_unit_copy_times, gather_pool_bytes
from meshplan.cost.kernel_time import memory_time
from meshplan.cost.params import layer_params_per_rank, linear_weights_per_rank
from meshplan.errors import InputError
from meshplan.estimate import estimate
from meshplan.interop import load_plan_file
from meshplan.specs import ClusterSpec, PrecisionRecipe, TrainingPlan
from meshplan.specs.stack import BEHAVIOUR_FIELDS, Stack, ignored
from meshplan.specs.validate import check_plan

FP8 = PrecisionRecipe(precision="fp8")
H100 = load_gpu("h100-sxm-80gb")


def test_linear_weights_of_llama3_by_hand():
    """Llama 3.1 8B, one layer, TP 1: q, o 4096², k, v 4096 x 1024, gate, up, down 4096 x 14336;
    the two RMSNorms (2 x 4096) are not Float8Linear. 70B at TP 8: q, o 8192 x 1024, one K/V head
    (8192 x 128 each), the MLP 3 x 8192 x 3584."""
    m8, m70 = load_model("llama3-8b"), load_model("llama3-70b")
    assert linear_weights_per_rank(m8, 1) == 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 == 218_103_808
    assert layer_params_per_rank(m8, 1) - linear_weights_per_rank(m8, 1) == 2 * 4096
    assert linear_weights_per_rank(m70, 8) == 2 * 8192 * 1024 + 2 * 8192 * 128 + 3 * 8192 * 3584 == 106_954_752
    # one byte instead of two for each linear weight; nothing without the switch
    assert fp8_gather_saving(m8, 1, 2, True) == 218_103_808 and fp8_gather_saving(m8, 1, 2, False) == 0


def test_a_layer_gathers_and_copies_out_fp8_linear_weights_and_16_bit_norms():
    m8 = load_model("llama3-8b")
    cluster = ClusterSpec.of(H100, 64)
    plan = TrainingPlan.of(dp=64, zero=3, seq_len=4096, global_batch=64, precision=FP8, kernels="compiled")
    cal, pl = calibration_for(H100), plan_placements(cluster, plan).shard
    gathered = 218_103_808 * 1 + 8_192 * 2  # FP8 linear weights, bf16 norms
    off = fsdp_unit_times(m8, 1, 1, FP8, pl, cluster, cal)
    on = fsdp_unit_times(m8, 1, 1, FP8, pl, cluster, cal, fp8_gather=True)
    assert on[0] == coll.collective_time("all_gather", gathered, pl, cluster, cal) < off[0]
    assert on[1:] == off[1:]  # the reduce-scatter and the embedding and head units are unchanged
    assert copy_out_bytes(layer_params_per_rank(m8, 1), FP8, 218_103_808) == 2 * gathered
    copies_on, copies_off = fsdp2_unit_copy_times(m8, 1, 1, FP8, H100, cal, fp8_gather=True), fsdp2_unit_copy_times(m8, 1, 1, FP8, H100, cal)
    assert copies_on[0] == memory_time(2 * gathered, H100, cal) and copies_on[1:] == copies_off[1:]
    # the all-gather pool of FSDP2's copy-in stream holds FP8 blocks in the hole the embedding left
    head = (128256 * 4096 + 4096) * 2
    assert gather_pool_bytes(m8, 1, 1, ((32, True, True),), 2, fp8_gather=True) == head + gathered
    # a step's one all-gather of weights kept gathered (torch's pipeline with FSDP2): n_l layers' saving off
    eight = ClusterSpec.of(H100, 8)
    pl8 = plan_placements(eight, TrainingPlan(dp=8, zero=3, seq_len=4096, global_batch=8))
    _, pg = dp_sync_times(16 * layer_params_per_rank(m8, 1), 3, True, 8, FP8, pl8, eight, cal, 16 * 218_103_808)
    assert pg == coll.collective_time("all_gather", 16 * gathered, pl8.shard, eight, cal)


def test_torchao_passes_lose_the_weight_cast():
    """Weights arriving cast: the forward casts the input alone, (2e + 1)·m·k, and op-level
    checkpointing recomputes only that cast, (e + 1)·m·k; the backward (output gradient, three
    column-major copies, the weight's among them) is unchanged."""
    gemms = [(8192.0, 6144.0, 4096.0), (8192.0, 4096.0, 4096.0)]
    off, on = torchao_float8_passes(gemms, 2), torchao_float8_passes(gemms, 2, weights_in_fp8=True)
    inputs, weights = 2 * 8192 * 4096, 6144 * 4096 + 4096 * 4096
    assert on.fwd_bytes == 5 * inputs and off.fwd_bytes == 5 * (inputs + weights)
    assert on.recompute_bytes == 3 * inputs and off.recompute_bytes == 3 * (inputs + weights)
    assert on.bwd_bytes == off.bwd_bytes and on.bwd_kernels == off.bwd_kernels
    assert on.fwd_kernels == 2 * CAST_KERNELS and off.fwd_kernels == 4 * CAST_KERNELS
    assert on.recompute_kernels == 2 and off.recompute_kernels == 4


def _est(model, gpus, **kw):
    plan = TrainingPlan.of(precision=FP8, kernels="compiled", zero=3, **kw)
    return estimate(model, ClusterSpec.of(H100, gpus), plan), estimate(model, ClusterSpec.of(H100, gpus), plan.replace(**{"fsdp_fp8_all_gather": True}))


def test_gathered_weights_at_a_layers_backward_and_through_a_pipelined_step():
    m8 = load_model("llama3-8b")
    saving = 218_103_808
    block = layer_params_per_rank(m8, 1) * 2
    # the first of two pipeline ranks, resharding after forward: the layer in use and the prefetched one
    off, on = _est(m8, 8, pp=2, dp=4, global_batch=16, micro_batch=2, seq_len=8192, recompute="op")
    a, b = off.stages[0].other_items, on.stages[0].other_items
    assert a["gathered_weights"] - b["gathered_weights"] == 2 * saving
    pool = gather_pool_bytes(m8, 1, 2, ((16, True, False),), 2, fp8_gather=True)
    assert b["all_gather_pool"] == pool - (block - saving)
    assert on.stages[0].other_items.keys() == off.stages[0].other_items.keys()
    assert on.time.step_s < off.time.step_s and on.time.fsdp_comm_s < off.time.fsdp_comm_s
    # torch's pipeline with FSDP2 keeps the stage gathered through the step: every layer's saving, P·(1 − 1/N)
    m70 = load_model("llama3-70b")
    kw = dict(tp=8, pp=4, dp=2, global_batch=16, seq_len=4096, recompute="full", reshard_after_forward=False,
              fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch")
    off, on = _est(m70, 64, **kw)
    r = 1  # a middle rank: layers only
    n = on.stages[r].layers
    assert off.stages[r].other_items["gathered_weights"] - on.stages[r].other_items["gathered_weights"] == pytest.approx(
        n * linear_weights_per_rank(m70, 8) * (1 - 1 / 2), rel=1e-12)


def test_without_sharding_nothing_is_gathered():
    m8 = load_model("llama3-8b")
    plan = TrainingPlan.of(tp=8, dp=1, zero=3, global_batch=8, seq_len=4096, precision=FP8, kernels="compiled", fsdp_fp8_all_gather=True)
    cluster = ClusterSpec.of(H100, 8)
    assert estimate(m8, cluster, plan).peak_bytes == estimate(m8, cluster, plan.replace(**{"fsdp_fp8_all_gather": False})).peak_bytes


@pytest.mark.parametrize("kw", [dict(zero=1), dict(precision=PrecisionRecipe(precision="bf16")), dict(kernels="fused"),
                                dict(fp8_linears="transformer-engine")])
def test_the_switch_needs_fsdp2_and_float8(kw):
    """Without FSDP2 and torchao's Float8 the switch means nothing: the stack's rule sets it aside."""
    fields = dict(dp=8, zero=3, global_batch=8, seq_len=4096, precision=FP8, kernels="compiled", fsdp_fp8_all_gather=True)
    assert TrainingPlan.of(**fields).stack.fsdp_fp8_all_gather is True
    plan = TrainingPlan.of(**(fields | kw))
    assert plan.stack.fsdp_fp8_all_gather is False
    assert "fsdp_fp8_all_gather" in [f for f, _, _ in ignored(Stack(**{k: v for k, v in (fields | kw).items() if k in BEHAVIOUR_FIELDS}), plan)]


def test_mixture_of_experts_is_refused():
    model = load_model("mixtral-8x7b")
    plan = TrainingPlan.of(dp=8, zero=3, global_batch=8, seq_len=4096, precision=FP8, kernels="compiled", fsdp_fp8_all_gather=True)
    with pytest.raises(InputError, match="fsdp_fp8_all_gather"):
        check_plan(model, ClusterSpec.of(H100, 8), plan)


TOML = """[model]
name = "llama3"
flavor = "8B"
converters = ["{conv}"]
[parallelism]
data_parallel_shard_degree = {shard}
[training]
local_batch_size = 2
seq_len = 8192
{section}
enable_fsdp_float8_all_gather = true
{precompute}
"""


@pytest.mark.parametrize("conv,section", [("quantize.linear.float8", "[quantize.linear.float8]"), ("float8", "[float8]")])
def test_torchtitan_float8_section_is_read(tmp_path, conv, section):
    """JobConfig v0.2's [quantize.linear.float8] and the [float8] of the releases before it."""
    path = tmp_path / "job.toml"
    path.write_text(TOML.format(conv=conv, shard=32, section=section, precompute="precompute_float8_dynamic_scale_for_fsdp = true"))
    parsed = load_plan_file(str(path)).parsed
    assert parsed.plan["fsdp_fp8_all_gather"] is True and parsed.plan["precision"]["precision"] == "fp8"
    assert not any("fsdp_fp8_all_gather" in n for n in parsed.notes)
    path.write_text(TOML.format(conv=conv, shard=32, section=section, precompute=""))
    parsed = load_plan_file(str(path)).parsed
    assert parsed.plan["fsdp_fp8_all_gather"] is True
    assert any(n.startswith("fsdp_fp8_all_gather: without") and "amax" in n for n in parsed.notes)
    path.write_text(TOML.format(conv=conv, shard=1, section=section, precompute=""))
    parsed = load_plan_file(str(path)).parsed
    assert "fsdp_fp8_all_gather" not in parsed.plan
    assert any("without FSDP it changes nothing" in n for n in parsed.notes)


def test_torchtitan_flags_carry_it_and_other_engines_warn():
    from meshplan.interop import export

    m8 = load_model("llama3-8b")
    plan = TrainingPlan.of(dp=8, zero=3, global_batch=16, micro_batch=2, seq_len=8192, recompute="op", precision=FP8,
                        kernels="compiled", fsdp_fp8_all_gather=True)
    text = export("torchtitan@0.2", m8, plan).text
    assert "--quantize.linear.float8.enable_fsdp_float8_all_gather" in text
    assert "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp" in text
    # torchtitan 0.3 sets Float8 only in its Python config functions: the export says so by name
    for engine in ("torchtitan", "megatron", "deepspeed", "nanotron"):
        assert any(w.startswith("fsdp_fp8_all_gather:") for w in export(engine, m8, plan).warnings), engine


def test_torch_fsdp2_with_torchao_gathers_and_holds_these_bytes():
    """torch's own FSDP2 with torchao's Float8 linears (two gloo ranks, one small Llama block as a
    unit): with enable_fsdp_float8_all_gather the unit's all-gather moves, and its unsharded
    parameters hold, P_l·w − P_lin·(w − 1) bytes (fp8 linear weights, bf16 norms); without it P_l·w.
    The forward of its seven linears takes one amax each instead of two (the weight's is gone, as
    ``torchao_float8_passes(weights_in_fp8=True)`` charges). torchao 0.18's backward takes four
    (the output gradient twice, the input and the weight again: ``matmul_with_hp_or_float8_args``
    saves the 16-bit tensors), three with the weight gathered in FP8; meshplan's passes follow the
    late-2024 design, which saved the FP8 tensors (docs/accuracy.md, what is not modelled)."""
    pytest.importorskip("torchao")
    from fsdp_copy_support import FP8_BLOCK, fp8_gather_records, on_two_ranks

    from meshplan.specs.model import ModelSpec

    h, a, g, f = FP8_BLOCK
    model = ModelSpec(name="block", n_layers=1, hidden=h, n_heads=a, n_kv_heads=g, head_dim=h // a, ffn_hidden=f, vocab_size=256)
    p_layer, saving = layer_params_per_rank(model, 1), fp8_gather_saving(model, 1, 2, True)
    assert (p_layer, saving) == (590_336, 589_824)
    for rank in on_two_ranks(fp8_gather_records):
        for fp8_gather, rec in rank.items():
            expected = p_layer * 2 - (saving if fp8_gather else 0)
            assert rec["all_gather"] == [expected]  # one flat buffer per unit (uint8 under FP8)
            assert sum(nbytes for nbytes, _ in rec["params"].values()) == expected
            dtypes = {name: dtype for name, (_, dtype) in rec["params"].items()}
            assert {dtypes[n] for n in dtypes if "norm" in n} == {"bfloat16"}
            assert {dtypes[n] for n in dtypes if "norm" not in n} == {"float8_e4m3fn" if fp8_gather else "bfloat16"}
            assert rec["amax"] == ((7, 21) if fp8_gather else (14, 28))


def test_fp8_linears_library_on_the_eager_stack():
    """Transformer Engine's FP8 linears under eager PyTorch (Composer's amp_fp8): the fused cast's
    bytes instead of torchao's passes, and the FP8 input saved (1 byte) instead of the 16-bit one;
    ``auto`` is torchao on eager, Transformer Engine on the fused stack; torchao cannot run there."""
    from meshplan.cost.activations import saved_gemm_input_bytes
    from meshplan.cost.compute import fp8_cast_bytes, layer_op_times, projection_gemms

    m8, cal = load_model("llama3-8b"), calibration_for(H100)
    args = (m8, 2, 4096, 1, 1, False, "flash", "causal", H100, cal, "fp8", 2, "eager")
    auto, torchao, te = (layer_op_times(*args, fp8_linears=x) for x in ("auto", "torchao", "transformer-engine"))
    fused = layer_op_times(*args[:-1], "fused")
    assert auto == torchao and te.fwd_memory < torchao.fwd_memory and te.bwd_memory < torchao.bwd_memory
    # Transformer Engine's fused casts (fp8_cast_bytes), one per linear as eager PyTorch runs them
    gemms = [shape for _, shape in projection_gemms(m8, 2 * 4096, 1, "eager")]
    bf16 = layer_op_times(*args[:10], "bf16", 2, "eager")
    act_f, act_b, weight_f, weight_b = fp8_cast_bytes([(*g, 1) for g in gemms], 2)
    cast_fwd, cast_bwd = act_f + weight_f, act_b + weight_b  # the weights too: no is_first_microbatch
    overheads = (len(gemms) - 1) * cal.kernel_overhead
    assert te.fwd_memory - bf16.fwd_memory == pytest.approx(memory_time(cast_fwd, H100, cal) + overheads, rel=1e-9)
    assert te.bwd_memory - bf16.bwd_memory == pytest.approx(memory_time(cast_bwd, H100, cal) + overheads, rel=1e-9)
    assert fused.fwd_memory < te.fwd_memory  # the fused stack: its fused QKV and element-wise kernels
    assert saved_gemm_input_bytes("fp8", "eager", 2) == 2 and saved_gemm_input_bytes("fp8", "eager", 2, "transformer-engine") == 1
    assert saved_gemm_input_bytes("fp8", "fused", 2) == 1 and saved_gemm_input_bytes("bf16", "eager", 2, "transformer-engine") == 2
    plan = TrainingPlan.of(dp=8, global_batch=8, seq_len=4096, precision=FP8, kernels="eager", fp8_linears="transformer-engine")
    assert plan.stack.fp8_library == "transformer-engine" and plan.replace(**{"fp8_linears": "auto"}).stack.fp8_library == "torchao"
    with pytest.raises(ValueError, match="fp8_linears torchao"):
        TrainingPlan.of(dp=8, global_batch=8, seq_len=4096, precision=FP8, kernels="fused", fp8_linears="torchao")
    est = [estimate(m8, ClusterSpec.of(H100, 8), plan.replace(**{"fp8_linears": x})) for x in ("auto", "transformer-engine")]
    assert est[1].time.step_s < est[0].time.step_s and est[1].peak_bytes < est[0].peak_bytes
