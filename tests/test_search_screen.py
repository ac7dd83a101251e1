"""The screening's exactness, plan kind by plan kind: peak memory equal to ``estimate``'s to the bit
and a step bound no larger than the simulated step, on plans drawn from every kind of the space
(each schedule, expert and context parallelism, ZeRO stages and HSDP shard groups, TP overlap on
and off), and the all-ranks-at-once live counts it uses against the per-rank ones."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from meshplan.catalog import load_gpu, load_model, load_stack, stack_names
from meshplan.estimate import estimate
from meshplan.pipeline.inflight import distinct_state_rows, live_rows, state_rows, state_rows_many, undominated
from meshplan.pipeline.live import padded_peak_bytes, peak_bytes
from meshplan.pipeline.schedules import SCHEDULES
from meshplan.search.engine import Engine
from meshplan.search.space import SCHEDULE_NAMES, SearchLimits, enumerate_plans
from meshplan.specs.hardware import ClusterSpec
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan

from screen_support import peaks_match, sampled_peaks_match

H100 = load_gpu("h100-sxm-80gb")
BOTH = (True, False)

SPACES = [
    # model, gpus, seq_len, global batch (sequences), limits: every schedule in each
    ("mixtral-8x7b", 32, 4096, 64, SearchLimits(max_micro_batch=2, max_vpp=3, tp_comm_overlap=BOTH)),  # MoE, ep
    ("llama3-70b", 64, 8192, 64, SearchLimits(max_micro_batch=2, max_vpp=4, max_cp=4, hsdp=True, tp_comm_overlap=BOTH)),
    ("gpt3-175b", 128, 2048, 256, SearchLimits(max_micro_batch=4, max_vpp=6, max_tp=8, tp_comm_overlap=BOTH)),
]


def _kinds(table) -> dict[tuple, list[int]]:
    """Plans by kind: schedule, ep > 1, cp > 1, HSDP, TP overlap, ZeRO stage."""
    key = np.stack([table.schedule, table.ep > 1, table.cp > 1, table.dp_shard < table.dp, table.tpo, table.zero], axis=1)
    kinds: dict[tuple, list[int]] = {}
    for i, k in enumerate(map(tuple, key.tolist())):
        kinds.setdefault(k, []).append(i)
    return kinds


@pytest.mark.parametrize("name,gpus,seq,gb,limits", SPACES)
def test_every_kind_of_plan_screens_to_estimates_memory_and_below_its_step(name, gpus, seq, gb, limits):
    model, cluster = load_model(name), ClusterSpec.of(H100, gpus)
    base = TrainingPlan(global_batch=gb, seq_len=seq)
    table = enumerate_plans(model, gpus, cluster.gpus_per_node, seq, (gb,), limits)
    kinds = _kinds(table)
    # the space holds every schedule, and the switches the space varies both ways
    assert {k[0] for k in kinds} == set(range(len(SCHEDULE_NAMES)))
    assert {k[4] for k in kinds} == {0, 1} and {k[5] for k in kinds} == {0, 1, 2, 3}
    if model.is_moe:
        assert {k[1] for k in kinds} == {0, 1}
    if limits.hsdp:
        assert {k[2] for k in kinds} == {0, 1} and {k[3] for k in kinds} == {0, 1}
    screen = Engine(model, cluster, base).evaluate(table)
    rng = np.random.default_rng(11)
    checked = 0
    for members in kinds.values():
        for i in rng.choice(members, min(1, len(members)), replace=False).tolist():
            plan = TrainingPlan.of(**{**base.model_dump(), **table.row(i)})
            est = estimate(model, cluster, plan)
            assert screen.peak_bytes[i] == est.peak_bytes, table.row(i)
            assert screen.worst_rank[i] == max(range(len(est.stages)), key=lambda r: est.stages[r].total)
            assert screen.step_lower_bound[i] <= est.time.step_s, table.row(i)
            checked += 1
    assert checked == len(kinds) >= 60


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_state_rows_hold_every_ranks_live_rows_and_no_more(name):
    """Undominated, each rank's state rows are its :func:`live_rows`; the padded peak of all ranks
    at once is each rank's :func:`peak_bytes` to the bit."""
    rng = np.random.default_rng(3)
    vs = {"1": [1], "2": [2]}.get(SCHEDULES[name][0], [2, 3, 4])
    cases = 0
    for pp in (1, 2, 3, 4, 6, 8):
        for v in vs:
            for m in range(1, 3 * pp + 2):
                if SCHEDULES[name][0] == ">=2" and m % max(1, m // pp):
                    continue  # interleaved schedules run the micro-batches in equal rounds of pp
                try:
                    want = live_rows(name, pp, m, v)
                except ValueError:
                    continue
                rows = state_rows(name, pp, m, v)
                assert rows.shape[0] == pp and rows.shape[2] == v
                act = rng.uniform(0, 1e9, size=(5, pp, v))
                got = padded_peak_bytes(rows, act)
                for r in range(pp):
                    held = rows[r][rows[r].any(axis=1)]  # the padding dropped
                    assert undominated(held).tolist() == want[r].tolist(), (pp, m, v, r)
                    for i in range(len(act)):
                        assert got[i, r] == peak_bytes(want[r], act[i, r]), (pp, m, v, r)
                cases += 1
    assert cases >= 20


def test_state_rows_real_values():
    # 1F1B, p = 4, m = 8: rank r holds p − r micro-batches at its peak (Narayanan et al. 2021)
    assert state_rows("1f1b", 4, 8, 1)[:, :, 0].tolist() == [[4], [3], [2], [1]]
    # GPipe holds all m on every rank
    assert state_rows("gpipe", 3, 5, 1).tolist() == [[[5]], [[5]], [[5]]]
    # ZBV, p = 4, m = 8: the rows P, A0, B0 (tests/test_search.py lists the undominated ones)
    assert state_rows("zbv", 4, 8, 2)[0].tolist() == [[7, 1], [8, 0], [7, 1]]
    # ZBV with n = p: P alone, the other rows zero
    assert state_rows("zbv", 1, 1, 2).tolist() == [[[1, 1], [0, 0], [0, 0]]]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_state_rows_of_many_counts_at_once_are_each_counts_padded(name):
    """``state_rows_many`` over several micro-batch counts gives each count's ``state_rows``,
    padded with all-zero rows to the longest, and the same peaks to the bit."""
    rng = np.random.default_rng(5)
    vs = {"1": [1], "2": [2]}.get(SCHEDULES[name][0], [2, 3, 4])
    cases = 0
    for pp in (1, 2, 3, 4, 8):
        for v in vs:
            ms = [m for m in range(1, 3 * pp + 2) if SCHEDULES[name][0] != ">=2" or m % max(1, m // pp) == 0]
            many = state_rows_many(name, pp, ms, v)
            assert many.shape[:2] == (len(ms), pp) and many.shape[3] == v
            for i, m in enumerate(ms):
                one = state_rows(name, pp, m, v)
                assert one.shape[1] <= many.shape[2]
                assert many[i, :, : one.shape[1]].tolist() == one.tolist(), (pp, m, v)
                assert not many[i, :, one.shape[1]:].any()
                act = rng.uniform(0, 1e9, size=(3, pp, v))
                assert padded_peak_bytes(many[i], act).tolist() == padded_peak_bytes(one, act).tolist()
                cases += 1
    assert cases >= 15


def test_distinct_state_rows_drop_repeats_and_zero_rows_only():
    rows = np.array([[[1, 0], [2, 1], [1, 0], [0, 0]], [[0, 0], [0, 0], [3, 3], [0, 0]]])
    # rank 0: (1, 0) twice and a zero row; rank 1: one row; codes 1·K + 0 < 2·K + 1 (K = 4)
    assert distinct_state_rows(rows).tolist() == [[[1, 0], [2, 1]], [[3, 3], [0, 0]]]
    assert distinct_state_rows(np.zeros((2, 3, 2), dtype=np.int64)).tolist() == [[[0, 0]], [[0, 0]]]
    rng = np.random.default_rng(9)
    for name, pp, ms, v in (("interleaved", 4, [4, 8], 3), ("interleaved-zb", 8, [8, 16, 24], 2), ("zbv", 4, [3, 8], 2)):
        many = state_rows_many(name, pp, ms, v)
        kept = distinct_state_rows(many)
        assert kept.shape[2] <= many.shape[2]
        for i in range(len(ms)):
            for r in range(pp):
                want = {tuple(x) for x in many[i, r].tolist() if any(x)}
                got = [tuple(x) for x in kept[i, r].tolist() if any(x)]
                assert len(got) == len(set(got)) and set(got) == want
            act = rng.uniform(0, 1e9, size=(4, pp, v))
            assert padded_peak_bytes(kept[i], act).tolist() == padded_peak_bytes(many[i], act).tolist()


def test_screen_does_not_depend_on_the_order_of_the_plans():
    """Plans are sorted by pipeline shape and evaluated as slices: a shuffled table gives every
    plan the same memory, worst rank and bound, to the bit."""
    model, cluster = load_model("gemma2-9b"), ClusterSpec.of(H100, 16)  # tied embedding: pp = 1 keeps it
    base = TrainingPlan(global_batch=64, seq_len=4096)
    table = enumerate_plans(model, 16, cluster.gpus_per_node, 4096, (64,), SearchLimits(max_micro_batch=2, hsdp=True))
    engine = Engine(model, cluster, base)
    a = engine.evaluate(table)
    perm = np.random.default_rng(2).permutation(len(table))
    b = Engine(model, cluster, base).evaluate(table.take(perm))
    assert np.array_equal(a.peak_bytes[perm], b.peak_bytes)
    assert np.array_equal(a.worst_rank[perm], b.worst_rank)
    assert np.array_equal(a.step_lower_bound[perm], b.step_lower_bound)
    assert len(set(table.pp.tolist())) > 3 and (table.pp == 1).any()


@pytest.mark.parametrize("name,gpus", [("gemma2-9b", 16), ("mixtral-8x7b", 16)])
def test_screen_does_not_depend_on_how_plans_are_batched(name, gpus, monkeypatch):
    """The rank classes' state is computed in one call or split by LM head, by size: both ways
    give the same bits (a tied embedding is kept at pp = 1; MoE layers add their own terms)."""
    engine_module = importlib.import_module("meshplan.search.engine")  # meshplan.search is the function

    model, cluster = load_model(name), ClusterSpec.of(H100, gpus)
    base = TrainingPlan(global_batch=32, seq_len=4096)
    table = enumerate_plans(model, gpus, cluster.gpus_per_node, 4096, (32,), SearchLimits(max_micro_batch=2, max_vpp=3, hsdp=True))
    screens = []
    for run in (1, engine_module._RUN, 10**9):  # always split / the default / one call
        monkeypatch.setattr(engine_module, "_RUN", run)
        screens.append(Engine(model, cluster, base).evaluate(table))
    for other in screens[1:]:
        assert np.array_equal(screens[0].peak_bytes, other.peak_bytes)
        assert np.array_equal(screens[0].worst_rank, other.worst_rank)
        assert np.array_equal(screens[0].step_lower_bound, other.step_lower_bound)
    assert (table.pp == 1).any() and (table.pp > 1).any() and len(table) > 1000


@pytest.mark.parametrize("buffers,stack", [("in-flight", "megatron-core"), ("per-micro-batch", "megatron-core"),
                                           ("per-micro-batch", "torchtitan")])
def test_screen_of_several_global_batches_is_each_batch_s_own(buffers, stack):
    """With ``--batch-range`` the table holds several global batches: plans that differ only in
    the batch share every term but the micro-batch count (the live activations, per-micro-batch
    pipeline buffers, busy time), so the engine must keep them apart. Each plan's memory, worst
    rank and bound equal those of the same plan screened in its own batch's table, and
    ``estimate``'s memory on a sample; on torchtitan's stack the gradient accumulation's passes
    (autograd's, FSDP2's) depend on m too."""
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(H100, 16)
    # torchtitan's plans as its pipelines run them: FSDP2 keeping the gradients unsharded
    base = TrainingPlan.of(global_batch=64, seq_len=4096, stack=load_stack(stack), pp_buffers=buffers, **(
        dict(pp=2, dp=8, zero=3, fsdp_accumulate_unsharded=True) if stack == "torchtitan" else {}))
    assert base.stack.fsdp_accumulate_unsharded == (stack == "torchtitan")
    limits = SearchLimits(max_micro_batch=2, max_vpp=3, hsdp=True, tp_comm_overlap=BOTH)
    table = enumerate_plans(model, 16, cluster.gpus_per_node, 4096, (32, 64, 128), limits)
    assert set(table.global_batch.tolist()) == {32, 64, 128}
    both = Engine(model, cluster, base).evaluate(table)
    for gb in (32, 64, 128):
        mine = np.flatnonzero(table.global_batch == gb)
        alone = Engine(model, cluster, base).evaluate(table.take(mine))
        assert np.array_equal(both.peak_bytes[mine], alone.peak_bytes)
        assert np.array_equal(both.worst_rank[mine], alone.worst_rank)
        assert np.array_equal(both.step_lower_bound[mine], alone.step_lower_bound)
    for i in np.random.default_rng(4).choice(len(table), 12, replace=False).tolist():
        est = estimate(model, cluster, TrainingPlan.of(**{**base.model_dump(), **table.row(i)}))
        assert both.peak_bytes[i] == est.peak_bytes and both.step_lower_bound[i] <= est.time.step_s, table.row(i)


def test_peak_and_worst_rank_from_class_maxima_equal_the_maximum_over_ranks():
    """The peak total and the first rank holding it, taken from each class's largest activations,
    equal the plain maximum over every rank's total, also where ranks tie exactly and where their
    activations differ by less than rounding keeps apart (the rank-by-rank branch)."""
    from meshplan.search.peaks import peak_rank

    rng = np.random.default_rng(5)
    cls_of = np.array([0, 1, 1, 1, 1, 2, 1, 3])  # an interior class spread over ranks, and single ones
    cls_ranks = [np.flatnonzero(cls_of == c) for c in range(4)]
    pairs, plans = 40, 400
    stored = rng.integers(0, 4, (pairs, len(cls_of))).astype(float) * 2.0**30
    stored[:10, [1, 2, 3, 4, 6]] = stored[:10, 1:2] + 1e-7 * np.arange(5)  # gaps far below an ulp of the totals
    stored[10:20, 1:5] = stored[10:20, 1:2]  # exact ties inside the interior class
    pair_inv = rng.integers(0, pairs, plans)
    fixed = rng.choice([2.0**33, 2.0**33 + 2.0**30, 3 * 2.0**31], (4, plans))
    working = rng.choice([0.0, 2.0**29, 1.5], plans)
    other = rng.choice([2.0**30, 2.0**30 - 2.0**29, 7.25], (4, plans))
    totals = (fixed[cls_of] + (stored[pair_inv].T + working)) + other[cls_of]
    peak, worst = peak_rank(stored, pair_inv, cls_of, cls_ranks, fixed, working, other)
    assert np.array_equal(peak, totals.max(axis=0))
    assert np.array_equal(worst, totals.argmax(axis=0))
    # the data reach the rank-by-rank branch: for some plans the first rank holding a class's
    # largest activations is not the first rank with the peak total (a smaller one rounds to it)
    by_class = [stored[:, r].max(axis=1)[pair_inv] for r in cls_ranks]
    first_of_max = np.array([
        min(int(r[stored[pair_inv[i], r] == by_class[c][i]][0]) for c, r in enumerate(cls_ranks)
            if (fixed[c, i] + (by_class[c][i] + working[i])) + other[c, i] == peak[i])
        for i in range(plans)
    ])
    assert (first_of_max != worst).any() and (first_of_max == worst).any()


@pytest.mark.parametrize("profile", stack_names())
def test_every_stack_profile_screens_to_estimates_memory_and_below_its_step(profile):
    # the stack's rules apply plan by plan (Engine._parts): torchtitan keeps ZeRO-3 weights gathered
    # and gradients unsharded through the step exactly where pp > 1, which the screen once missed
    # (19 GiB short on llama3-8b's pipelined ZeRO-3 plans, its bound above the step)
    model, cluster = load_model("llama3-8b"), ClusterSpec.of(H100, 16)
    stack = load_stack(profile)
    base = TrainingPlan.of(global_batch=32, seq_len=4096, stack=stack)
    limits = SearchLimits(max_micro_batch=2, max_vpp=2, max_tp=2, schedules=("1f1b", "interleaved", "zbh1"), tp_comm_overlap=BOTH)
    table = enumerate_plans(model, 16, cluster.gpus_per_node, 4096, (32,), limits)
    rng = np.random.default_rng(3)  # three plans of each ZeRO stage, with and without a pipeline
    rows = [i for z in (0, 1, 2, 3) for piped in BOTH
            for i in rng.choice(np.flatnonzero((table.zero == z) & ((table.pp > 1) == piped)), 3, replace=False).tolist()]
    peaks_match(model, cluster, base, table, rows, stack, bounds=True)


@pytest.mark.parametrize("name,gpus,precision", [("llama3-8b", 16, "fp8"), ("mixtral-8x7b", 32, "bf16")])
def test_fsdp2_fp8_all_gather_and_unsharded_accumulation_screen_to_estimate(name, gpus, precision):
    # FP8 all-gathers on pipelined ZeRO-3 (the step's one gather saves the FP8 bytes) and, in bf16,
    # the FP8 all-gather the rules set aside
    model, cluster = load_model(name), ClusterSpec.of(H100, gpus)
    stack = load_stack("torchtitan").model_copy(update={"fsdp_fp8_all_gather": True})
    base = TrainingPlan.of(global_batch=64, seq_len=4096, stack=stack, precision=PrecisionRecipe(precision=precision))
    limits = SearchLimits(max_micro_batch=2, max_vpp=2, max_tp=2, zero=(1, 3), schedules=("1f1b", "interleaved", "gpipe"))
    table = enumerate_plans(model, gpus, cluster.gpus_per_node, 4096, (64,), limits)
    plans = sampled_peaks_match(model, cluster, base, table, 40, seed=0, stack=stack, bounds=True)
    once = [p for p in plans if p.stack.fsdp_accumulate_unsharded]
    assert once and all(p.stack.fsdp_fp8_all_gather == (precision == "fp8") for p in once)
