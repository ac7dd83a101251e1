"""What the torch stacks save for a layer's backward, counted in torch itself (needs torch).

A torchtitan Llama block (meshplan.verify.llama_block) runs forward under
``saved_tensors_hooks``; every distinct storage it saves that is not a parameter is summed and
compared with :func:`meshplan.cost.activations.layer_activation_items` for the same shapes:
eager exactly, ``torch.compile``'d up to the norms' per-token statistics the list leaves out.
Then ``meshplan verify memory`` with full recompute: the peak at the head moment holds no
recomputed layer (:func:`meshplan.cost.compose.rank_other_items`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from meshplan.catalog import load_gpu  # noqa: E402
from meshplan.catalog.hf_config import model_from_hf_config  # noqa: E402
from meshplan.cost.activations import layer_activation_items  # noqa: E402
from meshplan.specs.hardware import ClusterSpec  # noqa: E402
from meshplan.specs.plan import PrecisionRecipe, TrainingPlan  # noqa: E402

H, A, G, F, B, S = 256, 8, 2, 704, 2, 64
N = B * S


def _spec():
    return model_from_hf_config({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": H, "num_attention_heads": A,
                                 "num_key_value_heads": G, "intermediate_size": F, "vocab_size": 128,
                                 "max_position_embeddings": S}, "tiny-torchtitan-block")


def saved_bytes(compiled: bool, dtype) -> int:
    """Bytes of the distinct non-parameter storages one block saves for its backward."""
    from meshplan.verify.llama_block import Block, precompute_freqs_cis

    torch.manual_seed(0)
    block = Block(H, A, G, F).to(dtype)
    freqs = precompute_freqs_cis(H // A, S)
    x = torch.randn(B, S, H, dtype=dtype, requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()} | {freqs.untyped_storage().data_ptr()}
    fn = torch.compile(block, fullgraph=True) if compiled else block
    if compiled:  # compile outside the count
        fn(x, freqs).sum().backward()
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x, freqs)
    return sum(seen.values())


def _listed(kernels: str, e: int) -> float:
    return sum(b for _, b, _ in layer_activation_items(_spec(), B, S, 1, 1, False, "flash", e, kernels=kernels))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_eager_block_saves_the_eager_list_exactly(dtype):
    dt = getattr(torch, dtype)
    e = dt.itemsize
    measured = saved_bytes(False, dt)
    assert measured == _listed("eager", e)
    # beyond the fused kernels' list: two norms' fp32 input and reciprocal RMS, SiLU's output, and
    # K and V repeated from g = 2 to a = 8 heads (d = 32)
    assert measured - _listed("fused", e) == 2 * (4 * N * H + 4 * N) + N * F * e + 2 * N * (A - G) * (H // A) * e
    if dtype == "bfloat16":
        assert measured == 1_512_448


def test_compiled_block_saves_the_fused_list_with_repeated_kv():
    measured = saved_bytes(True, torch.bfloat16)
    # the list leaves out the two norms' fp32 per-token statistics (4·n bytes each)
    assert measured == _listed("compiled", 2) + 2 * 4 * N == 1_070_080
    assert _listed("compiled", 2) - _listed("fused", 2) == 2 * N * (A - G) * (H // A) * 2  # repeat_kv's copies


def test_full_recompute_peak_at_the_head_moment_holds_no_rebuilt_layer():
    pytest.importorskip("transformers")
    from meshplan.verify import memory

    model = model_from_hf_config({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                                  "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 32000,
                                  "max_position_embeddings": 1024}, "tiny-llama-large-vocab")
    plan = TrainingPlan(micro_batch=2, seq_len=512, global_batch=2, recompute="full",
                        precision=PrecisionRecipe(precision="fp32", grad_dtype="fp32"))
    c = memory.compare(model, plan, ClusterSpec.of(load_gpu("h100-sxm-80gb"), 1))
    assert c.ok, [r.to_dict() for r in c.failures]
    other = c.setup["meshplan_other_items"]
    items = c.setup["meshplan_activation_items"]
    working = items["backward_working_set"] + items["backward_gradients"]  # neither built yet at the loss's backward
    assert items["backward_working_set"] > 0 and items["backward_gradients"] > 0
    assert other["working_set_not_yet_built"] == -working
    # torch's peak is the loss's backward with every layer's input checkpointed: meshplan's head
    # moment, within 0.1 % (the old sum of both moments was 2.7 % over)
    assert abs(c.row("peak").relative) < 0.001
