"""Pipeline stage buffers (plan.pp_buffers): Megatron-LM's two messages in flight against torch's
receive buffers per micro-batch and stage outputs kept until their backward (the torch side is
checked on real PipelineStage objects in tests/test_verify_comm.py)."""

from __future__ import annotations

import pytest

from meshplan.catalog import load_gpu, load_model
from meshplan.cost.compose import pp_buffer_messages
from meshplan.estimate import estimate
from meshplan.specs import ClusterSpec, TrainingPlan

MODEL = load_model("llama3-70b")
CLUSTER = ClusterSpec.of(load_gpu("h100-sxm-80gb"), 64)
MiB = 2**20


def _plan(kind: str, **kw) -> TrainingPlan:
    return TrainingPlan(**({"tp": 8, "pp": 4, "dp": 2, "seq_len": 8192, "global_batch": 64, "recompute": "full", "pp_buffers": kind} | kw))


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
    # the last stage's output is the loss: nothing kept
    assert torch_.stages[-1].activation_items["stored"] == megatron.stages[-1].activation_items["stored"]


def test_without_a_pipeline_nothing_changes():
    a = estimate(MODEL, CLUSTER, _plan("per-micro-batch", pp=1, dp=8))
    b = estimate(MODEL, CLUSTER, _plan("in-flight", pp=1, dp=8))
    assert a.peak_bytes == b.peak_bytes and a.time.step_s == b.time.step_s
