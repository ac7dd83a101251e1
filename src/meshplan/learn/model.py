"""What an exercise is, what a learner's answer is checked against, and the feedback.

Four kinds of answer:

* :class:`Numeric`: a number in a stated display unit (``value`` is SI; the learner answers
  ``value / scale`` in ``unit``). Accepted when ``|a − x| ≤ rtol·|x|`` (``rtol`` stated to the
  learner as ±%), or exactly for whole-number answers (``rtol = 0``).
* :class:`Choice`: one of several options (answered by letter or number).
* :class:`Ordering`: items put in order (answered by labels or numbers).
* :class:`FaultyLine`: a short Python function with one planted mistake; the learner gives the
  line number. ``fixed`` is the correct line, so both versions can be run.

Every expected value comes from meshplan's library functions when the exercise is generated
(:mod:`meshplan.learn.registry`); the worked solution is the list of
:class:`~meshplan.explain.Derivation` those functions return, rendered by
:func:`meshplan.explain.render`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Union

from meshplan.calc.result import num
from meshplan.explain import Derivation, render

KINDS = ("numeric", "choice", "ordering", "faulty-line")
DIFFICULTIES = ("easy", "medium", "hard")
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Numeric:
    value: float  # SI
    unit: str  # display unit, e.g. "GB", "ms", "%", "" (a pure number)
    scale: float = 1.0  # SI per display unit
    rtol: float = 0.01  # relative tolerance; 0 = exact whole number

    kind = "numeric"

    @property
    def display(self) -> float:
        return self.value / self.scale

    def tolerance_text(self) -> str:
        unit = f" in {self.unit}" if self.unit else ""
        if self.rtol == 0:
            return f"answer{unit}, exactly (a whole number)"
        return f"answer{unit}, within ±{100 * self.rtol:g}%"

    def accepts(self, x: float) -> bool:
        if self.rtol == 0:
            return abs(x - round(self.display)) < 1e-9
        return abs(x - self.display) <= self.rtol * abs(self.display) * (1 + 1e-12)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "value": self.display, "value_si": self.value, "unit": self.unit,
                "scale": self.scale, "rtol": self.rtol, "tolerance": self.tolerance_text()}


@dataclass(frozen=True)
class Choice:
    options: tuple[str, ...]
    correct: int  # 0-based

    kind = "choice"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "options": list(self.options), "correct": self.correct}


@dataclass(frozen=True)
class Ordering:
    items: tuple[str, ...]  # in the order shown to the learner
    correct: tuple[int, ...]  # indices into ``items``, in the right order
    first: str = "first"  # what the first position means, e.g. "innermost"
    last: str = "last"

    kind = "ordering"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "items": list(self.items), "correct": list(self.correct),
                "correct_items": [self.items[i] for i in self.correct], "first": self.first, "last": self.last}


@dataclass(frozen=True)
class FaultyLine:
    lines: tuple[str, ...]  # the function as shown, line 1 first
    bug: int  # 1-based line holding the planted mistake
    fixed: str  # that line, corrected
    function: str  # the function's name
    args: tuple  # the call that shows the mistake
    expected: Any  # what the correct function returns for ``args`` (from the library)

    kind = "faulty-line"

    def source(self, fixed: bool = False) -> str:
        lines = list(self.lines)
        if fixed:
            lines[self.bug - 1] = self.fixed
        return "\n".join(lines) + "\n"

    def run(self, fixed: bool = False) -> Any:
        """Run the shown (or the corrected) function on ``args``."""
        scope: dict[str, Any] = {"math": math}
        exec(compile(self.source(fixed), f"<{self.function}>", "exec"), scope)  # noqa: S102 - the exercise's own code
        return scope[self.function](*self.args)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "lines": list(self.lines), "bug": self.bug, "fixed": self.fixed,
                "function": self.function, "args": list(self.args), "expected": self.expected}


Answer = Union[Numeric, Choice, Ordering, FaultyLine]


@dataclass(frozen=True)
class Exercise:
    """One generated problem: ``seed`` None is the variant as in the source."""

    id: str
    topic: str
    title: str
    difficulty: str
    prompt: str
    answer: Answer
    solution: tuple[Derivation, ...]
    hints: tuple[str, ...]
    params: dict[str, Any]  # the problem's numbers (SI)
    source: str  # where the exercise comes from
    command: str  # the equivalent meshplan command line
    url: str  # the equivalent view of the web explorer, path and query
    seed: int | None = None
    source_note: str | None = None  # where the source's own answer is wrong, and the right value
    explanation: str = ""  # one or two sentences after the derivations

    @property
    def kind(self) -> str:
        return self.answer.kind

    @property
    def fixed(self) -> bool:
        return self.seed is None

    def solution_text(self) -> str:
        text = render(list(self.solution)).rstrip("\n")
        return text + ("\n" + self.explanation if self.explanation else "")

    def to_dict(self) -> dict:
        return {
            "id": self.id, "topic": self.topic, "title": self.title, "difficulty": self.difficulty, "kind": self.kind,
            "seed": self.seed, "fixed": self.fixed, "prompt": self.prompt, "answer": self.answer.to_dict(),
            "hints": list(self.hints), "params": dict(self.params), "source": self.source,
            "source_note": self.source_note, "command": self.command, "url": self.url, "explanation": self.explanation,
            "solution": [
                {"key": d.key, "title": d.title, "formula": d.formula, "symbols": [list(s) for s in d.symbols],
                 "value": d.value, "source": d.source}
                for d in self.solution
            ],
            "solution_text": self.solution_text(),
        }


@dataclass(frozen=True)
class Feedback:
    correct: bool
    given: str  # the learner's answer as understood
    expected: str  # the right answer, as text
    error: str  # what was wrong (empty when right): how far off, which pick, which positions
    solution: str  # the worked solution, rendered
    source_note: str | None
    command: str
    url: str
    valid: bool = True  # False: the answer could not be read (not a number, no such option, ...)
    relative_error: float | None = None  # numeric answers: (given − expected) / expected; None where not finite

    def to_dict(self) -> dict:
        return {"correct": self.correct, "valid": self.valid, "given": self.given, "expected": self.expected,
                "error": self.error, "relative_error": self.relative_error, "solution": self.solution,
                "source_note": self.source_note, "command": self.command, "url": self.url}


# ---- reading and grading answers --------------------------------------------------------------


class AnswerError(ValueError):
    """The learner's answer cannot be read; the message says what is expected."""


_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")


def parse_numeric(text: str, answer: Numeric) -> float:
    """A number, with thousands separators allowed and the exercise's own unit optionally repeated
    (``1.75``, ``1,750``, ``1.75 GB``, ``20%``)."""
    hit = _NUMBER.match(str(text).replace(",", "").replace("_", ""))
    if not hit:
        raise AnswerError(f"'{text}' is not a number; give it in {answer.unit or 'plain units'}")
    unit = hit.group(2)
    if unit and unit.lower() != answer.unit.lower():
        raise AnswerError(f"'{text}': give the number in {answer.unit or 'plain units'}, without another unit")
    return finite_number(hit.group(1), text, answer)


def finite_number(value: str | int | float, text: object, answer: Numeric) -> float:
    """``value`` as a float; AnswerError when it is infinite or too large for one (``1e999``, a
    400-digit number)."""
    try:
        x = float(value)
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):
        shown = str(text) if len(str(text)) <= 40 else f"{str(text)[:20]}…({len(str(text)):,} characters)"
        raise AnswerError(f"'{shown}' is not a finite number; give it in {answer.unit or 'plain units'}")
    return x


def _index(token: str, n: int, what: str) -> int:
    t = token.strip().lower().rstrip(").")
    if len(t) == 1 and t in LETTERS[:n]:
        return LETTERS.index(t)
    if t.isdigit() and 1 <= int(t) <= n:
        return int(t) - 1
    raise AnswerError(f"'{token}' is not {what} (a to {LETTERS[n - 1]}, or 1 to {n})")


def parse_choice(text: str, answer: Choice) -> int:
    return _index(str(text), len(answer.options), "an option")


def parse_ordering(text: str, answer: Ordering) -> tuple[int, ...]:
    """Item labels or numbers (1-based, as listed), separated by spaces, commas or arrows (``->``, ``→``, ``>``)."""
    tokens = [t for t in re.split(r"\s*(?:->|→|>|,|;)\s*|\s+", str(text).strip()) if t]
    labels = {it.lower(): i for i, it in enumerate(answer.items)}
    out = []
    for tok in tokens:
        key = tok.lower()
        if key in labels:
            out.append(labels[key])
        elif key.isdigit() and 1 <= int(key) <= len(answer.items):
            out.append(int(key) - 1)
        else:
            raise AnswerError(f"'{tok}' is not one of the items ({', '.join(answer.items)}) or their numbers 1-{len(answer.items)}")
    if sorted(out) != list(range(len(answer.items))):
        raise AnswerError(f"give each of the {len(answer.items)} items exactly once")
    return tuple(out)


def parse_line(text: str, answer: FaultyLine) -> int:
    t = str(text).strip().lower().removeprefix("line").strip()
    if not t.isdigit() or not 1 <= int(t) <= len(answer.lines):
        raise AnswerError(f"'{text}' is not a line number (1 to {len(answer.lines)})")
    return int(t)


def expected_text(ex: Exercise) -> str:
    a = ex.answer
    if isinstance(a, Numeric):
        value = f"{round(a.display):,}" if a.rtol == 0 else f"{a.display:,.4g}"
        return f"{value} {a.unit}".strip()
    if isinstance(a, Choice):
        return f"{LETTERS[a.correct]}) {a.options[a.correct]}"
    if isinstance(a, Ordering):
        return " → ".join(a.items[i] for i in a.correct)
    return f"line {a.bug}: {a.lines[a.bug - 1].strip()}  (correct: {a.fixed.strip()})"


def grade(ex: Exercise, answer: str | float | int | list | tuple) -> Feedback:
    """Check ``answer`` (text as a learner types it, or a number / index / sequence) against the
    exercise and say what was wrong, with the worked solution and the links."""
    a = ex.answer
    common = dict(expected=expected_text(ex), solution=ex.solution_text(), source_note=ex.source_note,
                  command=ex.command, url=ex.url)
    try:
        if isinstance(a, Numeric):
            x = finite_number(answer, answer, a) if isinstance(answer, (int, float)) else parse_numeric(str(answer), a)
            ok = a.accepts(x)
            rel = relative_error(x, a.display)
            given = f"{x:,.6g} {a.unit}".strip()
            error = "" if ok else _numeric_error(x, a, rel)
            return Feedback(ok, given, error=error, relative_error=rel, **common)
        if isinstance(a, Choice):
            i = answer if isinstance(answer, int) else parse_choice(str(answer), a)
            if not 0 <= i < len(a.options):
                raise AnswerError(f"option {i + 1} does not exist")
            ok = i == a.correct
            return Feedback(ok, f"{LETTERS[i]}) {a.options[i]}", error="" if ok else f"you picked {LETTERS[i]}) {a.options[i]}", **common)
        if isinstance(a, Ordering):
            order = tuple(answer) if isinstance(answer, (list, tuple)) else parse_ordering(str(answer), a)
            if sorted(order) != list(range(len(a.items))):
                raise AnswerError(f"give each of the {len(a.items)} items exactly once")
            ok = tuple(order) == a.correct
            wrong = [p + 1 for p, (i, j) in enumerate(zip(order, a.correct)) if i != j]
            error = "" if ok else f"positions {', '.join(map(str, wrong))} of {len(a.items)} are out of place"
            return Feedback(ok, " → ".join(a.items[i] for i in order), error=error, **common)
        line = answer if isinstance(answer, int) else parse_line(str(answer), a)
        if not 1 <= line <= len(a.lines):
            raise AnswerError(f"line {line} does not exist (1 to {len(a.lines)})")
        ok = line == a.bug
        error = "" if ok else f"line {line} is right as written; the function returns {a.run()!r} for {a.args!r} instead of {a.expected!r}"
        return Feedback(ok, f"line {line}", error=error, **common)
    except AnswerError as err:
        return Feedback(False, str(answer), error=str(err), valid=False, **common)


def relative_error(x: float, expected: float) -> float | None:
    """(x − e) / e, or None where it has no finite value: an expected value of 0, or a quotient past
    a float's range (1e308 against 4e-5)."""
    if expected == 0:
        return None
    rel = (x - expected) / expected  # float arithmetic overflows to ±inf, never raises
    return rel if math.isfinite(rel) else None


def _times(big: float, small: float) -> str:
    """How many times ``big`` is ``small`` (both > 0): '12.5 times', or from a million up 'about
    10^N times', from logarithms, as the quotient itself may lie past a float's range."""
    log_ratio = math.log10(big) - math.log10(small)
    if log_ratio < 6:
        return f"{num(big / small, 3)} times"
    return f"about 10^{round(log_ratio)} times"


def _numeric_error(x: float, a: Numeric, rel: float | None) -> str:
    """How far a wrong numeric answer ``x`` is from the expected ``e`` (``a.display``): of the same
    sign and within a factor 10, the relative error |x − e| / |e| in % (too high: x > e); further,
    the factor |x| / |e| or |e| / |x| (:func:`_times`, finite for every finite answer); of the
    opposite sign, that the sign is wrong and by what factor the magnitude is off. Zero is 100% off."""
    if a.rtol == 0:
        return f"{num(x, 6)} is not {round(a.display)}"
    e = a.display
    if e == 0:
        return f"off by {num(x, 4)} {a.unit}".strip()
    tolerance = f" (tolerance ±{100 * a.rtol:g}%)"
    if x == 0:  # every answer of the wrong sign is 100% off or more; zero exactly 100%
        return f"100% too {'high' if x > e else 'low'}" + tolerance
    big, small = max(abs(x), abs(e)), min(abs(x), abs(e))
    ratio = big / small  # ≥ 1; +inf past a float's range, which only _times has to print
    times, larger = _times(big, small), abs(x) > abs(e)
    magnitude = f"{times} too {'large' if larger else 'small'} in magnitude"
    if (x > 0) != (e > 0):
        off = "" if ratio <= 1 + a.rtol else f" and {magnitude}"
        return f"the sign is wrong: the answer is {'positive' if e > 0 else 'negative'}{off}{tolerance}"
    hint = ""
    for factor, why in ((2, "a factor 2"), (8, "a factor 8 (bits vs bytes?)"), (1000, "a factor 1000 (a unit prefix?)")):
        if abs(ratio - factor) < 0.02 * factor:
            hint = f"; off by {why}"
            break
    if ratio >= 10:  # a percentage would say less (or overflow): the factor
        return f"{times} too {'high' if larger else 'low'}{tolerance}{hint}" if e > 0 else f"{magnitude}{tolerance}{hint}"
    return f"{num(abs(rel) * 100, 3)}% too {'high' if x > e else 'low'}{tolerance}{hint}"


def render_answer_prompt(ex: Exercise) -> list[str]:
    """The lines that show what to answer, after the prompt (options, items, code)."""
    a = ex.answer
    if isinstance(a, Numeric):
        return [a.tolerance_text()[0].upper() + a.tolerance_text()[1:] + "."]
    if isinstance(a, Choice):
        return [f"  {LETTERS[i]}) {o}" for i, o in enumerate(a.options)] + ["Answer with a letter."]
    if isinstance(a, Ordering):
        return ([f"  {i + 1}. {it}" for i, it in enumerate(a.items)]
                + [f"Answer with the items from {a.first} to {a.last}, e.g. '{' '.join(str(i + 1) for i in range(len(a.items)))}'."])
    width = len(str(len(a.lines)))
    return [f"  {i + 1:>{width}} | {line}" for i, line in enumerate(a.lines)] + ["Answer with the line number."]


__all__ = ["KINDS", "DIFFICULTIES", "Numeric", "Choice", "Ordering", "FaultyLine", "Exercise", "Feedback", "AnswerError",
           "grade", "expected_text", "render_answer_prompt"]
