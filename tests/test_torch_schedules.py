"""meshplan's pipeline schedules against torch.distributed.pipelining's, rank by rank, action by action.

How the torch side is obtained (no process group, no tensors, no GPU):

* Multi-stage classes (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
  ScheduleZBVZeroBubble) are built normally, on stand-in stage objects that carry only what their
  constructors read (group_size, group_rank, num_stages, stage_index, is_first, is_last, submod).
  The constructor computes ``pipeline_order`` for every rank (and lowers it with
  ``_prepare_schedule_with_comms`` into ``pipeline_order_with_comms``, the list the runtime runs).
* Single-stage classes (ScheduleGPipe, Schedule1F1B) are traced: their own ``_step_microbatches``
  runs on a recording stage whose p2p op lists are empty, so we see the order torch executes.
  (Schedule1F1B's ``_get_pipeline_order()`` IR is not used: in torch 2.13 it numbers the last
  rank's forwards 1..m instead of 0..m-1, while its runtime runs F0 first.)

Idle steps (None) and non-compute actions are dropped; only F, I, W and B are compared.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
S = pytest.importorskip("torch.distributed.pipelining.schedules")

from meshplan.pipeline.schedules import build_schedule, format_actions, parse_actions  # noqa: E402
from meshplan.pipeline.simulate import simulate  # noqa: E402

COMPUTE = {"F", "I", "W", "B"}
MULTI = {
    "interleaved": S.ScheduleInterleaved1F1B,
    "interleaved-zb": S.ScheduleInterleavedZeroBubble,
    "zbh1": S.ScheduleInterleavedZeroBubble,  # with one stage per rank
    "zbv": S.ScheduleZBVZeroBubble,
}
SINGLE = {"gpipe": S.ScheduleGPipe, "1f1b": S.Schedule1F1B}


def _compute(actions) -> list[str]:
    return [str(a) for a in actions if a is not None and a.computation_type.value in COMPUTE]


class _RecordingStage:
    """Stands in for a PipelineStage in a single-stage schedule's runtime loop: no communication
    (empty p2p op lists), and forward/backward calls are logged in torch's notation."""

    def __init__(self, p: int, rank: int, log: list[str]):
        self.group_size, self.group_rank, self.num_stages, self.stage_index = p, rank, p, rank
        self.is_first, self.is_last = rank == 0, rank == p - 1
        self.log = log

    def get_fwd_recv_ops(self, mb):
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, mb, *args, **kwargs):
        self.log.append(f"{self.stage_index}F{mb}")

    def backward_one_chunk(self, mb, loss=None, last_backward=False):
        self.log.append(f"{self.stage_index}B{mb}")

    def perform_reduce_grad(self, *args):
        pass


def _single(cls, p: int, m: int, rank: int):
    log: list[str] = []
    sch = cls(_RecordingStage(p, rank, log), m)
    sch._initialize_stage = lambda *a, **k: None  # shape inference needs real tensors and peers
    sch._step_microbatches()
    return log, sch


def _multi(cls, p: int, m: int, v: int):
    n = p * v
    local = [0, n - 1] if cls is S.ScheduleZBVZeroBubble else [k * p for k in range(v)]  # rank 0's
    stages = [
        SimpleNamespace(
            group_size=p, group_rank=0, num_stages=n, stage_index=s, is_first=s == 0, is_last=s == n - 1, submod=None
        )
        for s in local
    ]
    return cls(stages, m)


def torch_order(name: str, p: int, m: int, v: int) -> list[list[str]]:
    if name in SINGLE:
        return [_single(SINGLE[name], p, m, r)[0] for r in range(p)]
    sch = _multi(MULTI[name], p, m, v)
    return [_compute(sch.pipeline_order[r]) for r in range(p)]


_PM = [(2, 2), (2, 4), (4, 4), (4, 8), (4, 6), (8, 16)]
_PMV = [(2, 4, 2), (4, 8, 2), (4, 8, 3), (4, 12, 2), (4, 6, 2), (8, 16, 2), (4, 4, 2)]
_ZBV = [(2, 4), (4, 8), (4, 4), (4, 6), (4, 12), (8, 16)]
CASES = (
    [pytest.param("gpipe", p, m, 1, id=f"gpipe-p{p}-m{m}") for p, m in _PM]
    + [pytest.param("1f1b", p, m, 1, id=f"1f1b-p{p}-m{m}") for p, m in _PM]
    + [pytest.param("interleaved", p, m, v, id=f"interleaved-p{p}-m{m}-v{v}") for p, m, v in _PMV]
    + [pytest.param("interleaved-zb", p, m, v, id=f"interleaved-zb-p{p}-m{m}-v{v}") for p, m, v in _PMV]
    # ZB-H1 is torch's ScheduleInterleavedZeroBubble with one stage per rank
    + [pytest.param("zbh1", p, m, 1, id=f"zbh1-p{p}-m{m}") for p, m in _PM + [(4, 2), (8, 3)]]
    + [pytest.param("zbv", p, m, 2, id=f"zbv-p{p}-m{m}") for p, m in _ZBV]
)


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_schedule_matches_torch(name, p, m, v):
    theirs = torch_order(name, p, m, v)
    ours = [row.split(",") for row in format_actions(build_schedule(name, p, m, v))]
    assert len(ours) == len(theirs) == p
    for r in range(p):
        if ours[r] != theirs[r]:
            i = next((i for i, (a, b) in enumerate(zip(ours[r], theirs[r])) if a != b), min(len(ours[r]), len(theirs[r])))
            t = theirs[r][i] if i < len(theirs[r]) else "<end>"
            o = ours[r][i] if i < len(ours[r]) else "<end>"
            pytest.fail(f"{name} p={p} m={m} v={v}: rank {r}, index {i}: torch {t}, meshplan {o}")


def test_torch_gpipe_ir_agrees_with_its_runtime():
    """The traced runtime order and ScheduleGPipe's own schedule IR agree (a check on the trace)."""
    for p, m in _PM:
        for r in range(p):
            log, sch = _single(S.ScheduleGPipe, p, m, r)
            assert _compute(sch.pipeline_order[r]) == log


@pytest.mark.parametrize("name,p,m,v", [("interleaved", 4, 8, 2), ("interleaved-zb", 4, 8, 2), ("zbv", 4, 8, 2)])
def test_torch_printed_order_round_trips_and_simulates(name, p, m, v):
    sch = _multi(MULTI[name], p, m, v)
    rows = [",".join(str(a) for a in sch.pipeline_order_with_comms[r]) for r in range(p)]
    assert any("SEND_F" in row for row in rows) and any("RECV_B" in row for row in rows)
    ranks = parse_actions(rows)  # comm actions skipped
    assert format_actions(ranks) == [",".join(_compute(sch.pipeline_order[r])) for r in range(p)]

    n = p * v
    sim = simulate(ranks, n, [1.0] * n, [2.0] * n, wgt=[1.0] * n, keep_timeline=True)
    assert sim.makespan > 0
    seen = Counter((a.stage, a.microbatch, a.kind) for line in sim.timeline for a, _, _ in line)
    assert {(s, j) for s, j, _ in seen} == {(s, j) for s in range(n) for j in range(m)}
    for s in range(n):
        for j in range(m):
            got = {k: seen[(s, j, k)] for k in "FBIW"}
            split = {"F": 1, "B": 0, "I": 1, "W": 1}
            assert got in ({"F": 1, "B": 1, "I": 0, "W": 0}, split), (s, j, got)
            if name != "interleaved":
                assert got == split, (s, j, got)
