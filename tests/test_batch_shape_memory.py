"""How tokens split into sequences does not move a checkpointed block stack's memory.

torchtitan's 405B 1F1B row (micro-batch 4 × 8,192 tokens) published 82.5 GiB where its CP 1 row
(1 × 32,768 tokens, the same tokens per micro-batch, the same FSDP 8 × TP 8 × PP 8 layout)
published 75.3; meshplan predicts 72.1 GiB for both, since every tensor it counts scales with
the tokens, b·s, and FlashAttention keeps nothing s² (docs/accuracy.md, "Memory"). These tests
take torch's own allocation trace of torchtitan's block (:mod:`meshplan.verify.llama_block`), each
block under full activation checkpointing as torchtitan wraps it, eager and compiled with
torchao's Float8 linears, and replay it through the caching-allocator model
(:mod:`meshplan.verify.allocator`): the allocated and reserved peaks of a step at 4 × 256 and
at 1 × 1,024 tokens are the same to the byte. So the difference between those two rows lies
outside one device's block path — in AsyncTP's symmetric-memory collectives, the pipeline or
FSDP2 — which a CPU cannot run as the runs did."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

#: torchtitan-shaped (head dimension 128, FFN int(8·H/3) rounded up to a multiple of 256), and
#: large enough that every activation of a 1,024-token step (1.5 MiB in bf16) is a large-pool
#: request, the pool the replay models (over 1 MiB), and so is every weight gradient but wk's and
#: wv's (H × 256). The claim does not depend on the width beyond that: H = 768 keeps every tensor
#: of the step in the pool it had at H = 1,024 and costs half as much (torch's CPU bf16 matmul,
#: which the backward's input gradients run at under 1 GFLOP/s without AVX-512, is most of the time).
H, HEADS, KV_HEADS, FFN, BLOCKS = 768, 6, 2, 2048, 2
SHAPES = ((4, 256), (1, 1024), (2, 1024))  # (sequences, tokens each): two splits of 1,024 tokens, then twice the tokens


def _peaks(compiled: bool, fp8: bool) -> dict[tuple[int, int], tuple[int, int]]:
    from torch.utils.checkpoint import checkpoint

    from meshplan.cost.allocator import replay
    from meshplan.verify.allocator import profiled_events
    from meshplan.verify.llama_block import Block, precompute_freqs_cis

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(Block(H, HEADS, KV_HEADS, FFN) for _ in range(BLOCKS)).to(torch.bfloat16)
    if fp8:
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(blocks)

    def wrapped(block):
        def run(x, fc):
            return checkpoint(block, x, fc, use_reentrant=False)  # torchtitan's full AC (ptd_checkpoint_wrapper)
        return torch.compile(run, fullgraph=True) if compiled else run

    layers = [wrapped(b) for b in blocks]

    def step(b: int, s: int) -> None:
        fc = precompute_freqs_cis(H // HEADS, s)
        x = torch.randn(b, s, H, dtype=torch.bfloat16, requires_grad=True)
        for layer in layers:
            x = layer(x, fc)
        x.float().pow(2).mean().backward()

    out = {}
    if not compiled:
        # lets every lazily made buffer exist before the traces (the blocks' .grad, which every
        # later backward accumulates into): eager, nothing of it depends on the shape, and each
        # shape's trace is the same event for event as after a warm-up step of its own shape
        step(1, 16)
    for shape in SHAPES:
        if compiled:
            step(*shape)  # compiles this shape (a recompilation each), and warms it, before the trace
        alloc = replay(profiled_events(lambda: step(*shape)))
        out[shape] = (alloc.peak_allocated, alloc.reserved)  # segments only grow: reserved is its peak
    return out


@pytest.mark.parametrize("compiled, fp8", [(False, False), (True, True)], ids=["eager", "compiled-float8"])
def test_four_sequences_hold_what_one_four_times_longer_holds(compiled, fp8):
    if fp8:
        pytest.importorskip("torchao")
    peaks = _peaks(compiled, fp8)
    assert peaks[(4, 256)] == peaks[(1, 1024)]
    # the trace sees the activations: twice the tokens hold more, and more than the blocks' inputs
    allocated, reserved = peaks[(1, 1024)]
    assert peaks[(2, 1024)][0] > allocated > BLOCKS * 1024 * H * 2 and peaks[(2, 1024)][1] > reserved
