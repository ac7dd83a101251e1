"""Pipeline stage buffers (plan.stack.pp_buffers): Megatron-LM's two messages in flight against torch's
receive buffers per micro-batch and stage outputs kept until their backward (the torch side is
checked on real PipelineStage objects in tests/test_verify_comm.py)."""

from __future__ import annotations

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.activations import logits_output_bytes
from meshplan.cost.compose import pp_buffer_messages
from meshplan.cost.fsdp_copies import gather_pool_bytes
from meshplan.estimate import estimate
from meshplan.specs import ClusterSpec, TrainingPlan

MODEL = load_model("llama3-70b")
CLUSTER = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 64)
MiB = 2**20


def _plan(kind: str, **kw) -> TrainingPlan:
    return TrainingPlan.of(**({"tp": 8, "pp": 4, "dp": 2, "seq_len": 8192, "global_batch": 64, "recompute": "full", "pp_buffers": kind} | kw))


def test_message_counts():
    assert pp_buffer_messages("in-flight", 32, 1, 0) == 2
    # a middle stage receives each micro-batch's input and its output gradient; the ends one of them
    assert pp_buffer_messages("per-micro-batch", 32, 1, 1) == 64
    assert pp_buffer_messages("per-micro-batch", 32, 0, 1) == pp_buffer_messages("per-micro-batch", 32, 1, 0) == 32
    # interleaved rank 0 of 2 with v = 2: stages 0 and 2 of 4: 1 not first, 2 not last
    assert pp_buffer_messages("per-micro-batch", 8, 1, 2) == 24


def test_torch_buffers_per_rank():
    plan = _plan("per-micro-batch")
    m = plan.grad_accum
    assert m == 32
    message = 1 * 8192 * 8192 * 2 / 8  # b·s·h·e over t (sequence parallel): 16 MiB
    est = estimate(MODEL, CLUSTER, plan)
    got = [s.other_items["pp_comm_buffers"] for s in est.stages]
    assert got == [32 * message, 64 * message, 64 * message, 32 * message]
    assert got[0] == 512 * MiB
    megatron = estimate(MODEL, CLUSTER, _plan("in-flight"))
    assert [s.other_items["pp_comm_buffers"] for s in megatron.stages] == [2 * message] * 4


def test_torch_keeps_each_stage_output_until_its_backward():
    torch_, megatron = estimate(MODEL, CLUSTER, _plan("per-micro-batch")), estimate(MODEL, CLUSTER, _plan("in-flight"))
    message = 8192 * 8192 * 2 / 8
    for a, b in zip(torch_.stages[:-1], megatron.stages[:-1]):
        assert a.peak_inflight == b.peak_inflight  # 1F1B: rank r holds p - r micro-batches either way
        assert a.activation_items["stored"] - b.activation_items["stored"] == pytest.approx(a.peak_inflight * message, rel=1e-12)
    # the last stage's output, the logits (b·s·V/t·e), is held through the loss and the stage's backward
    logits = 8192 * (128256 // 8) * 2
    assert logits_output_bytes(MODEL, 1, 8192, 8, 1, 2) == logits
    a, b = torch_.stages[-1], megatron.stages[-1]
    assert a.activation_items["stored"] - b.activation_items["stored"] == pytest.approx(a.peak_inflight * logits, rel=1e-12)


def test_torch_holds_the_logits_so_no_freed_block():
    """Under torch's pipelining the schedule holds the last stage's output, the logits, through the
    loss (fwd_cache): they are never freed before the backward, so the eager loss leaves no freed
    block (without a pipeline torchtitan's ``del pred`` frees them and the block is counted)."""
    piped = estimate(MODEL, CLUSTER, _plan("per-micro-batch", kernels="eager")).stages[-1]
    alone = estimate(MODEL, CLUSTER, _plan("per-micro-batch", kernels="eager", pp=1, dp=8)).stages[-1]
    assert piped.other_items.get("freed_logits_block", 0.0) == 0.0
    assert alone.other_items["freed_logits_block"] == logits_output_bytes(MODEL, 1, 8192, 8, 1, 2) > 0


def test_returned_outputs_are_kept_to_the_steps_end():
    """pp_return_outputs: torch's last stage keeps every micro-batch's logits O in output_chunks and
    merges them (torch.cat) when the step ends. 1F1B holds one micro-batch in flight, so at the last
    one's backward m − 1 more outputs are kept; GPipe holds all m in flight, none beyond; and at the
    step's end 2·m·O stand beside the model state alone."""
    o = logits_output_bytes(MODEL, 1, 8192, 8, 1, 2)
    one = estimate(MODEL, CLUSTER, _plan("per-micro-batch", pp_return_outputs=True, global_batch=16, recompute="none"))
    base = estimate(MODEL, CLUSTER, _plan("per-micro-batch", global_batch=16, recompute="none"))
    m = 8
    assert one.stages[-1].other_items["kept_outputs"] == (m - 1) * o
    assert one.stages[-1].total - base.stages[-1].total == pytest.approx((m - 1) * o, rel=1e-12)
    assert [s.total for s in one.stages[:-1]] == [s.total for s in base.stages[:-1]]  # the last rank only
    gpipe = estimate(MODEL, CLUSTER, _plan("per-micro-batch", schedule="gpipe", pp_return_outputs=True, global_batch=16))
    assert gpipe.stages[-1].other_items.get("kept_outputs", 0.0) == 0.0 and "merged_outputs" not in gpipe.stages[-1].other_items
    assert gpipe.stages[-1].activations > 0
    # 8 layers per stage under full recompute, m = 32 micro-batches of 1.96 GiB logits: the step's end is the peak
    small = estimate(load_model("llama3-8b"), CLUSTER, _plan("per-micro-batch", tp=1, dp=16, global_batch=512, pp_return_outputs=True))
    end = small.stages[-1]
    o8 = logits_output_bytes(load_model("llama3-8b"), 1, 8192, 1, 1, 2)
    assert end.activations == 0.0 and end.other_items["step_outputs"] == end.other_items["merged_outputs"] == 32 * o8
    assert end.total == end.weights + end.gradients + end.optimizer + sum(end.other_items.values())
    # under FSDP2 the all-gather pool, reserved on its own stream, is still there at the step's end
    fsdp = estimate(load_model("llama3-8b"), CLUSTER, _plan("per-micro-batch", tp=1, dp=16, global_batch=512, zero=3,
                                                            kernels="eager", pp_return_outputs=True)).stages[-1]
    assert fsdp.activations == 0.0 and fsdp.peak_inflight == 0
    assert fsdp.other_items["all_gather_pool"] == gather_pool_bytes(load_model("llama3-8b"), 1, 4, ((8, False, True),), 2) > 0


def test_torch_last_stage_peak_measured():
    """The last stage of torch's own pipeline schedules (one stage: an embedding and an LM head
    with V = 32,768 fp32 logits per micro-batch of 256 tokens, O = 32 MiB, the loss torch's
    cross-entropy), its allocations replayed through the caching-allocator model: the peak is
    meshplan's, to the byte — L micro-batches in flight, each with its logits and saved
    log-softmax (4·n·V), the loss's two backward buffers (8·n·V), the outputs kept beyond the L
    ((m − L)·O) when the step returns them, or the step's end, 2·m·O, whichever is larger."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from meshplan.catalog.hf_config import model_from_hf_config
    from meshplan.cost.activations import loss_grad_bytes
    from meshplan.cost.compose import kept_outputs_bytes
    from meshplan.pipeline.inflight import last_stage_live_peaks, state_rows
    from meshplan.verify.allocator import profiled_events, replay

    V, H, n, m = 32768, 16, 256, 4
    spec = model_from_hf_config({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,
                                 "intermediate_size": 128, "vocab_size": V, "max_position_embeddings": n}, "tiny-head")
    o = logits_output_bytes(spec, 1, n, 1, 1, 4)
    assert o == n * V * 4

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.out = nn.Embedding(V, H), nn.Linear(H, V, bias=False)

        def forward(self, x):
            return self.out(self.emb(x))

    def loss(logits, target):
        return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # one rank: no port
    try:
        for name, cls in (("1f1b", Schedule1F1B), ("gpipe", ScheduleGPipe)):
            live = int(last_stage_live_peaks(state_rows(name, 1, m, 1)[None], name, 1, 1)[0])
            for returns in (False, True):
                torch.manual_seed(0)
                sched = cls(PipelineStage(Head(), 0, 1, torch.device("cpu")), n_microbatches=m, loss_fn=loss)
                ids = torch.randint(0, V, (m, n))
                sched.step(ids, target=ids, losses=[], return_outputs=returns)  # gradients allocated before the count

                def step():
                    sched.step(ids, target=ids, losses=[], return_outputs=returns)

                peak = replay(profiled_events(step)).peak_allocated
                backward = live * (o + 4 * n * V) + loss_grad_bytes(spec, 1, n, 1, 1, "eager", 4)
                want = max(backward + kept_outputs_bytes(m, live, o), 2 * m * o) if returns else backward
                assert peak == want, (name, returns, peak / o, want / o)
    finally:
        if created:
            dist.destroy_process_group()


def test_without_a_pipeline_nothing_changes():
    a = estimate(MODEL, CLUSTER, _plan("per-micro-batch", pp=1, dp=8))
    b = estimate(MODEL, CLUSTER, _plan("in-flight", pp=1, dp=8))
    assert a.peak_bytes == b.peak_bytes and a.time.step_s == b.time.step_s
