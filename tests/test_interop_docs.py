"""docs/interop.md shows the Llama 3 405B exports as `meshplan export` prints them: every line of
each `--from-search` example (the search's note, the warnings, the config) is what the command
prints now, and nothing it prints is left out."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from meshplan.cli.app import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "interop.md"
EXAMPLE = re.compile(r"```\n\$ meshplan (export [^\n]*--from-search[^\n]*)\n(.*?)```", re.S)


def _examples() -> list[tuple[str, str]]:
    found = [(m.group(1), m.group(2)) for m in EXAMPLE.finditer(DOC.read_text())]
    assert len(found) == 5, [cmd for cmd, _ in found]  # torchtitan, torchtitan-toml, megatron, deepspeed, nanotron
    return found


@pytest.fixture(scope="module")
def one_search_per_command():
    """The five examples run one search (the 16K preset's, by throughput) and differ only in --to:
    the first export runs it, the others get that result for the same arguments."""
    from meshplan.cli import search_cmd

    execute, done = search_cmd.execute, {}

    def once(*args, **kwargs):
        key = repr((args, kwargs))
        if key not in done:
            done[key] = execute(*args, **kwargs)
        return done[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(search_cmd, "execute", once)
        yield done


@pytest.mark.parametrize(("command", "shown"), _examples(), ids=lambda v: v.split("--to ")[-1] if "--to " in v else "")
def test_export_example_is_what_the_command_prints(command, shown, capsys, one_search_per_command):
    capsys.readouterr()
    assert main(shlex.split(command)) == 0
    out = capsys.readouterr()
    printed = out.err.splitlines() + out.out.splitlines()
    assert printed == shown.splitlines()


def test_import_example_is_what_the_command_prints(tmp_path, capsys, monkeypatch):
    """The Megatron-LM round trip of the 8K preset: `meshplan import args.sh` prints the flags shown."""
    block = re.search(r"```\n\$ meshplan export --preset llama3-405b-8k --to megatron --out args.sh\n"
                      r"\$ meshplan import args.sh\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None
    monkeypatch.chdir(tmp_path)
    assert main(["export", "--preset", "llama3-405b-8k", "--to", "megatron", "--out", "args.sh"]) == 0
    capsys.readouterr()
    assert main(["import", "args.sh"]) == 0
    out = capsys.readouterr()
    assert (out.err + out.out).splitlines() == block.group(1).splitlines()
