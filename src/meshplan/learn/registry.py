"""The exercise library: every exercise is a builder registered under an id, with its topic,
difficulty and source; :func:`generate` runs it for the variant as in the source (``seed`` None)
or for a seeded random variant (the same seed always gives the same problem).

A builder receives a :class:`Variant` and returns a :class:`Problem`: the numbers it picked, the
expected answer and the worked solution, both computed by meshplan's library functions, hints,
and the equivalent ``meshplan`` command line and web-explorer URL.
"""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence
from urllib.parse import urlencode

from meshplan.errors import InputError
from meshplan.explain import Derivation
from meshplan.learn.model import DIFFICULTIES, Answer, Exercise

TOPICS = {
    "collectives": "ring and tree all-reduce, hierarchical collectives, algbw and busbw (001, 004)",
    "zero": "ZeRO stages 0-3: model state per GPU and its communication (001)",
    "batch": "gradient accumulation and critical batch size (000 exercise 6, 001)",
    "lr": "learning-rate scaling, warmup and cosine schedules (001)",
    "overlap": "communication hidden behind compute: buckets, FSDP prefetch, MFU (000 exercise 3, 001)",
    "pipeline": "pipeline bubbles, in-flight activations, interleaving (000 exercise 1, 001)",
    "tp": "tensor parallelism: shards, all-reduces, crossing the node (000 exercise 2, 001)",
    "cp": "context parallelism: ring attention's K/V traffic (000 exercise 4)",
    "checkpoint": "checkpoint size, write time, interval, failures (000 exercise 5, 001)",
    "precision": "mixed precision, number formats, loss scaling (001)",
    "llama3": "capstone: Llama 3 405B on 16,384 H100s (001, 003)",
}


@dataclass(frozen=True)
class Variant:
    """The variant being built: ``seed`` None is the one in the source."""

    seed: int | None
    rng: random.Random | None = None

    @property
    def fixed(self) -> bool:
        return self.seed is None

    def pick(self, fixed: Any, options: Sequence[Any]) -> Any:
        """``fixed`` for the source's variant, else one of ``options``."""
        return fixed if self.rng is None else self.rng.choice(list(options))

    def shuffled(self, items: Sequence[Any]) -> list[Any]:
        out = list(items)
        if self.rng is not None:
            self.rng.shuffle(out)
        return out


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: Answer
    solution: Sequence[Derivation]
    hints: Sequence[str]
    params: dict[str, Any]
    command: str
    url: str
    source_note: str | None = None
    explanation: str = ""


@dataclass(frozen=True)
class Spec:
    id: str
    topic: str
    title: str
    difficulty: str
    source: str
    build: Callable[[Variant], Problem] = field(repr=False)


REGISTRY: dict[str, Spec] = {}


def exercise(id: str, topic: str, title: str, difficulty: str, source: str):
    """Register a builder (decorator)."""
    assert topic in TOPICS and difficulty in DIFFICULTIES and id not in REGISTRY, id

    def wrap(fn: Callable[[Variant], Problem]) -> Callable[[Variant], Problem]:
        REGISTRY[id] = Spec(id, topic, title, difficulty, source, fn)
        return fn

    return wrap


def _load() -> None:
    """Import the topic modules, which register their exercises."""
    for module in ("ex_comm", "ex_faulty", "ex_llama3", "ex_memory", "ex_pipeline", "ex_training"):
        importlib.import_module(f"meshplan.learn.{module}")


def specs(topic: str | None = None) -> list[Spec]:
    """The registered exercises, in registration order; ``topic`` keeps one topic."""
    _load()
    if topic is not None and topic not in TOPICS:
        raise InputError("topic", f"unknown topic '{topic}' (one of: {', '.join(TOPICS)})")
    return [s for s in REGISTRY.values() if topic is None or s.topic == topic]


def get_spec(id: str) -> Spec:
    _load()
    if id not in REGISTRY:
        raise InputError("exercise", f"unknown exercise '{id}' (see `meshplan learn --list`)")
    return REGISTRY[id]


def generate(id: str, seed: int | None = None) -> Exercise:
    """The exercise ``id``: as in the source (``seed`` None) or the random variant of ``seed``."""
    spec = get_spec(id)
    if seed is not None and (not isinstance(seed, int) or seed < 0):
        raise InputError("seed", f"must be a non-negative whole number (got {seed!r})")
    v = Variant(seed, None if seed is None else random.Random(f"{id}:{seed}"))
    p = spec.build(v)
    return Exercise(
        id=spec.id, topic=spec.topic, title=spec.title, difficulty=spec.difficulty, prompt=p.prompt, answer=p.answer,
        solution=tuple(p.solution), hints=tuple(p.hints), params=dict(p.params), source=spec.source,
        command=p.command, url=p.url, seed=seed, source_note=p.source_note if seed is None else None,
        explanation=p.explanation,
    )


# ---- links: the command line and the web view preloaded with the problem's numbers --------------


def _text(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def command(*words: str, **options: Any) -> str:
    """``meshplan <words> --opt value ...``; options with value True are flags, None are left out."""
    out = ["meshplan", *words]
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.rstrip("_").replace("_", "-")
        out.append(flag if value is True else f"{flag} {_text(value)}")
    return " ".join(out)


def url(path: str, **query: Any) -> str:
    """A view of the web explorer with the problem's numbers as its query, in the view's own
    parameter names (the CLI's options with underscores: ``seq_len``, ``gpus_per_node``);
    ``/calc/<name>`` is the Calculators view of calculator ``name``, ``/calc?calc=<name>&...``."""
    q = {}
    if path.startswith("/calc/"):
        path, q["calc"] = "/calc", path.removeprefix("/calc/")
    q.update({k.rstrip("_"): ("true" if v is True else _text(v)) for k, v in query.items() if v is not None and v is not False})
    return path + ("?" + urlencode(q) if q else "")


def gb(x: float) -> str:
    """Bytes as a size option, e.g. ``2GB``."""
    return f"{x / 1e9:.6g}GB"


def dur(t: float) -> str:
    """Seconds as a duration option in the most readable unit."""
    for unit, scale in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale or unit == "us":
            return f"{t / scale:.6g}{unit}"
    return f"{t:g}s"


def derivs(result: Any, *keys: str) -> list[Derivation]:
    """The derivations of a calculator result with these keys, in the order given."""
    by_key = {d.key: d for d in result.derivations}
    return [by_key[k] for k in keys]
