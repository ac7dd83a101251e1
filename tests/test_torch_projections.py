"""torch runs a Llama block's projections as separate GEMMs, eager and compiled, and the compiled
backward sums their input gradients inside the norm's backward (meshplan.cost.compute:
projection_gemms, input_gradient_sum_bytes), counted on a torchtitan block on CPU."""

from __future__ import annotations

import collections
import re

import pytest

torch = pytest.importorskip("torch")

from meshplan.catalog.hf_config import model_from_hf_config  # noqa: E402
from meshplan.cost.compute import projection_gemms  # noqa: E402
from meshplan.verify.llama_block import Block, precompute_freqs_cis  # noqa: E402

# hidden, heads, K/V heads, head dimension, MLP, sequence, batch: every projection width distinct
# (q 384, k and v 96, MLP 512, hidden 256)
H, A, G, D, F, S, B = 256, 8, 2, 48, 512, 64, 2
TINY = model_from_hf_config({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": H, "num_attention_heads": A,
                             "num_key_value_heads": G, "head_dim": D, "intermediate_size": F, "vocab_size": 128,
                             "max_position_embeddings": S}, "tiny")


def _block():
    torch.manual_seed(0)
    return Block(H, A, G, F, D), precompute_freqs_cis(D, S)


def _mm_shapes(fn, fc) -> collections.Counter:
    """(m, k, n) of every aten::mm of one forward + backward."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(B, S, H, requires_grad=True)
    fn(x, fc).sum().backward()  # compile, if it is compiled
    x = torch.randn(B, S, H, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn(x, fc).sum().backward()
    out = collections.Counter()
    for e in prof.events():
        if e.name == "aten::mm":
            (m, k), (_, n) = e.input_shapes[0], e.input_shapes[1]
            out[(m, k, n)] += 1
    return out


def _expected() -> collections.Counter:
    """Forward (m, k, n), input gradient (m, n, k) and weight gradient (n, m, k) (autograd forms
    dW = dYᵀ·X for W stored n × k) of each of the torch stack's projections, as (rows, reduction,
    columns) of the mm."""
    out = collections.Counter()
    for _, (m, n, k) in projection_gemms(TINY, B * S, 1, "compiled"):
        m, n, k = int(m), int(n), int(k)
        out[(m, k, n)] += 1
        out[(m, n, k)] += 1
        out[(n, m, k)] += 1
    return out


@pytest.mark.parametrize("compiled", [False, True])
def test_every_projection_is_its_own_gemm(compiled):
    block, fc = _block()
    fn = torch.compile(block, fullgraph=True) if compiled else block
    assert [nm for nm, _ in projection_gemms(TINY, B * S, 1, "compiled")] == ["q", "k", "v", "o", "gate", "up", "down"]
    assert _mm_shapes(fn, fc) == _expected()
    assert sum(_expected().values()) == 21


def test_compiled_backward_sums_the_projections_input_gradients_inside_reductions():
    """The input gradients of wq, wk, wv (and w1, w3) are never added by a kernel of their own:
    they enter the fused kernels of RMSNorm's backward, reductions ('sum' in the kernel's name),
    together, and each such gradient is read by two of them (the input gradient and the weight
    gradient of the norm)."""
    from torch._inductor.utils import run_and_get_code

    block, fc = _block()
    fn = torch.compile(block, fullgraph=True)
    x = torch.randn(B, S, H, requires_grad=True)

    def step():
        fn(x, fc).sum().backward()

    _, codes = run_and_get_code(step)
    backward = next(c for c in codes if "tangents_1" in c)
    # input gradients dY·W: a weight operand as stored (a bare primals_ input, n × k) and the
    # output gradient (m × n) as A; n tells the projection: q 384, k and v 96, gate and up 512
    calls = re.findall(r"extern_kernels\.mm\(reinterpret_tensor\((\w+), \((\d+), (\d+)\).*?\), (primals_\d+), out=(buf\d+)\)", backward)
    dgrads = collections.defaultdict(set)
    for _, rows, width, _, out in calls:
        assert int(rows) == B * S
        dgrads[int(width)].add(out)
    attention, mlp = dgrads[A * D] | dgrads[G * D], dgrads[F]
    assert (len(attention), len(mlp)) == (3, 2)
    kernels = re.findall(r"\n\s+(\w*fused\w*)\((.*)\)", backward)
    for bufs in (attention, mlp):
        readers = [name for name, args in kernels if bufs <= set(re.findall(r"buf\d+", args))]
        assert len(readers) == 2 and all("sum" in r for r in readers)
        # and no kernel reads only some of them: no add of their own
        partial = [name for name, args in kernels if 0 < len(bufs & set(re.findall(r"buf\d+", args))) < len(bufs)]
        assert partial == []


def test_with_tensor_parallelism_the_compiled_sum_is_the_collectives_input():
    """Under TP the summed input gradient is the partial sum the reduce-scatter (all-reduce) takes:
    Inductor writes it, one fused add per group reading j gradients and writing one. Llama 3 70B on
    TP 8, 16,384 tokens: (3 + 1) + (2 + 1) = 7 passes over n·h = 16,384 · 8,192 elements, 2 kernels;
    eager 3·(2 + 1) passes in three adds; the fused stack's QKV and gate|up GEMMs sum nothing."""
    from meshplan.catalog import load_model
    from meshplan.cost.compute import input_gradient_sum_bytes, input_gradient_sum_kernels

    model, n = load_model("llama3-70b"), 16384
    nh2 = n * 8192 * 2
    for kernels, tp, passes, launches in (("compiled", 8, 7, 2), ("compiled", 1, 6, 0), ("eager", 8, 9, 3), ("eager", 1, 9, 3),
                                          ("fused", 8, 0, 0)):
        gemms = projection_gemms(model, n, tp, kernels)
        assert input_gradient_sum_bytes(gemms, 8192, 2, kernels, tp) == passes * nh2
        assert input_gradient_sum_kernels(gemms, kernels, tp) == launches


def test_compiled_rope_falls_back_to_atens_complex_multiply():
    """Inductor generates no code for complex tensors: in a compiled bf16 torchtitan block the
    rotation of q and of k is aten's complex ``mul`` between cast kernels, forward and backward
    (compute.rope_bytes: 2e + 16 bytes an element each way, as eager)."""
    from torch._inductor.utils import run_and_get_code

    block, fc = _block()
    block = block.to(torch.bfloat16)
    fn = torch.compile(block, fullgraph=True)
    x = torch.randn(B, S, H, requires_grad=True, dtype=torch.bfloat16)

    def step():
        fn(x, fc).sum().backward()

    _, codes = run_and_get_code(step)
    forward = next(c for c in codes if "tangents_1" not in c)
    backward = next(c for c in codes if "tangents_1" in c)
    for code in (forward, backward):
        assert len(re.findall(r"= torch\.ops\.aten\.mul\.Tensor\(", code)) == 2  # q and k
        assert "torch.ops.aten.view_as_complex.default" in code


@pytest.mark.parametrize(("name", "fused", "torch_names"), [
    ("llama3-8b", ["qkv", "attn_out", "mlp_in", "mlp_out"], ["q", "k", "v", "o", "gate", "up", "down"]),
    ("gpt3-175b", ["qkv", "attn_out", "mlp_in", "mlp_out"], ["q", "k", "v", "o", "fc1", "fc2"]),
    ("deepseek-v3-671b", ["q_a", "q_b", "kv_a", "kv_b", "o", "mlp_in", "mlp_out"],
     ["q_a", "q_b", "kv_a", "kv_b", "o", "gate", "up", "down"]),
])
def test_both_layouts_do_the_same_flops(name, fused, torch_names):
    """Two derivations of one layer's projection FLOPs: Megatron's fused GEMMs and torch's separate
    ones (MLA's projections separate on both) multiply the same weights, exactly; MLA's down
    projections q_a and kv_a share the input, so their input gradients are summed on every stack."""
    from meshplan.catalog import load_model
    from meshplan.cost.compute import input_gradient_sum_bytes

    model = load_model(name)
    a, b = projection_gemms(model, 4096, 8, "fused"), projection_gemms(model, 4096, 8, "compiled")
    assert [n for n, _ in a] == fused and [n for n, _ in b] == torch_names
    flops = [sum(2 * m * n * k for _, (m, n, k) in g) for g in (a, b)]
    assert flops[0] == flops[1]
    assert flops[0] == 2 * 4096 * sum(i * o for _, i, o in _per_rank(model, 8))
    shared = input_gradient_sum_bytes(a, model.hidden, 2, "fused", 8)
    assert shared == (3 * 4096 * model.hidden * 2 if model.is_mla else 0)


def _per_rank(model, tp):
    """(name, input width, output width) of each layer matmul on one TP rank."""
    from meshplan.cost.params import layer_matmuls, matmuls_per_rank

    widths = matmuls_per_rank(model, tp)
    return [(nm, *widths[nm]) for nm, _, _ in layer_matmuls(model)]
