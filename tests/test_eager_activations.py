"""What the torch stacks save for a layer's backward, counted in torch itself (needs torch).

A torchtitan Llama block (meshplan.verify.llama_block) runs forward under
``saved_tensors_hooks``; every distinct storage it saves that is not a parameter is summed and
compared with :func:`meshplan.cost.activations.layer_activation_items` for the same shapes:
eager exactly, ``torch.compile``'d up to the norms' per-token statistics the list leaves out.
Under torchtitan's op-level selective checkpointing the bytes a block keeps after its forward
(torch's allocation trace) are :func:`meshplan.cost.activations.op_sac_saved`'s, eager and compiled.
Then ``meshplan verify memory`` with full recompute: the peak at the head moment holds no
recomputed layer (:func:`meshplan.cost.compose.rank_other_items`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from meshplan.catalog import load_gpu  # noqa: E402
from meshplan.catalog.hf_config import model_from_hf_config  # noqa: E402
from meshplan.cost.activations import layer_activation_items, layer_activations, op_sac_saved  # noqa: E402
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


def op_sac_kept_bytes(compiled: bool) -> int:
    """Bytes a torchtitan block under torchtitan's op-level SAC policy (torchtitan 9dec370,
    ``_apply_ac_to_transformer_block``: save the outputs of mm — every other one — SDPA, reduce-
    scatter and max, recompute the rest) still holds after its forward, its input and output
    aside: the allocations of the forward not freed by its end (torch's profiler)."""
    from meshplan.verify.allocator import profiled_events
    from meshplan.verify.llama_block import Block, op_sac, precompute_freqs_cis

    torch.manual_seed(0)
    block = Block(H, A, G, F).to(torch.bfloat16)
    freqs = precompute_freqs_cis(H // A, S)
    sac = op_sac(block)

    def run(x):
        return sac(x, freqs)

    fn = torch.compile(run, fullgraph=True) if compiled else run
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    fn(x).sum().backward()  # compile (and warm) outside the count
    out = []
    alive: dict[int, int] = {}
    for addr, nbytes in profiled_events(lambda: out.append(fn(x))):
        if nbytes > 0:
            alive[addr] = nbytes
        else:
            alive.pop(addr, None)
    return sum(alive.values()) - out[0].untyped_storage().nbytes()


@pytest.mark.parametrize("kernels", ["eager", "compiled"])
def test_op_sac_keeps_what_meshplan_lists(kernels):
    """Eager, SAC caches every MUST_SAVE output (q, v, gate, down, attention and its log-sum-exp);
    compiled, the partitioner keeps only what the backward reads: not the down projection's output,
    which only the residual add consumes."""
    model = _spec()
    kept = op_sac_saved(model, B, S, 1, 1, 2, kernels)
    assert op_sac_kept_bytes(kernels == "compiled") == sum(b for _, b in kept)
    down = N * H * 2
    assert sum(b for _, b in op_sac_saved(model, B, S, 1, 1, 2, "eager")) - sum(b for _, b in kept) == (down if kernels == "compiled" else 0)
    # the layer input, which the checkpoint holds, comes on top; the backward rebuilds the layer's
    # own saved tensors SAC did not keep, of which the down projection's output is none
    op = layer_activations(model, B, S, recompute="op", act_bytes=2, kernels=kernels)
    assert op.stored == N * H * 2 + sum(b for _, b in kept)
    full = sum(b for _, b, _ in layer_activation_items(model, B, S, 1, 1, False, "flash", 2, kernels=kernels))
    rebuilt = full - sum(b for name, b in kept if name != "down_output")
    assert op.working == rebuilt + op.gradients


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
    assert items["working_set_not_yet_built"] == -working and min(other.values()) >= 0
    # torch's peak is the loss's backward with every layer's input checkpointed: meshplan's head
    # moment, within 0.1 % (the old sum of both moments was 2.7 % over)
    assert abs(c.row("peak").relative) < 0.001
