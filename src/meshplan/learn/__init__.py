"""The workbook: the source documents' exercises, generated and graded by meshplan's own engine.

Each exercise is a parameterised problem with a variant as in its source and seeded random
variants; its expected answer and worked solution come from the library functions the planner
uses (:mod:`meshplan.calc`, :mod:`meshplan.cost`, :mod:`meshplan.pipeline`), never typed in.

* :func:`specs` / :data:`TOPICS`: the catalog; :func:`generate` an exercise (``seed`` None: as in
  the source); :func:`grade` a learner's answer, returning :class:`Feedback`.
* Kinds (:mod:`meshplan.learn.model`): numeric (unit and tolerance stated), choice, ordering,
  faulty-line.
* Topic modules: ``ex_comm`` (collectives, TP, CP), ``ex_memory`` (ZeRO, precision),
  ``ex_training`` (batch, LR, overlap, checkpointing), ``ex_pipeline``, ``ex_llama3`` (capstone),
  ``ex_faulty`` (find the faulty line).
"""

from meshplan.learn.model import Exercise, Feedback, grade
from meshplan.learn.registry import TOPICS, generate, get_spec, specs

__all__ = ["Exercise", "Feedback", "TOPICS", "generate", "get_spec", "grade", "specs"]
