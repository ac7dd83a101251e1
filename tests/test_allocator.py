"""Reserved, not allocated: the caching-allocator model (meshplan.verify.allocator) by hand, torch's
own allocation traces of its eager, ``loss_parallel`` and compiled cross-entropy replayed through
it, and the freed logits' block meshplan adds at the loss's backward."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from meshplan.accuracy.validate import runs_of
from meshplan.catalog import load_model
from meshplan.cost.activations import freed_logits_block_bytes, loss_grad_bytes
from meshplan.estimate import estimate
from meshplan.verify.allocator import CachingAllocator, replay

MiB = 1 << 20


def test_best_fit_split_merge_and_growth_by_hand():
    a = CachingAllocator()
    x = a.malloc(10 * MiB)  # an empty pool grows: [x 10]
    y = a.malloc(4 * MiB)  # [x 10][y 4]
    z = a.malloc(6 * MiB)  # [x 10][y 4][z 6]
    assert (x, y, z) == (0, 10 * MiB, 14 * MiB) and a.reserved == 20 * MiB
    a.release(y)  # a 4 MiB hole
    w = a.malloc(3 * MiB)  # best fit: the 4 MiB hole, handed whole (1 MiB would remain: no split)
    assert w == 10 * MiB and a.allocated == 10 * MiB + 4 * MiB + 6 * MiB
    a.release(w)
    v = a.malloc(2 * MiB)  # split: 2 MiB remain free after it
    assert v == 10 * MiB and a.allocated == 18 * MiB and a.reserved == 20 * MiB
    a.release(z)  # merges with the 2 MiB left after v: the segment's free end, [12, 20)
    u = a.malloc(9 * MiB)  # nothing free fits 9 MiB: the free end (8 MiB) grows to 9
    assert u == 12 * MiB and a.reserved == 21 * MiB
    a.release(v)
    a.release(u)  # v's 2 MiB and u's 9 MiB merge: [10, 21)
    t = a.malloc(13 * MiB)  # grows the free end again, by 2 MiB
    assert t == 10 * MiB and a.reserved == 23 * MiB and a.peak_reserved == 23 * MiB
    # requests are rounded to 512 bytes
    assert CachingAllocator().malloc(MiB + 1) == 0


def test_replay_skips_the_small_pool_and_frees_from_before_the_trace():
    events = [(1, 2 * MiB), (2, 1024), (3, -4 * MiB), (2, -1024), (4, 3 * MiB), (1, -2 * MiB), (5, 4 * MiB)]
    a = replay(events)
    # [1: 2][4: 3] → 1 freed → 4 MiB fits nowhere: the segment grows (its end is in use)
    assert a.peak_allocated == 7 * MiB and a.peak_reserved == 9 * MiB
    with pytest.raises(ValueError, match="allocated twice"):
        replay([(1, 2 * MiB), (1, 2 * MiB)])


def test_freed_logits_block_by_stack():
    m = load_model("llama3-8b")  # V = 128,256
    n = 32_768
    assert freed_logits_block_bytes(m, 1, 32_768, 1, 1, "eager", 2) == 2 * n * 128_256 == 8_405_385_216
    assert freed_logits_block_bytes(m, 8, 32_768, 8, 8, "eager", 2) == 2 * n * 128_256 // 8  # n = 8·32,768/8, V/8
    assert freed_logits_block_bytes(m, 1, 32_768, 1, 1, "eager", 4) == 0  # fp32 logits are the cast
    assert freed_logits_block_bytes(m, 1, 32_768, 1, 1, "compiled", 2) == 0  # a compiled loss (t = 1)
    assert freed_logits_block_bytes(m, 1, 32_768, 2, 1, "compiled", 2) == 2 * n * 128_256 // 2  # loss_parallel: eager
    assert freed_logits_block_bytes(m, 1, 32_768, 1, 1, "fused", 2) == 0  # Megatron casts in place
    # one bf16 logits block beside the eager backward's fp32 buffers (8·n·V without TP, 12·n·V/t with)
    assert loss_grad_bytes(m, 1, 32_768, 1, 1, "eager") == 4 * freed_logits_block_bytes(m, 1, 32_768, 1, 1, "eager", 2)


TRACE = textwrap.dedent("""
    import json
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel
    from meshplan.verify.allocator import profiled_events, replay

    n, V, h = 1024, 8192, 64
    labels = torch.randint(0, V, (1, n))
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    mesh = init_device_mesh("cpu", (1,))

    def cross_entropy_loss(pred, labels):  # torchtitan's loss
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    def replayed(mode, dtype):
        x = torch.randn(1, n, h, dtype=dtype, requires_grad=True)
        w = torch.randn(V, h, dtype=dtype, requires_grad=True)
        loss_fn = cross_entropy_loss
        if mode == "compiled":
            loss_fn = torch.compile(cross_entropy_loss)
            loss_fn(F.linear(x, w), labels).backward()  # compiled before the trace

        def step():  # torchtitan's train step: the logits deleted before the backward
            pred = F.linear(x, w)
            if mode == "parallel":
                pred = DTensor.from_local(pred, mesh, [Shard(2)])
                with loss_parallel():
                    loss = loss_fn(pred, labels)
                    del pred
                    loss.backward()
            else:
                loss = loss_fn(pred, labels)
                del pred
                loss.backward()

        a = replay(profiled_events(step))
        return [a.peak_allocated, a.peak_reserved, 4 * n * V]

    cases = [("eager", torch.bfloat16), ("parallel", torch.bfloat16), ("eager", torch.float32), ("compiled", torch.bfloat16)]
    print(json.dumps({f"{m} {str(d)[6:]}": replayed(m, d) for m, d in cases}))
""")


@pytest.fixture(scope="module")
def replayed() -> dict[str, list[int]]:
    """Peak allocated and reserved bytes of torch's losses on the CPU, replayed through the
    allocator model, with the fp32 logits' size 4·n·V (n = 1,024 tokens, V = 8,192)."""
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "-c", TRACE], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["eager", "parallel"])
def test_torch_eager_loss_leaves_the_bf16_logits_block_reserved(replayed, mode):
    allocated, reserved, fp32 = replayed[f"{mode} bfloat16"]
    # allocated: the saved log-softmax and the backward's two (three under loss_parallel) fp32 tensors
    assert allocated == {"eager": 3, "parallel": 4}[mode] * fp32
    # reserved: one bf16 logits block more, e·n·V = fp32 / 2 (meshplan's freed_logits_block_bytes)
    assert reserved - allocated == fp32 // 2


def test_fp32_logits_and_a_compiled_loss_leave_no_block(replayed):
    allocated, reserved, fp32 = replayed["eager float32"]
    assert allocated == 3 * fp32 and reserved == allocated
    allocated, reserved, fp32 = replayed["compiled bfloat16"]
    # the compiled loss holds its bf16 input and writes its bf16 gradient: nothing in fp32
    assert allocated == fp32 and reserved == allocated


def test_8b_long_context_rows_peak_at_the_loss_with_the_block():
    (run,) = [r for r in runs_of() if r.id == "torchtitan_8b_8gpu_cp1_seq32768"]
    (stage,) = estimate(run.model, run.cluster, run.plan).stages
    assert stage.other_items["freed_logits_block"] == 8_405_385_216  # 2 · 32,768 · 128,256
    assert stage.other_items["logits_grad"] == 4 * 8_405_385_216
