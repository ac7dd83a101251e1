"""The commands the README and docs/*.md show, run: every ``$ meshplan ...`` line of a fenced block
(and a block marked ``<!-- output of: meshplan ... -->`` just above its fence, or a Markdown table
marked ``<!-- table of: meshplan ... -->``, whose rows' cells must print in order) runs with exit code
0, and every line the docs show under it appears in what it prints, in order (abridged: lines may
be left out, ``...`` inside a line skips text, and whitespace is not compared, so a table's padding
and a sentence wrapped by hand still match). A trailing ``# 9.63 s a step`` comment's figure must
be in the output too. docs/interop.md's ``--from-search`` exports are compared line for line by
tests/test_interop_docs.py and are not run again here."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from test_bad_input import run_cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:<!-- output of: (meshplan [^\n]*?) -->\n)?```[a-z]*\n(.*?)```", re.S)
SKIP = ("--from-search",)  # compared exactly by tests/test_interop_docs.py


TABLE = re.compile(r"<!-- table of: (meshplan [^\n]*?) -->\n((?:\|[^\n]*\n)+)")


def _tables(doc: Path, text: str) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """A Markdown table marked ``<!-- table of: meshplan ... -->``: each data row's cells, which the
    command prints in the same order (the header and the ``---`` row are the docs' own)."""
    out = []
    for m in TABLE.finditer(text):
        rows = [r for r in m.group(2).splitlines()[2:] if r.strip()]
        shown = ["...".join(c.strip() for c in r.strip().strip("|").split("|")) for r in rows]
        out.append((f"{doc.name}:{text[:m.start()].count(chr(10)) + 1}", [(m.group(1), shown)]))
    return out


def _segments(doc: Path) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """Per checked block: an id and its (command, shown lines) pairs, in order."""
    text = doc.read_text()
    out = _tables(doc, text)
    for n, m in enumerate(FENCE.finditer(text)):
        marked, body = m.group(1), m.group(2)
        pairs: list[tuple[str, list[str]]] = []
        if marked:
            pairs.append((marked, body.splitlines()))
        else:
            for line in body.splitlines():
                if line.startswith("$ meshplan "):
                    pairs.append((line[2:], []))
                elif line.startswith("$ "):
                    pairs.append(("", []))  # another program: its output is not checked
                elif pairs:
                    pairs[-1][1].append(line)
        pairs = [(c, s) for c, s in pairs if c]
        if pairs and not any(k in c for c, _ in pairs for k in SKIP):
            line_no = text[:m.start()].count("\n") + 1
            out.append((f"{doc.name}:{line_no}", pairs))
    return out


CASES = [case for doc in DOCS for case in _segments(doc)]


def _norm(s: str) -> str:
    return " ".join(s.split())


def _in_order(shown: list[str], printed: str) -> None:
    """Each shown line (its parts around ``...``) appears in ``printed``, after the one before."""
    flat, at = _norm(printed), 0
    for line in shown:
        for part in (p for p in (_norm(x) for x in re.split(r"\.\.\.|…", line)) if p):
            found = flat.find(part, at)
            assert found >= 0, f"not printed (after offset {at}): {part!r}"
            at = found + len(part)


def _needs_a_file_the_docs_do_not_give(words: list[str]) -> bool:
    """A command that reads a config or GPU file which no earlier command of its block wrote
    (``--gpu bad.yaml`` of an example whose file the text describes)."""
    reads = [w for i, w in enumerate(words) if w.endswith((".yaml", ".json", ".sh", ".toml")) and words[i - 1] != "--out"]
    return any(not Path(w).exists() for w in reads)


@pytest.mark.parametrize(("where", "pairs"), CASES, ids=[c[0] for c in CASES])
def test_the_docs_commands_print_what_the_docs_show(where, pairs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    for command, shown in pairs:
        words = shlex.split(command.split(" | ")[0], comments=True)
        if _needs_a_file_the_docs_do_not_give(words):
            continue
        code, out, err = run_cli(*words[1:])
        refused = bool(shown) and shown[0].startswith("error: ")
        ok = (2,) if refused else (0, 1) if words[1] == "search" else (0,)
        assert code in ok, (command, err[-500:])
        _in_order(shown, err + out)
        claim = re.search(r"#\s*([\d.,]+ (?:s|GiB|days))\b", command)
        if claim:
            assert claim.group(1) in out, (command, claim.group(1))


def test_the_docs_show_commands():
    """The collection above is not empty: the README's worked examples are among the cases."""
    assert len(CASES) >= 5 and any(w.startswith("README.md") for w, _ in CASES)
