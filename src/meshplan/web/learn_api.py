"""``/api/learn``: the workbook of :mod:`meshplan.learn` over HTTP, for the Learn view.

* ``GET /api/learn?topic&seed&fixed``: the topics and the exercise list.
* ``GET /api/learn/{id}?seed=S`` (or ``fixed=true``): one exercise as the learner sees it before
  answering: :meth:`~meshplan.learn.Exercise.to_dict` (the JSON of ``meshplan learn --list
  --json``) without what gives the answer away (:data:`AFTER_GRADING` and the answer's
  :data:`ANSWER_SECRETS`).
* ``POST /api/learn/{id}/grade?seed=S`` with ``{"answer": ...}``: :func:`meshplan.learn.grade`'s
  :meth:`~meshplan.learn.Feedback.to_dict`, with the worked solution's derivations
  (``derivations``) and the closing ``explanation``.

The variant is a seed (``random.Random("id:S")``, the terminal's ``--seed``) or ``fixed=true``,
the source's numbers (``--fixed``); the page grades the variant it showed, so the exercise and
grade endpoints require one of them. An answer that cannot be read (not a number, no such option)
is bad input: 422 naming ``answer`` and the rule, as every other bad input.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Annotated, Any, Optional

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field, field_validator

from meshplan.errors import InputError
from meshplan.learn import TOPICS, Exercise, generate, grade, specs
from meshplan.learn.model import KINDS
from meshplan.learn.registry import get_spec
from meshplan.web.errors import known_query

#: Keys of :meth:`Exercise.to_dict` the page does not get before grading: the worked solution, the
#: source's mistake, the command and link that compute the answer, and ``params`` (the problem's
#: numbers in SI, some of them steps of the solution: the element count of ``fp8-activations``).
AFTER_GRADING = ("solution", "solution_text", "explanation", "source_note", "command", "url", "params")
#: Keys of each kind's answer that give it away.
ANSWER_SECRETS = {
    "numeric": ("value", "value_si", "scale"),
    "choice": ("correct",),
    "ordering": ("correct", "correct_items"),
    "faulty-line": ("bug", "fixed", "expected"),
}
assert set(ANSWER_SECRETS) == set(KINDS)

router = APIRouter(prefix="/api", dependencies=[Depends(known_query)])

Topic = Query(None, description=f"Only this topic: {', '.join(TOPICS)}.")
Seed = Query(None, description="The random variant of this seed (a whole number ≥ 0): the same seed, the same problem (`--seed`).")
Fixed = Query(False, description="The variant as in the source, its mistakes corrected (`--fixed`).")


def variant(seed: Optional[int], fixed: bool, required: bool = True) -> Optional[int]:
    """The seed to generate with (None: the source's variant), from the query's seed and fixed."""
    if fixed and seed is not None:
        raise InputError("seed", "seed and fixed exclude each other (fixed is the source's variant)")
    if seed is not None and seed < 0:
        raise InputError("seed", f"must be a non-negative whole number (got {seed})")
    if required and seed is None and not fixed:
        raise InputError("seed", "give seed=<whole number ≥ 0> or fixed=true")
    return seed


def exercise_id(id: str) -> str:
    """The path's exercise id, checked before the variant and the answer: an unknown one is
    InputError ``exercise``."""
    return get_spec(id).id


ExerciseId = Annotated[str, Depends(exercise_id)]


@lru_cache(maxsize=None)
def _kind(id: str) -> str:
    return generate(id).kind  # a spec's kind is the same in every variant


def public(ex: Exercise) -> dict[str, Any]:
    """The exercise as shown before grading: :meth:`Exercise.to_dict` less what gives the answer away."""
    out = {k: v for k, v in ex.to_dict().items() if k not in AFTER_GRADING}
    out["answer"] = {k: v for k, v in out["answer"].items() if k not in ANSWER_SECRETS[ex.kind]}
    return out


class GradeBody(BaseModel):
    """A learner's answer: text as typed (``"1.75 GB"``, ``"b"``, ``"TP CP PP DP"``, ``"4"``), or for a
    numeric exercise a number, for a choice the option's index from 0, for an ordering the items'
    indices from 0 in the learner's order, for a faulty line the line number from 1."""

    model_config = ConfigDict(extra="forbid")
    answer: Any = Field(description="the learner's answer: text, a number, or a list of item indices")

    @field_validator("answer", mode="before")
    @classmethod
    def _shape(cls, v: Any) -> Any:
        def whole(x: Any) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        if isinstance(v, str) or whole(v) or (isinstance(v, list) and all(whole(x) for x in v)):
            return v
        if isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"must be a finite number (got {v})")
            return v
        raise ValueError(f"must be text, a number or a list of item indices (got {v!r})")


def graded(ex: Exercise, answer: Any) -> dict[str, Any]:
    """:func:`grade`'s feedback with the derivations; an unreadable answer is InputError ``answer``."""
    if isinstance(answer, str) and not answer.strip():
        raise InputError("answer", "is empty")
    fb = grade(ex, answer)
    if not fb.valid:
        raise InputError("answer", fb.error)
    shown = ex.to_dict()
    return {**fb.to_dict(), "derivations": shown["solution"], "explanation": shown["explanation"]}


@router.get("/learn", tags=["learn"], summary="The workbook's topics and exercises (`meshplan learn --list`)")
def api_learn(topic: Optional[str] = Topic, seed: Optional[int] = Seed, fixed: bool = Fixed) -> dict[str, Any]:
    chosen = variant(seed, fixed, required=False)
    every = specs()
    listed = specs(topic)
    return {
        "topics": [{"name": t, "description": d, "count": sum(s.topic == t for s in every)} for t, d in TOPICS.items()],
        "topic": topic, "seed": chosen, "fixed": fixed,
        "exercises": [{"id": s.id, "topic": s.topic, "title": s.title, "difficulty": s.difficulty, "kind": _kind(s.id),
                       "source": s.source} for s in listed],
    }


@router.get("/learn/{id}", tags=["learn"], summary="One exercise as shown before answering (no answer, no solution)")
def api_exercise(id: ExerciseId, seed: Optional[int] = Seed, fixed: bool = Fixed) -> dict[str, Any]:
    return public(generate(id, variant(seed, fixed)))


@router.post("/learn/{id}/grade", tags=["learn"],
             summary="Grade an answer: right or wrong, the error, the answer, the worked solution and the links")
def api_grade(id: ExerciseId, body: GradeBody, seed: Optional[int] = Seed, fixed: bool = Fixed) -> dict[str, Any]:
    return graded(generate(id, variant(seed, fixed)), body.answer)
