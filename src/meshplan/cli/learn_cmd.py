"""``meshplan learn``: the workbook in the terminal.

Each exercise shows its prompt and what to answer (unit and tolerance, options, items or the
numbered code); the learner types an answer, ``hint`` for the next hint, ``skip`` (or an empty
line) for the solution, ``quit`` to stop. Every graded answer prints right or wrong, the error,
the worked solution (the derivations of the library functions that computed it), where the
source's own answer is wrong, and the equivalent ``meshplan`` command and web-explorer link.
Reads stdin line by line, so a session can be piped; end of input ends the session (status 0).
"""

from __future__ import annotations

import json
import random
import sys
from typing import Annotated, Optional

import typer
from rich import box
from rich.console import Console

from meshplan.cli import render
from meshplan.cli.fit import FitTable
from meshplan.errors import InputError
from meshplan.learn import TOPICS, generate, grade, specs
from meshplan.learn.model import Exercise, Feedback, render_answer_prompt
from meshplan.learn.registry import get_spec

SKIP = {"", "skip", "s", "solution"}
QUIT = {"quit", "q", "exit"}
HINT = {"hint", "h", "?"}


def _pick(topic: Optional[str], ids: Optional[list[str]]) -> list[str]:
    if ids:
        for i in ids:
            get_spec(i)
        if topic is not None:
            wrong = [i for i in ids if get_spec(i).topic != topic]
            if wrong:
                raise InputError("exercise", f"'{wrong[0]}' is not in topic '{topic}'")
        return list(ids)
    return [s.id for s in specs(topic)]


def _list(ids: list[str], seed: Optional[int], json_out: bool, out: Console) -> None:
    if json_out:
        typer.echo(json.dumps([generate(i, seed).to_dict() for i in ids], allow_nan=False))
        return
    t = FitTable(box=box.SIMPLE_HEAD, title=f"meshplan learn: {len(ids)} exercises", title_justify="left")
    for c in ("id", "topic", "kind", "difficulty", "title", "source"):
        t.add_column(c)
    for i in ids:
        s = get_spec(i)
        t.add_row(i, s.topic, generate(i).kind, s.difficulty, s.title, s.source)
    out.print(t)
    out.print("topics: " + "; ".join(f"{k} ({v})" for k, v in TOPICS.items()), markup=False, soft_wrap=True)


def _show(ex: Exercise, k: int, n: int, out: Console) -> None:
    variant = "as in the source" if ex.fixed else f"seed {ex.seed}"
    out.rule(f"[{k}/{n}] {ex.title}  ·  {ex.topic}, {ex.difficulty}, {ex.kind}  ·  {variant}")
    out.print(ex.prompt, markup=False, soft_wrap=True)
    for line in render_answer_prompt(ex):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print("(type 'hint' for a hint, 'skip' for the solution, 'quit' to stop)", style="dim")


def _feedback(fb: Feedback | None, ex: Exercise, out: Console) -> None:
    if fb is None:
        out.print(f"answer: {grade(ex, '').expected}", markup=False)
    elif fb.correct:
        out.print(f"right: {fb.given} (expected {fb.expected})", style="bold green", markup=False)
    else:
        out.print(f"wrong: {fb.given}: {fb.error}", style="bold red", markup=False)
        out.print(f"answer: {fb.expected}", markup=False)
    out.print("worked solution:", style="bold")
    out.print(ex.solution_text(), markup=False, highlight=False, soft_wrap=True)
    if ex.source_note:
        out.print(f"the source: {ex.source_note}", style="yellow", markup=False, soft_wrap=True)
    out.print(f"try it: {ex.command}", markup=False, soft_wrap=True)
    out.print(f"explorer: {ex.url}", markup=False, soft_wrap=True)


def _ask(out: Console) -> str | None:
    try:
        text = out.input("answer> ")
    except EOFError:
        return None
    except UnicodeDecodeError as err:  # stdin decoded strictly, and the bytes are not its encoding
        raise InputError("input", f"the answer is not {err.encoding} text (byte {err.object[err.start:err.start + 1]!r} at {err.start})") from None
    if not sys.stdin.isatty():  # piped: show what was read, so the transcript reads as a dialogue
        out.print(text, markup=False, highlight=False)
    return text


def session(ids: list[str], seed: Optional[int], out: Console) -> tuple[int, int, int]:
    """Run the exercises; returns (right, graded, shown)."""
    right = graded = shown = 0
    for k, i in enumerate(ids, 1):
        ex = generate(i, seed)
        shown += 1
        _show(ex, k, len(ids), out)
        hints = list(ex.hints)
        while True:
            text = _ask(out)
            if text is None:
                out.print("")
                return right, graded, shown
            word = text.strip().lower()
            if word in QUIT:
                return right, graded, shown
            if word in HINT:
                out.print(f"hint: {hints.pop(0)}" if hints else "no more hints: 'skip' shows the solution", markup=False, soft_wrap=True)
                continue
            if word in SKIP:
                _feedback(None, ex, out)
                break
            fb = grade(ex, text)
            if not fb.valid:
                out.print(f"could not read that: {fb.error}", style="yellow", markup=False, soft_wrap=True)
                continue
            graded += 1
            right += fb.correct
            _feedback(fb, ex, out)
            break
    return right, graded, shown


def learn(
    topic: Annotated[Optional[str], typer.Option("--topic", help=f"Only this topic: {', '.join(TOPICS)}.", show_default=False)] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Random variants of this seed (the same seed, the same problems). Default: a fresh seed, printed.", show_default=False)] = None,
    fixed: Annotated[bool, typer.Option("--fixed", help="The variants as in the sources (with the sources' wrong answers corrected).")] = False,
    list_: Annotated[bool, typer.Option("--list", help="List the exercises instead of running them (--json: the generated exercises as JSON).")] = False,
    exercise: Annotated[Optional[list[str]], typer.Option("--exercise", help="Only this exercise id (repeatable); see --list.", show_default=False)] = None,
    count: Annotated[Optional[int], typer.Option("--count", help="At most this many exercises in the session.", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="With --list: print the exercises as one JSON list.")] = False,
) -> None:
    """Exercises from the source documents and on the mechanisms meshplan models, with instant feedback: numeric, multiple choice, ordering and find-the-faulty-line, graded by meshplan's own engine, with worked solutions."""
    try:
        if fixed and seed is not None:
            raise InputError("seed", "--seed and --fixed exclude each other (--fixed is the source's variant)")
        if seed is not None and seed < 0:
            raise InputError("seed", f"must be a non-negative whole number (got {seed})")
        if count is not None and count < 1:
            raise InputError("count", f"must be a positive integer (got {count})")
        if json_out and not list_:
            raise InputError("json", "applies to --list only")
        if topic is not None and topic not in TOPICS:
            raise InputError("topic", f"unknown topic '{topic}' (one of: {', '.join(TOPICS)})")
        ids = _pick(topic, exercise)
    except InputError as err:
        typer.echo("error: " + " ".join(str(err).split()), err=True)
        raise typer.Exit(2) from None
    ids = ids[:count] if count else ids
    out = render.console()
    if list_:
        _list(ids, None if fixed else seed, json_out, out)
        return
    if not fixed and seed is None:
        seed = random.SystemRandom().randrange(1_000_000)
    label = "the variants as in the sources" if fixed else f"seed {seed} (rerun with --seed {seed})"
    out.print(f"meshplan learn: {len(ids)} exercise{'s' if len(ids) != 1 else ''}, {label}", style="bold", markup=False)
    right, graded, shown = session(ids, None if fixed else seed, out)
    out.rule("end of session")
    out.print(f"{right} of {graded} answered right ({shown} of {len(ids)} exercises shown)", markup=False)
