"""TP overlap kinds across engines: torchtitan's async TP is torch's micro-pipelined TP, Megatron's
``--tp-comm-overlap`` is Transformer Engine's userbuffers; each export says when the plan's kind is
the other one, and each import sets the kind its engine runs."""

from __future__ import annotations

import pytest

from meshplan.catalog import load_model
from meshplan.interop import export, parse_text
from meshplan.specs.plan import TrainingPlan

LLAMA70 = load_model("llama3-70b")


def _plan(kind: str) -> TrainingPlan:
    return TrainingPlan.of(tp=8, dp=32, global_batch=256, seq_len=8192, zero=3, sequence_parallel=True,
                        tp_comm_overlap=True, tp_overlap_kind=kind)


def _lost(result) -> list[str]:
    return [w for w in result.warnings if w.startswith("tp_overlap_kind:")]


@pytest.mark.parametrize(("engine", "fmt", "native"), [("torchtitan", None, "micro-pipeline"),
                                                       ("megatron", None, "userbuffers")])
def test_each_engine_imports_its_own_overlap_kind(engine, fmt, native):
    out = export(engine, LLAMA70, _plan(native))
    assert _lost(out) == []
    back = parse_text(out.text, fmt).plan
    assert back["tp_comm_overlap"] is True
    assert back.get("tp_overlap_kind", "userbuffers") == native


@pytest.mark.parametrize(("engine", "foreign"), [("torchtitan", "userbuffers"), ("megatron", "micro-pipeline")])
def test_export_says_when_the_engine_runs_the_other_kind(engine, foreign):
    lost = _lost(export(engine, LLAMA70, _plan(foreign)))
    assert len(lost) == 1 and "exported as it" in lost[0]


def test_no_overlap_no_kind():
    p = _plan("userbuffers").replace(**{"tp_comm_overlap": False})
    for engine in ("torchtitan", "megatron"):
        out = export(engine, LLAMA70, p)
        assert _lost(out) == []
        back = parse_text(out.text).plan
        assert back["tp_comm_overlap"] is False and "tp_overlap_kind" not in back
