"""FSDP2's copy-out and copy-in on the compute stream (meshplan.cost.fsdp_copies): their bytes
against torch's own ops, and what they add to a step on the torch stacks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshplan.accuracy import map_runs
from meshplan.catalog import load_gpu, load_model
from meshplan.cost.calibration import calibration_for
from meshplan.cost.fsdp_copies import copy_in_bytes, copy_out_bytes, fsdp2_step_copy_times, fsdp2_unit_copy_times, runs_fsdp2
from meshplan.cost.kernel_time import memory_time
from meshplan.cost.params import embedding_params_per_rank, head_params_per_rank, layer_params_per_rank
from meshplan.estimate import estimate
from meshplan.search.engine import Engine
from meshplan.search.space import SearchLimits, enumerate_plans
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan

import meshplan.cost.terms as terms_mod  # where estimate and the search take the FSDP2 copies from

BF16 = PrecisionRecipe(precision="bf16", grad_dtype="fp32")  # torchtitan's: bf16 parameters, fp32 reduction


def test_copy_bytes_of_a_llama3_8b_layer():
    m = load_model("llama3-8b")
    p = layer_params_per_rank(m, 1)
    assert p == 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096 == 218_112_000
    assert copy_out_bytes(p, BF16) == 872_448_000  # the gathered bf16 buffer read, the parameters written
    assert copy_in_bytes(p, BF16) == 1_308_672_000  # bf16 gradients read, fp32 written
    assert copy_in_bytes(p, BF16, accumulated=True) == 1_744_896_000  # fp32 accumulated gradients read
    gpu = load_gpu("h100-sxm-80gb")
    cal = calibration_for(gpu)
    times = fsdp2_unit_copy_times(m, 1, 1, BF16, gpu, cal)
    assert times[:2] == (memory_time(872_448_000, gpu, cal), memory_time(1_308_672_000, gpu, cal))
    assert times[2] == memory_time(2 * embedding_params_per_rank(m, 1) * 2, gpu, cal)
    assert times[4] == memory_time(2 * head_params_per_rank(m, 1, 1) * 2, gpu, cal)
    copy_in, copy_out = fsdp2_step_copy_times(10 * p, 10, BF16, gpu, cal)
    assert copy_out == memory_time(10 * 872_448_000, gpu, cal) + 9 * cal.kernel_overhead


def test_only_torch_zero3_is_fsdp2():
    assert runs_fsdp2(3, "compiled") and runs_fsdp2(3, "eager")
    assert not runs_fsdp2(3, "fused") and not runs_fsdp2(1, "eager") and not runs_fsdp2(2, "compiled")


def test_torch_fsdp2_copies_are_the_costed_bytes():
    """torch's own FSDP2 under torchtitan's mixed precision on two gloo ranks: per unit of P = 8,192
    parameters, each all-gather's copy-out moves 2·P·2 bytes and each reduce-scatter's copy-in
    P·(2 + 4), forward and backward (weights resharded after forward)."""
    pytest.importorskip("torch")
    from fsdp_copy_support import WIDTHS, copy_records, on_two_ranks

    ranks = on_two_ranks(copy_records)
    units = [a * b for a, b in zip(WIDTHS, WIDTHS[1:])]
    assert units == [8192, 8192]
    expected = sorted([("copy_out", "forward", copy_out_bytes(p, BF16)) for p in units]
                      + [("copy_out", "backward", copy_out_bytes(p, BF16)) for p in units]
                      + [("copy_in", "backward", copy_in_bytes(p, BF16)) for p in units])
    assert expected[0] == ("copy_in", "backward", 49_152) and expected[-1] == ("copy_out", "forward", 32_768)
    for records in ranks:
        assert sorted(records) == expected


def _without_copies(monkeypatch):
    monkeypatch.setattr(terms_mod, "fsdp2_unit_copy_times", lambda *a, **k: (0.0,) * 6)
    monkeypatch.setattr(terms_mod, "fsdp2_step_copy_times", lambda *a, **k: (0.0, 0.0))


def test_torchtitan_8b_step_gains_each_copy_once_per_gather_and_reduction(monkeypatch):
    run = {r.id: r for r in map_runs()}["torchtitan_8b_8gpu_fsdp_compile"]
    model, cluster, plan = run.model, run.cluster, run.plan
    assert plan.pp == 1 and plan.stack.reshard_after_forward and not model.tied_embeddings and plan.stack.fsdp_head_in_root
    co, ci, e_co, e_ci, h_co, h_ci = fsdp2_unit_copy_times(model, 1, 1, plan.precision, cluster.gpu, calibration_for(cluster.gpu))
    # every layer gathers forward and again backward; the head unit gathers once, and so does the
    # embedding in torchtitan's 2024 root unit (never resharded after forward), twice as a unit of its own
    for head_in_root, embedding_gathers in ((True, 1), (False, 2)):
        p = plan.replace(**{"fsdp_head_in_root": head_in_root})
        with monkeypatch.context() as m:
            with_copies = estimate(model, cluster, p)
            _without_copies(m)
            without = estimate(model, cluster, p)
        per_micro_batch = model.n_layers * (2 * co + ci) + embedding_gathers * e_co + e_ci + h_co + h_ci
        added = p.grad_accum * per_micro_batch
        assert math.isclose(with_copies.time.fsdp_comm_s - without.time.fsdp_comm_s, added, rel_tol=1e-9)
        assert math.isclose(with_copies.time.step_s - without.time.step_s, added, rel_tol=1e-9)
    assert 0.055 < added < 0.060  # 3.05 GB per layer at 80 % of the 2.4 TB/s: 2.7 % of the step
    # the fused stack's ZeRO-3 makes no such copies (compared with the last plan: embedding its own unit)
    fused = plan.replace(**{"kernels": "fused", "fsdp_head_in_root": False})
    assert estimate(model, cluster, fused).time.fsdp_comm_s == without.time.fsdp_comm_s


def test_once_per_step_copies_on_the_405b_pipeline_rows(monkeypatch):
    run = {r.id: r for r in map_runs()}["torchtitan_405b_512gpu_3d_1f1b"]
    model, cluster, plan = run.model, run.cluster, run.plan
    assert plan.stack.fsdp_accumulate_unsharded and not plan.stack.overlap_grad_reduce
    with_copies = estimate(model, cluster, plan)
    _without_copies(monkeypatch)
    without = estimate(model, cluster, plan)
    assert with_copies.time.fsdp_comm_s == without.time.fsdp_comm_s  # nothing per micro-batch
    assert 0.0 < with_copies.time.step_s - without.time.step_s < 0.1


@pytest.mark.parametrize("name,gpus", [("llama3-8b", 16), ("mixtral-8x7b", 32)])
def test_search_step_equals_estimate_on_torch_fsdp2(name, gpus):
    """Without a pipeline the screen's step bound is the step: on the compiled stack it carries the
    same copies as ``estimate`` (the MoE layers' their own, over E/ep experts)."""
    model, cluster = load_model(name), ClusterSpec.of(load_gpu("h100-sxm-80gb"), gpus)
    base = TrainingPlan.of(global_batch=32, seq_len=8192, kernels="compiled")
    table = enumerate_plans(model, gpus, cluster.gpus_per_node, 8192, (32,), SearchLimits(max_micro_batch=2, max_tp=2, max_pp=1))
    screen = Engine(model, cluster, base).evaluate(table)
    rows = [i for i in range(len(table)) if table.zero[i] == 3 and table.pp[i] == 1]
    if model.is_moe:
        assert {int(table.ep[i]) for i in rows} > {1}
    assert len(rows) >= 8
    for i in np.random.default_rng(5).choice(rows, 8, replace=False).tolist():
        plan = TrainingPlan.of(**{**base.model_dump(), **table.row(i)})
        assert screen.step_lower_bound[i] == pytest.approx(estimate(model, cluster, plan).time.step_s, rel=1e-9), table.row(i)


def test_explain_shows_the_copies_on_the_torch_stack_only():
    run = {r.id: r for r in map_runs()}["torchtitan_8b_8gpu_fsdp_compile"]
    for kernels, shown in (("compiled", True), ("fused", False)):
        est = estimate(run.model, run.cluster, run.plan.replace(**{"kernels": kernels}))
        d = next(x for x in est.derivations if x.key == "time.fsdp")
        symbols = dict(d.symbols)
        assert ("copies" in symbols) is shown and ("FSDP2" in d.formula) is shown
        assert symbols["P"].startswith("218,112,000 parameters")
        assert d.value.startswith(f"{est.time.fsdp_comm_s * 1e3:.2f} ms")
    ddp = estimate(run.model, run.cluster, run.plan.replace(**{"zero": 1}))
    assert not any(x.key == "time.fsdp" for x in ddp.derivations)


def test_torch_fsdp2_keeps_two_all_gather_buffers_in_the_forward():
    """torch's own FSDP2 (torchtitan's mixed precision, two gloo ranks, a unit of 655,360 parameters
    before four blocks of 1,310,720): the forward allocates each unit's flat bf16
    all-gather buffer (2·P bytes) and frees the previous unit's only after it, as
    meshplan.cost.allocator.all_gather_pool_bytes replays them; the pool of that order is the
    smaller unit plus two blocks (a block does not fit the smaller unit's hole)."""
    pytest.importorskip("torch")
    from fsdp_copy_support import POOL_UNITS, gather_buffer_events, on_two_ranks

    from meshplan.cost.allocator import CachingAllocator, all_gather_pool_bytes

    ranks = on_two_ranks(gather_buffer_events)
    sizes = [2 * p for p in POOL_UNITS]
    order = [("alloc", sizes[0], 0)]
    for i in range(1, len(sizes)):
        order += [("alloc", sizes[i], i), ("free", sizes[i - 1], i - 1)]
    for events in ranks:
        # the last unit's buffer is freed by the root's post-forward or with the next all-gather
        assert events[:len(order)] == order and events[len(order):] in ([], [("free", sizes[-1], len(sizes) - 1)])
        events = events[:len(order)]
        pool, where = CachingAllocator(), {}
        for kind, nbytes, i in events:
            if kind == "alloc":
                where[i] = pool.malloc(nbytes)
            else:
                pool.release(where.pop(i))
        assert pool.peak_reserved == all_gather_pool_bytes(sizes) == sizes[0] + 2 * sizes[1]


def test_all_gather_pool_of_real_units():
    """The pool's three shapes at real sizes (bytes, 512-byte multiples): equal blocks reserve two;
    a smaller unit first (a 405B first pipeline rank: the embedding's 0.49 GiB before 0.74 GiB
    blocks) adds its hole; a larger one (torchtitan's 2024 root unit of Llama 3 8B, embedding and LM
    head, 1.96 GiB, before 0.41 GiB blocks) one block beside it."""
    from meshplan.catalog import load_model
    from meshplan.cost.allocator import all_gather_pool_bytes
    from meshplan.cost.fsdp_copies import gather_pool_bytes
    from meshplan.cost.params import embedding_params_per_rank, head_params_per_rank, layer_params_per_rank

    b405, e405 = layer_params_per_rank(load_model("llama3-405b"), 8) * 2, embedding_params_per_rank(load_model("llama3-405b"), 8) * 2
    assert all_gather_pool_bytes([b405] * 16) == 2 * b405
    assert gather_pool_bytes(load_model("llama3-405b"), 8, 8, ((15, True, False),), 2) == e405 + 2 * b405
    assert e405 < b405 and round((e405 + 2 * b405) / 2**30, 2) == 1.97
    m8 = load_model("llama3-8b")
    root, b8 = (embedding_params_per_rank(m8, 1) + head_params_per_rank(m8, 1, 1)) * 2, layer_params_per_rank(m8, 1) * 2
    assert gather_pool_bytes(m8, 1, 1, ((32, True, True),), 2, head_in_root=True) == root + b8
    # the 2025 units: the embedding first, the blocks in its hole, the final norm + LM head last,
    # larger than the embedding by the norm's 8,192 bytes: the segment grows by that much
    head = head_params_per_rank(m8, 1, 1) * 2
    assert head - embedding_params_per_rank(m8, 1) * 2 == 4096 * 2
    assert gather_pool_bytes(m8, 1, 1, ((32, True, True),), 2) == head + b8


def test_estimate_counts_the_pool_beside_each_moment():
    """FSDP2's pool stands beside the compute stream's peak: in full where weights stay gathered
    (torch's pipeline with FSDP2, the 405B first rank: 0.49 + 2 x 0.74 GiB) or at the loss, and
    less the prefetched layer, which meshplan counts unsharded, at a layer's backward when
    weights are resharded after forward. Megatron's ZeRO (fused stack) has no such pool."""
    from meshplan.catalog import load_gpu, load_model
    from meshplan.cost.fsdp_copies import gather_pool_bytes
    from meshplan.cost.params import embedding_params_per_rank, layer_params_per_rank
    from meshplan.estimate import estimate
    from meshplan.specs import ClusterSpec, TrainingPlan

    m405 = load_model("llama3-405b")
    piped = TrainingPlan.of(tp=8, pp=8, dp=8, zero=3, global_batch=256, seq_len=8192, recompute="full", kernels="compiled",
                         reshard_after_forward=False, fsdp_accumulate_unsharded=True, pp_buffers="per-micro-batch", micro_batch=4)
    est = estimate(m405, ClusterSpec.of(load_gpu("h100-sxm-80gb"), 512), piped)
    assert est.stages[0].other_items["all_gather_pool"] == gather_pool_bytes(m405, 8, 8, ((15, True, False),), 2)
    assert est.stages[1].other_items["all_gather_pool"] == 2 * layer_params_per_rank(m405, 8) * 2
    m8, h100 = load_model("llama3-8b"), load_gpu("h100-sxm-80gb")
    block = layer_params_per_rank(m8, 1) * 2
    # at the loss (the LM head's rank, its loss buffers the larger moment): the whole pool, the
    # final norm + LM head unit's buffer beside a block's
    flat = TrainingPlan.of(dp=8, zero=3, global_batch=16, micro_batch=2, seq_len=8192, recompute="op", kernels="compiled")
    one = estimate(m8, ClusterSpec.of(h100, 8), flat).stages[0]
    assert one.other_items["logits_grad"] > 0 and "working_set_not_yet_built" in one.activation_items  # the loss's moment
    assert one.other_items["all_gather_pool"] == gather_pool_bytes(m8, 1, 1, ((32, True, True),), 2)
    # at a layer's backward (the first of two pipeline ranks, resharding after forward): the pool
    # of the embedding and two blocks, less the prefetched block counted unsharded
    piped = flat.replace(**{"pp": 2, "dp": 4})
    first = estimate(m8, ClusterSpec.of(h100, 8), piped).stages[0]
    assert "logits_grad" not in first.other_items
    pool = gather_pool_bytes(m8, 1, 2, ((16, True, False),), 2)
    assert pool == embedding_params_per_rank(m8, 1) * 2 + block  # the embedding larger than a block
    assert first.other_items["all_gather_pool"] == pool - block
    fused = estimate(m8, ClusterSpec.of(h100, 8), flat.replace(**{"kernels": "fused"})).stages[0]
    assert "all_gather_pool" not in fused.other_items
