"""Parsing the documents users give (engine configs, model files) within stated bounds, checked
before and while they are read, so that no file can make meshplan work without end:

* at most :data:`MAX_DOCUMENT_BYTES` of text (configs and model files are a few kilobytes);
* at most :data:`MAX_DEPTH` levels of nesting, checked on the text's brackets before parsing (no
  parser recursion runs away) and on the parsed tree;
* at most :data:`MAX_VALUES` values once YAML aliases are expanded (a "billion laughs" file of a
  few hundred bytes names billions), and no alias that refers to itself.

A document over a bound is one :class:`~meshplan.errors.InputError` naming the bound, never the
document's content. Syntax errors are left to the callers (their native exceptions), which know
how to name the file. :func:`brief` shows a value in an error message at a bounded length.
"""

from __future__ import annotations

import itertools
import json
import re
import reprlib
import tomllib
from pathlib import Path
from typing import Any

import yaml

from meshplan.errors import InputError

MAX_DOCUMENT_BYTES = 1 << 20  # 1 MiB
MAX_DEPTH = 64
MAX_VALUES = 100_000

_QUOTED = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_brief = reprlib.Repr()
_brief.maxlevel, _brief.maxstring, _brief.maxother, _brief.maxlist, _brief.maxdict = 2, 40, 40, 4, 4


def brief(value: Any) -> str:
    """``repr(value)`` cut short (a few items, two levels, 40 characters a string) for error
    messages: computed without walking the whole value."""
    text = _brief.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def check_size(text: str, where: str) -> None:
    """Refuse text over :data:`MAX_DOCUMENT_BYTES`."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise InputError(where, f"the file holds {len(text):,} characters, more than the {MAX_DOCUMENT_BYTES:,} a config may")


def check_file_size(path: Path, where: str) -> None:
    """Refuse, before reading it, a file over :data:`MAX_DOCUMENT_BYTES` (a stat failure is left
    to the read that follows)."""
    try:
        size = path.stat().st_size
    except OSError:
        return
    if size > MAX_DOCUMENT_BYTES:
        raise InputError(where, f"{path.name} is {size:,} bytes, more than the {MAX_DOCUMENT_BYTES:,} a config may")


def check_bracket_depth(text: str, where: str) -> None:
    """Refuse text whose brackets (outside quoted strings) nest deeper than :data:`MAX_DEPTH`:
    JSON, TOML arrays and inline tables, YAML flow collections."""
    brackets = _NOT_BRACKET.sub("", _QUOTED.sub("", text))
    steps = (1 if c in "[{" else -1 for c in brackets)
    deepest = max(itertools.accumulate(steps, initial=0))
    if deepest > MAX_DEPTH:
        raise InputError(where, f"brackets nest {deepest:,} levels deep, more than the {MAX_DEPTH} a config may")


def _kids(node: Any) -> list:
    items = node.values() if isinstance(node, dict) else node
    return [c for c in items if isinstance(c, (dict, list))]


def check_tree(data: Any, where: str) -> None:
    """Refuse a parsed document deeper than :data:`MAX_DEPTH`, with more than :data:`MAX_VALUES`
    values once shared parts (YAML aliases) are counted each time they are used, or that contains
    itself. Iterative, each distinct container visited once."""
    done: dict[int, tuple[int, int]] = {}  # id -> (values, depth) of a finished container
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, finished = stack.pop()
        if not isinstance(node, (dict, list)) or (id(node) in done and not finished):
            continue
        kids = _kids(node)
        if not finished:
            if id(node) in open_:
                raise InputError(where, "an alias refers to a value that contains it")
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in done)
            continue
        if any(id(k) not in done for k in kids):
            raise InputError(where, "an alias refers to a value that contains it")
        values = 1 + len(node) - len(kids) + sum(done[id(k)][0] for k in kids)
        depth = 1 + max((done[id(k)][1] for k in kids), default=0)
        if depth > MAX_DEPTH:
            raise InputError(where, f"values nest more than the {MAX_DEPTH} levels a config may")
        if values > MAX_VALUES:
            raise InputError(where, f"the document holds more than {MAX_VALUES:,} values once its aliases are expanded")
        open_.discard(id(node))
        done[id(node)] = (values, depth)


def _parsed(load: Any, text: str, where: str, brackets: bool = True) -> Any:
    check_size(text, where)
    if brackets:
        check_bracket_depth(text, where)
    try:
        data = load(text)
    except RecursionError:
        raise InputError(where, f"values nest more than the {MAX_DEPTH} levels a config may") from None
    check_tree(data, where)
    return data


def load_json(text: str, where: str) -> Any:
    """``json.loads`` within the bounds (``json.JSONDecodeError`` for bad syntax)."""
    return _parsed(json.loads, text, where)


def load_toml(text: str, where: str) -> Any:
    """``tomllib.loads`` within the bounds (``tomllib.TOMLDecodeError`` for bad syntax)."""
    return _parsed(tomllib.loads, text, where)


def load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load`` within the bounds (``yaml.YAMLError`` for bad syntax); block nesting
    too deep for the parser is refused as well."""
    return _parsed(yaml.safe_load, text, where)
