"""The command line in a narrow terminal: at 80 and 120 columns (``COLUMNS``) no table cuts a
number or a name with an ellipsis and no table line is wider than the terminal (a table too wide
prints in parts, each led by its key column: :class:`meshplan.cli.fit.FitTable`), and every help
screen shows each of its flags whole.

The commands run in-process through ``main`` as ``meshplan`` runs them; the figures that must
appear whole come from the same commands' ``--json``.
"""

from __future__ import annotations

import json
import re

import pytest
import typer
from rich.cells import cell_len
from rich.console import Console

from meshplan.cli.app import app
from meshplan.cli.fit import FitTable
from test_bad_input import run_cli

SEARCH = ("search", "--model", "llama3-70b", "--gpus", "256", "--seq-len", "8192", "--global-batch", "512")

COMMANDS = [
    ("estimate", "--preset", "llama3-405b-16k", "--tokens", "15T", "--price", "2"),
    ("estimate", "--preset", "torchtitan_8b_8gpu_fsdp"),
    ("estimate", "--preset", "llama3-405b-16k", "--vs", "nic_gbps=100", "--vs", "tp=4,cp=2"),
    ("estimate", "--preset", "llama3-405b-16k", "--sensitivity"),
    SEARCH,
    (*SEARCH, "--tokens", "1T", "--price", "2", "--pareto"),
    ("search", "--model", "llama3-8b", "--gpus", "8", "--seq-len", "4096", "--global-batch", "64", "--max-micro-batch", "2",
     "--baseline", "tp=2,pp=2"),
    (*SEARCH, "--all-variants", "--schedules", "1f1b,interleaved,interleaved-zb"),
    (*SEARCH, "--stacks", "megatron-core,torchtitan"),
    ("search", "--model", "llama3-405b", "--gpus", "8", "--seq-len", "8192", "--global-batch", "512"),  # the closest plans
    ("search", "--model", "llama3-8b", "--gpus-range", "8:32", "--seq-len", "4096", "--global-batch", "64", "--tokens", "1T",
     "--price", "2"),
    ("pipeline", "--pp", "4", "-m", "8", "--vpp", "2"),
    ("models",),
    ("gpus",),
    ("stacks",),
    ("stacks", "torchtitan"),
    ("learn", "--list"),
    ("calc", "collective", "--size", "2GB", "--n", "8", "--bw", "50"),
    ("calc", "zero", "--params", "70B", "--dp", "64"),
    ("calc", "formats"),
    ("calc", "failures", "--work", "54d", "--mtbf", "2.4h", "--checkpoint-time", "98s", "--runs", "200"),
    ("calc", "lr", "--base-lr", "3e-4", "--base-batch", "256", "--batch", "2048", "--steps", "100000"),
]


def run_at(monkeypatch, columns: int, *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    return run_cli(*args)


def table_lines(out: str) -> list[str]:
    """The lines that belong to a table: a rule, or two gaps of two spaces or more between words
    (prose lines may be printed unwrapped, for the terminal to wrap)."""
    return [line for line in out.splitlines()
            if "──" in line or len(re.findall(r"\S {2,}(?=\S)", line)) >= 2]


def assert_fits(out: str, columns: int) -> None:
    assert "…" not in out, [line for line in out.splitlines() if "…" in line]
    wide = [line for line in table_lines(out) if cell_len(line.rstrip()) > columns]
    assert not wide, wide


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:3]))
def test_tables_cut_nothing_and_fit_the_terminal(monkeypatch, args, columns):
    code, out, err = run_at(monkeypatch, columns, *args)
    assert code in (0, 1), err
    assert_fits(out, columns)


def test_validate_at_80_columns(monkeypatch):
    code, out, err = run_at(monkeypatch, 80, "validate")
    assert (code, err) == (0, "")
    assert_fits(out, 80)
    # the run table in three parts: sources and GPUs, step times, memory; each part names every run
    assert out.count("Step time and peak memory per run") == 3
    assert "llama3_405b_16384gpu_seq131072" in out


@pytest.mark.parametrize("columns", [80, 120])
def test_search_numbers_and_layouts_are_whole(monkeypatch, columns):
    code, out, err = run_at(monkeypatch, columns, *SEARCH, "--all-variants")
    assert code == 0, err
    code, js, err = run_cli(*SEARCH, "--json")
    assert code == 0, err
    words = set(out.split())
    for plan in json.loads(js)["top"]:
        p = plan["plan"]
        assert f"{plan['time']['step_s']:.3f}" in words
        assert f"TP{p['tp']} CP{p['cp']} PP{p['pp']} DP{p['dp']}" in out
        assert f"{p['schedule']} v{p['vpp']}" in out


def test_search_at_120_columns_tells_interleaved_from_interleaved_zb(monkeypatch):
    code, out, err = run_at(monkeypatch, 120, *SEARCH, "--schedules", "interleaved,interleaved-zb", "--all-variants")
    assert code == 0, err
    pipelines = {m.group(1) for m in re.finditer(r"\b(interleaved(?:-zb)?) v\d", out)}
    assert pipelines == {"interleaved", "interleaved-zb"}


def test_memory_table_at_80_columns_has_short_headers_and_every_rank(monkeypatch):
    code, out, err = run_at(monkeypatch, 80, "estimate", "--preset", "llama3-405b-16k")
    assert code == 0, err
    head = [line for line in out.splitlines() if line.strip().startswith("rank")]
    assert head and "grads" in head[0] and "activ." in head[0]
    assert out.count("Memory per GPU by pipeline rank") == 1  # one table, not parts
    assert_fits(out, 80)


def _commands(group: typer.core.TyperGroup, path: tuple[str, ...] = ()):
    """Every command of the CLI with its path: (path, click command)."""
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


HELP = list(_commands(typer.main.get_command(app)))


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("path,cmd", HELP, ids=[" ".join(p) for p, _ in HELP])
def test_help_shows_every_flag_whole(monkeypatch, path, cmd, columns):
    code, out, err = run_at(monkeypatch, columns, *path, "--help")
    assert (code, err) == (0, "")
    assert "…" not in out
    assert max(cell_len(line) for line in out.splitlines()) <= columns
    flags = [f for p in cmd.params for f in (*p.opts, *p.secondary_opts) if f.startswith("--")]
    assert flags
    for flag in flags:
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", out), (flag, path)


def test_estimate_help_at_80_columns_names_every_choice_whole(monkeypatch):
    code, out, err = run_at(monkeypatch, 80, "estimate", "--help")
    assert code == 0, err
    assert "<1f1b|interleaved|gpipe|" in out  # wrapped after a bar where the column is narrow
    words = set(re.findall(r"[\w-]+", out))  # no choice broken across lines
    assert {"zbh1", "interleaved-zb", "dualpipev", "selective"} <= words


# ---- the table itself ----------------------------------------------------------------------------


def _render(table: FitTable, width: int) -> str:
    con = Console(width=width, record=True, file=None, force_terminal=False, color_system=None)
    with con.capture() as cap:
        con.print(table)
    return cap.get()


def test_a_table_too_wide_prints_in_parts_led_by_its_key_column():
    t = FitTable(title="wide")
    t.add_column("name", no_wrap=True)
    for i in range(6):
        t.add_column(f"figure {i}", justify="right")
    t.add_row("first-row-name", *(f"{1234567.891 * (i + 1):,.3f}" for i in range(6)))
    t.add_row("second", *(f"{i:,}" for i in range(6)))
    whole = _render(t, 200)
    assert whole.count("first-row-name") == 1 and "wide (continued)" not in whole
    parts = _render(t, 50)
    assert "…" not in parts and max(cell_len(line) for line in parts.splitlines()) <= 50
    assert parts.count("first-row-name") == parts.count("wide") >= 2  # the key column leads every part
    for i in range(6):
        assert f"{1234567.891 * (i + 1):,.3f}" in parts


def test_a_wrapping_column_wraps_at_words_before_a_table_splits():
    t = FitTable()
    t.add_column("#", no_wrap=True)
    t.add_column("words")
    t.add_column("number", justify="right")
    t.add_row("1", "several short words that can wrap", "123,456,789")
    out = _render(t, 36)
    assert "123,456,789" in out and "several" in out and "…" not in out
    assert max(cell_len(line) for line in out.splitlines()) <= 36
    assert out.count("#") == 1  # one table
