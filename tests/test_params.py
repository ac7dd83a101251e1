"""Exact parameter counts: whole model, per TP rank, per pipeline stage, and the layer split.

Every total is an exact Python int compared with ``==``. The published totals are what
``sum(p.numel() for p in model.parameters())`` reports for the Hugging Face checkpoints (and what
the model cards print); GPT-3 175B is checked against Narayanan et al. 2021, Eq. 2.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.params import (
    count_params,
    embedding_params_per_rank,
    head_params_per_rank,
    kv_heads_per_rank,
    layer_params,
    layer_params_per_rank,
    padded_vocab,
)
from meshplan.errors import InputError
from meshplan.estimate import estimate
from meshplan.pipeline.stages import default_layer_split, layer_split, rank_of, split_problem, stages_of_rank
from meshplan.specs import ClusterSpec, TrainingPlan
from meshplan.specs.model import ModelSpec

CUSTOM_1B = "tests/data/models/custom.yaml"  # Llama 3.2 1B shape, tied embeddings

PUBLISHED_TOTALS = {
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
}


@pytest.mark.parametrize("name,total", sorted(PUBLISHED_TOTALS.items()))
def test_published_totals_exact(name, total):
    counts = count_params(load_model(name))
    assert isinstance(counts.total, int)
    assert counts.total == total


def test_llama3_8b_by_part():
    """Llama 3 8B by hand: h=4096, 32 query heads and 8 KV heads of 128, f=14336, V=128256."""
    c = count_params(load_model("llama3-8b"))
    h, q, kv, f, V, L = 4096, 32 * 128, 8 * 128, 14336, 128256, 32
    assert c.layer.attention_weights == h * q + 2 * h * kv + q * h == 41_943_040
    assert c.layer.mlp_weights == 3 * h * f == 176_160_768
    assert c.layer.norms == 2 * h
    assert c.layer.attention_biases == c.layer.mlp_biases == 0
    assert c.embedding == c.lm_head == V * h == 525_336_576
    assert c.final_norm == h
    assert c.position_embedding == 0
    assert c.total == L * (41_943_040 + 176_160_768 + 2 * h) + 2 * V * h + h
    assert c.non_embedding == c.total - 2 * V * h


def test_llama3_8b_matmul_params_match_flop_counter():
    """REFERENCES.md: torch's FlopCounterMode on the transformers Llama 3 8B, 1 x 2048 tokens,
    counts aten.mm = 92,217,242,812,416 = 6 x 7,504,658,432 x 2048: the matmul parameters are
    the layers' linear weights plus the LM head (embedding lookup and norms are not matmuls)."""
    c = count_params(load_model("llama3-8b"))
    assert c.matmul == 7_504_658_432
    assert c.matmul == 32 * (41_943_040 + 176_160_768) + 128256 * 4096
    assert 6 * c.matmul * 2048 == 92_217_242_812_416


def test_llama3_405b_matmul_params():
    c = count_params(load_model("llama3-405b"))
    assert c.matmul == 403_747_897_344
    # total - matmul = embedding lookup + norms: 128256·16384 + 126·2·16384 + 16384
    assert c.total - c.matmul == 128256 * 16384 + 126 * 2 * 16384 + 16384


def test_gpt3_175b_against_narayanan_eq2():
    """Narayanan et al. 2021 Eq. 2: P = 12·L·h²·(1 + 13/(12h) + (V+s)/(12·L·h)).

    Expanded: 12·L·h² (weights) + 13·L·h (per layer: QKV bias 3h, out bias h, MLP biases 4h + h,
    two LayerNorms 2·2h) + (V + s)·h (tied token embedding and s = 2048 learned positions).
    The identity is exact except for the final LayerNorm (weight and bias, 2h = 24,576), which
    Eq. 2 leaves out: meshplan counts it, as the GPT-2/3 code has it (ln_f)."""
    m = load_model("gpt3-175b")
    L, h, V, s = 96, 12288, 50257, 2048
    eq2 = 12 * L * h * h * (1 + Fraction(13, 12 * h) + Fraction(V + s, 12 * L * h))
    assert eq2.denominator == 1  # Eq. 2 is an integer for these shapes
    assert eq2 == 12 * L * h * h + 13 * L * h + (V + s) * h == 174_604_234_752
    c = count_params(m)
    assert c.total == eq2 + 2 * h == 174_604_259_328
    assert c.final_norm == 2 * h
    assert c.layer.total == 12 * h * h + 13 * h
    assert c.lm_head == 0  # tied
    assert c.lm_head_matmul == V * h  # ... but the LM head GEMM still runs
    assert c.position_embedding == s * h


def test_custom_tied_model_total():
    """Llama 3.2 1B shape with tied embeddings: 1,235,814,400 (the published count)."""
    m = load_model(CUSTOM_1B)
    c = count_params(m)
    assert c.total == 1_235_814_400
    assert c.lm_head == 0
    assert c.matmul == 16 * c.layer.matmul + 128256 * 2048


def test_two_matrix_vs_gated_mlp():
    base = dict(name="x", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, head_dim=16, ffn_hidden=256, vocab_size=100)
    gated = layer_params(ModelSpec(**base, mlp="swiglu"))
    plain = layer_params(ModelSpec(**base, mlp="gelu"))
    assert gated.mlp_weights == 3 * 64 * 256
    assert plain.mlp_weights == 2 * 64 * 256
    biased = layer_params(ModelSpec(**base, mlp="geglu", linear_bias=True, qkv_bias=True, norm="layernorm"))
    assert biased.mlp_biases == 2 * 256 + 64
    assert biased.attention_biases == 3 * 64 + 64
    assert biased.norms == 2 * 2 * 64


# ---- tensor parallel split -----------------------------------------------------------------


def replicated_per_layer(model: ModelSpec) -> int:
    """Parts every TP rank holds whole: the two norms and the row-parallel biases."""
    norms = layer_params(model).norms
    row_biases = 2 * model.hidden if model.linear_bias else 0  # attention out-proj + MLP out
    return norms + row_biases


@pytest.mark.parametrize(
    "name,tp",
    [("llama3-8b", 2), ("llama3-8b", 8), ("llama3-70b", 8), ("llama2-7b", 4), ("llama2-13b", 8), ("gpt3-175b", 8)],
)
def test_tp_split_sums_to_layer_plus_replicas(name, tp):
    m = load_model(name)
    assert m.n_kv_heads >= tp  # no K/V replication in these cases
    per_rank = layer_params_per_rank(m, tp)
    total = layer_params(m).total
    assert tp * per_rank == total + (tp - 1) * replicated_per_layer(m)


def test_tp_split_gpt3_by_hand():
    """GPT-3 175B, t = 8: replicated per rank = 2 LayerNorms (4h) + out-proj and fc2 biases (2h)."""
    m = load_model("gpt3-175b")
    h = 12288
    per_rank = layer_params_per_rank(m, 8)
    assert per_rank == (12 * h * h + 3 * h + 4 * h) // 8 + 6 * h
    assert 8 * per_rank == layer_params(m).total + 7 * 6 * h


@pytest.mark.parametrize("tp,expected_kv", [(1, 8), (2, 4), (4, 2), (8, 1), (16, 1), (32, 1)])
def test_kv_heads_per_rank(tp, expected_kv):
    assert kv_heads_per_rank(load_model("llama3-405b"), tp) == expected_kv


@pytest.mark.parametrize("tp", [16, 32])
def test_kv_replication_when_tp_exceeds_kv_heads(tp):
    """Llama 3 405B has 8 K/V heads: at t = 16 or 32 each rank keeps one whole K/V head, so the
    sum over ranks holds t K/V heads instead of 8: (t − 8)·2·h·d extra weights."""
    m = load_model("llama3-405b")
    h, d, g = 16384, 128, 8
    per_rank = layer_params_per_rank(m, tp)
    total = layer_params(m).total
    extra_kv = (tp - g) * 2 * h * d
    assert tp * per_rank == total + (tp - 1) * 2 * h + extra_kv
    # by hand: Q and out-proj 2·h·(128/t)·d, K and V one head each, MLP 3·h·f/t, norms 2h
    assert per_rank == 2 * h * (128 // tp) * d + 2 * h * d + 3 * h * (53248 // tp) + 2 * h


def test_padded_vocab_and_embedding_per_rank():
    gpt3 = load_model("gpt3-175b")
    assert padded_vocab(gpt3, 8) == 50264  # 50257 rounded up to a multiple of 8
    assert embedding_params_per_rank(gpt3, 8) == 6283 * 12288 + 2048 * 12288  # + learned positions
    llama = load_model("llama3-405b")
    assert padded_vocab(llama, 8) == 128256
    assert embedding_params_per_rank(llama, 8) == 16032 * 16384
    assert head_params_per_rank(llama, 8, 16) == 16032 * 16384 + 16384
    # tied head: shared on one stage, a copy of its own on the last stage when pp > 1
    tied = load_model(CUSTOM_1B)
    assert head_params_per_rank(tied, 1, 1) == 2048
    assert head_params_per_rank(tied, 1, 2) == 128256 * 2048 + 2048


# ---- per pipeline stage ----------------------------------------------------------------------


def _stage_params(model: ModelSpec, pp: int, vpp: int = 1, tp: int = 1) -> list[int]:
    gpus = pp * tp
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), gpus)
    plan = TrainingPlan(
        tp=tp, pp=pp, dp=1, vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b",
        micro_batch=1, global_batch=pp, seq_len=256, zero=0,
    )
    return [s.params for s in estimate(model, cluster, plan).stages]


@pytest.mark.parametrize("name,pp,vpp", [("llama3-8b", 1, 1), ("llama3-8b", 4, 1), ("llama3-8b", 2, 2), ("llama2-13b", 8, 1), ("llama3-70b", 8, 2)])
def test_stage_params_sum_to_total(name, pp, vpp):
    m = load_model(name)
    stages = _stage_params(m, pp, vpp)
    assert len(stages) == pp
    assert sum(stages) == count_params(m).total


def test_stage_params_by_hand_llama3_8b_pp4():
    m = load_model("llama3-8b")
    c = count_params(m)
    stages = _stage_params(m, 4)
    layer = c.layer.total
    assert stages == [8 * layer + c.embedding, 8 * layer, 8 * layer, 8 * layer + c.final_norm + c.lm_head]


def test_tied_model_last_stage_keeps_its_own_head():
    """A tied LM head shares the embedding on one stage; with pp > 1 the last stage holds a copy
    (Megatron and torchtitan both do), so the stages add up to the total plus V·h."""
    m = load_model(CUSTOM_1B)
    total = count_params(m).total
    assert sum(_stage_params(m, 1)) == total
    assert sum(_stage_params(m, 2)) == total + 128256 * 2048


def test_stage_params_with_tp():
    """With TP each stage's count is per GPU: t × (sum over stages) = total + replicas."""
    m = load_model("llama3-8b")
    stages = _stage_params(m, 2, tp=4)
    c = count_params(m)
    replicas = 32 * (4 - 1) * c.layer.norms + (4 - 1) * c.final_norm
    assert 4 * sum(stages) == c.total + replicas


# ---- layer split --------------------------------------------------------------------------


def test_default_split_llama3_405b_pp16():
    """Llama 3 paper Sec. 3.3.2: one layer fewer on the first and last stages: 7, 8 × 14, 7."""
    split = default_layer_split(126, 16)
    assert split == (7,) + (8,) * 14 + (7,)
    assert sum(split) == 126


def test_default_split_llama3_405b_pp16_vpp2():
    split = layer_split(126, 16, 2)
    assert split == (3,) + (4,) * 30 + (3,)
    assert sum(split) == 126
    # rank 0 holds virtual stages 0 and 16, rank 15 holds 15 and 31
    assert stages_of_rank(0, 16, 2) == (0, 16)
    assert stages_of_rank(15, 16, 2) == (15, 31)
    per_rank = [sum(split[k] for k in stages_of_rank(r, 16, 2)) for r in range(16)]
    assert per_rank == [7] + [8] * 14 + [7]
    assert all(rank_of(k, 16) == k % 16 for k in range(32))


@pytest.mark.parametrize("L,S", [(32, 1), (32, 4), (80, 3), (126, 16), (126, 7), (5, 4), (96, 96), (7, 4), (126, 32)])
def test_default_split_properties(L, S):
    split = default_layer_split(L, S)
    assert len(split) == S and sum(split) == L
    assert max(split) - min(split) <= 1
    base, extra = divmod(L, S)
    # the remainder goes to the inner stages 1, 2, ... first, then the last, then the first
    if S > 1:
        assert split[0] == base  # extra < S, so the first stage never gets one more
        assert split[-1] == base + (extra >= S - 1)
        assert list(split[1:-1]) == [base + 1] * min(extra, S - 2) + [base] * (S - 2 - min(extra, S - 2))


def test_user_split_accepted_and_checked():
    given = (6,) + (8,) * 14 + (8,)
    assert layer_split(126, 16, 1, given) == given
    with pytest.raises(InputError, match="add up to the 126 layers"):
        layer_split(126, 16, 1, (8,) * 16)
    with pytest.raises(InputError, match="needs pp x vpp = 16 entries"):
        layer_split(126, 16, 1, (9,) * 14)
    with pytest.raises(InputError, match=r"must not exceed the number of layers \+ 2 \(5: "):
        default_layer_split(3, 6)
    with pytest.raises(InputError, match="every inner virtual stage needs at least one layer"):
        layer_split(32, 3, 1, (16, 0, 16))
    with pytest.raises(InputError, match="must not be negative"):
        layer_split(32, 2, 1, (-1, 33))


def test_first_and_last_stages_may_hold_only_the_embedding_and_the_head():
    """Llama 3 405B: 126 layers on pp 16 x vpp 8 = 128 chunks. "We reduce one Transformer layer
    each from the first and the last stages ... the first model chunk on the first stage has only
    the embedding, and the last model chunk on the last stage has only output projection and loss"
    (Llama 3 paper, Sec. 3.3.2): one layer per chunk, the two end chunks empty."""
    split = default_layer_split(126, 128)
    assert split == (0,) + (1,) * 126 + (0,)
    per_rank = [sum(split[k] for k in stages_of_rank(r, 16, 8)) for r in range(16)]
    assert per_rank == [7] + [8] * 14 + [7]  # the v = 2 split's layers per rank
    # one more stage than layers: the first stage, which has the lighter end (the embedding), empties first
    assert default_layer_split(32, 33) == (0,) + (1,) * 32
    assert default_layer_split(32, 34) == (0,) + (1,) * 32 + (0,)
    assert default_layer_split(32, 32) == (1,) * 32  # unchanged where every stage has a layer
    assert split_problem((0, 32)) is None and split_problem((32, 0)) is None
    assert split_problem((0, 0)) == "needs at least one layer"
    with pytest.raises(InputError, match="every inner virtual stage"):
        TrainingPlan.build(pp=3, global_batch=3, seq_len=128, layer_split=(5, 0, 27))


def test_a_rank_with_only_the_embedding_is_estimated():
    """pp 2 with split 0, 32: rank 0 runs only the embedding lookup and holds its table; rank 1
    the 32 layers and the head. Memory and time follow from the same parts as any split."""
    m = load_model("llama3-8b")
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 2)
    est = estimate(m, cluster, TrainingPlan(pp=2, global_batch=8, seq_len=1024, layer_split=(0, 32)))
    assert est.split == (0, 32)
    assert [st.layers for st in est.stages] == [0, 32]
    emb = m.vocab_size * m.hidden
    assert est.stages[0].params == emb  # the embedding table only
    assert est.stages[0].activations < est.stages[1].activations
    assert est.time.step_s > 0


def test_user_split_errors_through_plan_and_estimate():
    m = load_model("llama3-8b")
    cluster = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 2)
    plan = TrainingPlan(pp=2, global_batch=2, seq_len=128, layer_split=(10, 20))
    with pytest.raises(InputError, match="layer_split"):
        estimate(m, cluster, plan)
    ok = TrainingPlan(pp=2, global_batch=2, seq_len=128, layer_split=(12, 20))
    est = estimate(m, cluster, ok)
    assert est.split == (12, 20)
    assert [s.layers for s in est.stages] == [12, 20]


@pytest.mark.parametrize("name,L,h,a,g,d,f,embedding_b,non_embedding_b", [
    # Parmar et al. 2024 (Nemotron-4 15B), Sec. 2: 3.2B embedding and 12.5B non-embedding parameters
    ("nemotron4-15b", 32, 6144, 48, 8, 128, 24576, 3.2, 12.5),
    # Nemotron-4 340B Technical Report, Table 1: 9.4B embedding and 331.6B non-embedding parameters
    ("nemotron4-340b", 96, 18432, 96, 8, 192, 73728, 9.4, 331.6),
])
def test_nemotron4_by_part(name, L, h, a, g, d, f, embedding_b, non_embedding_b):
    """Nemotron-4: squared-ReLU MLP of two matrices, no biases, untied 256,000-token embeddings,
    LayerNorm with weight and bias (zero-centred gamma changes no count)."""
    m = load_model(name)
    assert m.mlp == "relu2" and not m.gated_mlp
    c = count_params(m)
    V = 256000
    attention = h * a * d + 2 * h * g * d + a * d * h
    assert c.layer.attention_weights == attention
    assert c.layer.mlp_weights == 2 * h * f
    assert c.layer.norms == 2 * 2 * h
    assert c.embedding == c.lm_head == V * h
    assert c.total == L * (attention + 2 * h * f + 4 * h) + 2 * V * h + 2 * h
    # the papers' rounded figures: 15B's "3.2B" embedding parameters are 3.146B (2 x 256,000 x 6,144)
    assert abs((c.embedding + c.lm_head) / 1e9 - embedding_b) < 0.06
    assert round((c.total - c.embedding - c.lm_head) / 1e9, 1) == non_embedding_b


def test_grok1_by_part():
    """Grok-1 (xai-org/grok-1): 8 gated-GeLU experts of 32,768 per MoE layer, 4 RMSNorms a layer,
    one in/out embedding of 131,072 x 6,144; the README's 314B is the count without the embedding,
    rounded down."""
    c = count_params(load_model("grok1-314b"))
    h, f, E, L, V = 6144, 32768, 8, 64, 131072
    attention = h * 48 * 128 * 2 + 2 * h * 8 * 128
    per_layer = attention + E * 3 * h * f + h * E + 4 * h
    assert c.total == L * per_layer + V * h + h == 315_684_820_992
    assert int((c.total - V * h) / 1e9) == 314
