"""The search space's enumeration against a second derivation: every combination of every axis
and switch walked one at a time in nested loops, each rejected under the first rule of
``REASONS`` it breaks (the order the module docstring states). The vectorized enumeration must give
the same plans in the same order and the same counts per reason."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshplan.catalog import load_model
from meshplan.pipeline.schedules import SCHEDULES
from meshplan.search.space import COLUMNS, RECOMPUTE, SCHEDULE_NAMES, SearchLimits, enumerate_plans
from meshplan.specs.rules import REASONS
from meshplan.specs.rules import MAX_PIPELINE_CHUNKS


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _first_broken(model, seq, t, c, p, d, ep, name, v, gb, b, sp, sh) -> str | None:
    """The first rule of REASONS that the plan breaks, each written out from its description."""
    g = model.n_kv_heads
    heads_ok = model.n_heads % t == 0 and (g % t == 0 or t % g == 0) and model.ffn_hidden % t == 0
    if not (heads_ok and model.expert_ffn_hidden % t == 0 and model.shared_expert_ffn_hidden % t == 0):
        return "tp_heads"
    if c > 1 and seq % (2 * c):
        return "cp_seq"
    if p * v > model.n_layers + 2:
        return "stages_layers"
    if gb % (b * d):
        return "batch_divisible"
    m = gb // (b * d)
    if name in ("interleaved", "interleaved-zb") and m % max(1, m // p):
        return "interleaved_rounds"
    if m * p * v > MAX_PIPELINE_CHUNKS:
        return "pipeline_size"
    if sp and t > 1 and (seq // c) % t:
        return "sp_seq"
    if ep > 1 and t > 1 and not sp:
        return "ep_sp"
    if ep > 1 and sh != d:
        return "ep_hsdp"
    return None


def _walk(model, n, gpus_per_node, seq, batches, lim):
    """(plans as tuples of COLUMNS, rejected counts) by nested loops, in the enumeration's order:
    mesh (tp, cp, pp), schedule and vpp, batch, micro-batch, then ep, TP overlap, recompute, SP,
    ZeRO stage and shard group."""
    rows, rejected = [], {}
    max_tp = lim.max_tp or gpus_per_node
    modes = [RECOMPUTE.index(r) for r in lim.recompute if not (r == "op" and (model.is_moe or model.is_mla))]
    for t in [x for x in _divisors(n) if x <= max_tp]:
        for c in [x for x in _divisors(n) if x <= lim.max_cp]:
            for p in [x for x in _divisors(n) if x <= lim.max_pp]:
                if n % (t * c * p):
                    continue
                d = n // (t * c * p)
                eps = [1] if not model.is_moe else [e for e in _divisors(math.gcd(model.n_experts, d))]
                schedules = [("1f1b", 1)] if p == 1 else [
                    (name, v) for name in lim.schedules
                    for v in ({"1": [1], "2": [2]}.get(SCHEDULES[name][0]) or range(2, lim.max_vpp + 1))
                ]
                shards = [(z, d) for z in lim.zero]
                if lim.hsdp:
                    shards += [(z, s) for z in lim.zero if z >= 1 for s in _divisors(d) if 1 < s < d]
                for name, v in schedules:
                    for gb in batches:
                        for b in range(1, lim.max_micro_batch + 1):
                            for ep in eps:
                                for tpo in (lim.tp_comm_overlap if t > 1 else (False,)):
                                    for rc in modes:
                                        for sp in (lim.sequence_parallel if t > 1 else (False,)):
                                            for z, sh in shards:
                                                why = _first_broken(model, seq, t, c, p, d, ep, name, v, gb, b, sp, sh)
                                                if why:
                                                    rejected[why] = rejected.get(why, 0) + 1
                                                    continue
                                                row = dict(tp=t, cp=c, pp=p, dp=d, dp_shard=sh, ep=ep, vpp=v,
                                                           schedule=SCHEDULE_NAMES.index(name), micro_batch=b,
                                                           global_batch=gb, recompute=rc, sp=sp, tpo=tpo, zero=z)
                                                rows.append(tuple(int(row[k]) for k in COLUMNS))
    return rows, rejected


SPACES = [
    # every rule breaks somewhere: tp 3 and 6 divide no head count (tp_heads); seq 1,020 is not a
    # multiple of 2·cp for cp = 4 (cp_seq) nor of tp = 8 (sp_seq); pp·vpp reaches 24·4 > 34 layers;
    # batches that split unevenly or into uneven interleaved rounds
    ("llama3-8b", 24, 1020, (24, 48, 72), SearchLimits(max_cp=4, max_pp=24, max_vpp=4, max_micro_batch=3, hsdp=True,
                                                       tp_comm_overlap=(True, False))),
    # mixture of experts: ep over dp, ep with TP but no SP (ep_sp), ep with HSDP (ep_hsdp)
    ("mixtral-8x7b", 16, 2048, (32,), SearchLimits(max_pp=4, max_vpp=3, max_micro_batch=2, hsdp=True)),
    # 2^20 sequences of one token on 2 GPUs: the pipeline simulation's size limit
    ("llama3-8b", 2, 8, (2**20,), SearchLimits(max_micro_batch=2, recompute=("none",), zero=(1,))),
]


@pytest.mark.parametrize("name,n,seq,batches,lim", SPACES)
def test_enumeration_is_the_nested_loops(name, n, seq, batches, lim):
    model = load_model(name)
    rows, rejected = _walk(model, n, 8, seq, batches, lim)
    table = enumerate_plans(model, n, 8, seq, batches, lim)
    got = list(zip(*(getattr(table, k).astype(np.int64).tolist() for k in COLUMNS)))
    assert got == rows
    assert table.rejected == rejected
    assert set(rejected) <= set(REASONS)


def test_every_rule_is_exercised():
    """The spaces above break every structural rule at least once (a rule no space breaks would
    leave its counting untested)."""
    seen = set()
    for name, n, seq, batches, lim in SPACES:
        seen |= set(enumerate_plans(load_model(name), n, 8, seq, batches, lim).rejected)
    assert seen == set(REASONS) - {"memory"}


def test_a_plan_breaking_two_rules_counts_under_the_first():
    # tp = 3 divides no head count, and pp·vpp = 8·5 .. 8·8 exceeds 32 + 2 layers: tp_heads, not stages_layers
    model = load_model("llama3-8b")
    lim = SearchLimits(tp=3, pp=8, cp=1, max_vpp=8, micro_batch=1, schedules=("interleaved",), recompute=("none",),
                       zero=(1,), sequence_parallel=(True,))
    table = enumerate_plans(model, 24, 8, 4096, (24,), lim)
    assert len(table) == 0
    assert table.rejected == {"tp_heads": 7}  # v = 2 .. 8, all counted under the first rule


def test_an_oversized_space_is_refused_before_its_table_is_built():
    """Llama 3 405B on 16,384 GPUs with HSDP and a 4M-64M token batch range holds
    4,940,260 plans (every schedule and recompute mode); under a bound of 1,000,000 (the web's) it
    is refused by count, with one line naming the field and the limit, before its columns exist:
    under 20 MB traced."""
    import tracemalloc

    from meshplan.errors import InputError

    model = load_model("llama3-405b")
    batches = tuple(2**k * 1024 for k in range(5))  # 4M … 64M tokens of 4,096
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as err:
            enumerate_plans(model, 16384, 8, 4096, batches, SearchLimits(hsdp=True, max_plans=1_000_000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(err.value) == ("search: the space holds 4,940,260 plans, more than the 1,000,000 a search may evaluate; "
                              "fix an axis (tp, pp, ...), narrow --batch-range or lower a --max-* limit")
    assert peak < 20e6
