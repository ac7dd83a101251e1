"""``meshplan validate``: the JSON is the library's report, the Markdown and the human tables list
every run (unsupported ones with their reason), the scatter has one marker per predicted run on
the right side of y = x, and bad input is one line ``error: <field>: <rule>`` with exit 2.

``validate_runs`` over every published run takes about a second, so the library report is built
once per module; the CLI computes it for real once (the JSON test), and the other tests hand it
the module's report through ``build_report``."""

from __future__ import annotations

import contextlib
import io
import json
import xml.etree.ElementTree as ET

import pytest

from meshplan.accuracy import validate_runs
from meshplan.cli import validate_cmd
from meshplan.cli.app import main

SVG = "{http://www.w3.org/2000/svg}"
SOURCES = ["narayanan21", "korthikanti22", "megatron_readme", "llama3", "bloom", "opt", "neox", "torchtitan", "trainy",
           "nemo2407", "mbridge", "dgxc", "mtnlg", "llmfoundry"]  # the visible sources, then the held-out ones


@pytest.fixture(scope="module")
def report():
    return validate_runs()


@pytest.fixture
def cached(report, monkeypatch):
    """The CLI with the module's report instead of recomputing it (for the full, unfiltered run)."""
    def build(sources=None, run_set="visible"):
        assert sources is None and run_set == "visible"
        return report

    monkeypatch.setattr(validate_cmd, "build_report", build)
    return report


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["validate", *args])
    return code, out.getvalue(), err.getvalue()


def assert_one_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (code, out, err)
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err
    assert needle in err, err


def _mean(xs):
    return sum(xs) / len(xs)


# ---- JSON ---------------------------------------------------------------------------------------


def test_json_is_the_library_report(report):
    code, out, err = run_cli("--json")  # the real computation, not the module's report
    assert (code, err) == (0, "")
    assert out.count("\n") == 1
    d = json.loads(out)
    assert set(d) == {"set", "rows", "groups", "overall", "precisions", "source_precisions", "buckets", "generations", "stacks", "series", "series_drift", "worst", "interval_coverage"} and d["set"] == "visible"
    assert [r["id"] for r in d["rows"]] == [r.id for r in report.rows]
    assert len(d["rows"]) == 55
    for row, lib in zip(d["rows"], report.rows):
        assert row["status"] == lib.status and row["group"] == lib.group, lib.id
        if lib.status != "ok":
            assert row["reason"] == lib.reason and row["reason"].strip()
            assert row["predicted_step_s"] is None and row["error"] is None
            continue
        assert row["published_step_s"] == lib.published_step_s
        assert row["predicted_step_s"] == pytest.approx(lib.predicted_step_s, rel=1e-12)
        assert row["error"] == pytest.approx((row["predicted_step_s"] - row["published_step_s"]) / row["published_step_s"], rel=1e-12)
        if lib.published_mem_gib:
            assert row["mem_error"] == pytest.approx(row["predicted_mem_gib"] / row["published_mem_gib"] - 1, rel=1e-9)
        else:
            assert row["mem_error"] is None
    assert {r["id"] for r in d["rows"] if r["status"] != "ok"} == {"megatron_readme_h100_177B_strong_scaling", "opt_175b_992gpu"}
    # the summaries are the means of the rows printed with them
    assert list(d["groups"]) == SOURCES[:9]
    for name, g in d["groups"].items():
        errs = [r["error"] for r in d["rows"] if r["group"] == name and r["error"] is not None]
        assert g["rows"] == sum(r["group"] == name for r in d["rows"])
        assert g["supported"] == len(errs)
        if errs:
            assert g["mape"] == pytest.approx(_mean([abs(e) for e in errs]), rel=1e-12)
            assert g["bias"] == pytest.approx(_mean(errs), rel=1e-12)
            assert g["mape"] == pytest.approx(report.groups[name].mape, rel=1e-12)
        else:
            assert g["mape"] is None and report.groups[name].mape is None
    errs = [r["error"] for r in d["rows"] if r["error"] is not None]
    assert d["overall"]["supported"] == len(errs) == 53
    assert d["overall"]["mape"] == pytest.approx(_mean([abs(e) for e in errs]), rel=1e-12)
    assert d["overall"]["bias"] == pytest.approx(_mean(errs), rel=1e-12)
    ranked = sorted((r for r in d["rows"] if r["error"] is not None), key=lambda r: abs(r["error"]), reverse=True)
    assert d["worst"] == [r["id"] for r in ranked[:5]] == [r.id for r in report.worst]
    # by compute precision: every precision over all rows, and each source that ran several
    assert {r["precision"] for r in d["rows"] if r["error"] is not None} == set(d["precisions"]) == {"fp16", "bf16", "fp8"}
    for p, g in d["precisions"].items():
        errs = [r["error"] for r in d["rows"] if r["precision"] == p and r["error"] is not None]
        assert g["supported"] == len(errs) and g["mape"] == pytest.approx(_mean([abs(e) for e in errs]), rel=1e-12)
    assert sum(g["supported"] for g in d["precisions"].values()) == 53
    assert list(d["source_precisions"]) == ["torchtitan/bf16", "torchtitan/fp8"]
    tt = [r for r in d["rows"] if r["group"] == "torchtitan" and r["precision"] == "fp8"]
    assert d["source_precisions"]["torchtitan/fp8"]["bias"] == pytest.approx(_mean([r["error"] for r in tt]), rel=1e-12)


def test_source_filter_keeps_only_those_rows_with_the_same_predictions(report):
    code, out, err = run_cli("--json", "--source", "korthikanti22", "--source", "LLAMA3,korthikanti22")
    assert (code, err) == (0, "")
    d = json.loads(out)
    assert list(d["groups"]) == ["korthikanti22", "llama3"]
    expected = [r for r in report.rows if r.group in ("korthikanti22", "llama3")]
    assert [r["id"] for r in d["rows"]] == [r.id for r in expected] and len(expected) == 12
    for row, lib in zip(d["rows"], expected):
        assert row["error"] == pytest.approx(lib.error, rel=1e-12)
    assert d["overall"]["mape"] == pytest.approx(_mean([abs(r.error) for r in expected]), rel=1e-12)
    assert d["groups"]["korthikanti22"]["mape"] == pytest.approx(report.groups["korthikanti22"].mape, rel=1e-12)


# ---- Markdown and the tables --------------------------------------------------------------------


def test_markdown_has_the_tables_and_every_run(cached):
    code, out, err = run_cli("--markdown")
    assert (code, err) == (0, "")
    assert out.startswith("meshplan vs published training runs (visible set): 55 rows from 9 sources, 53 predicted, 2 unsupported")
    assert ("| run | source | GPU × count | published step (s) | predicted step (s) | error | published memory (GiB) "
            "| predicted memory (GiB) | memory error |") in out
    assert "| source | publication | rows | predicted | step MAPE | bias |" in out
    for r in cached.supported():
        (line,) = [ln for ln in out.splitlines() if ln.startswith(f"| `{r.id}` |")]
        assert f"| {100 * r.error:+.1f}% |" in line
        assert f"| {r.published_step_s:,.3f} | {r.predicted_step_s:,.3f} |" in line
    unsupported = out.split("### Unsupported runs", 1)[1]
    for r in cached.unsupported():
        assert f"- `{r.id}` ({r.group}): {r.reason}" in unsupported
    ov = cached.overall
    assert f"| **overall** |  | 55 | 53 | {100 * ov.mape:.1f}% | {100 * ov.bias:+.1f}% |" in out
    kt = cached.groups["korthikanti22"]
    assert f"| korthikanti22 | Korthikanti et al. 2022, Tables 3/5 | 9 | 9 | {100 * kt.mape:.1f}% |" in out


def test_human_output_lists_runs_unsupported_and_summaries(cached):
    code, out, err = run_cli()
    assert (code, err) == (0, "")
    for r in cached.supported():
        assert r.id in out
    assert "Unsupported runs, not predicted (2):" in out
    for r in cached.unsupported():
        assert f"{r.id} ({r.group}): " in out
    assert "MAPE per source" in out and "Largest step-time errors:" in out
    (overall,) = [ln for ln in out.splitlines() if ln.strip().startswith("overall")]
    assert f"{100 * cached.overall.mape:.1f}%" in overall
    assert f"{cached.worst[0].id} ({cached.worst[0].group}): {100 * cached.worst[0].error:+.1f}%" in out


# ---- the scatter --------------------------------------------------------------------------------


def test_out_svg_has_one_marker_per_run_on_the_right_side_of_y_eq_x(cached, tmp_path):
    path = tmp_path / "acc.svg"
    code, out, err = run_cli("--out", str(path))
    assert (code, err) == (0, "")
    assert f"wrote {path}" in out
    root = ET.fromstring(path.read_text(encoding="utf-8"))  # valid XML
    assert root.tag == SVG + "svg"
    points = [e for e in root.iter() if e.get("class") == "point"]
    expected = [r for r in cached.supported() if r.published_step_s]
    assert len(points) == len(expected) == 53
    assert [p.get("data-run") for p in points] == [r.id for r in expected]
    for p, r in zip(points, expected):
        (title,) = p.findall(SVG + "title")
        assert title.text.startswith(r.id) and f"{100 * r.error:+.1f}%" in title.text
        assert p.tag in (SVG + "circle", SVG + "path")
    assert len({p.get("fill") for p in points}) == len({r.group for r in expected})  # one colour per source
    # circles sit below the dashed y = x line exactly when meshplan predicts a faster step
    (diag,) = [e for e in root.iter(SVG + "line") if e.get("class") == "identity"]
    x1, y1, x2, y2 = (float(diag.get(k)) for k in ("x1", "y1", "x2", "y2"))
    circles = [(p, r) for p, r in zip(points, expected) if p.tag == SVG + "circle"]
    assert circles
    for p, r in circles:
        cx, cy = float(p.get("cx")), float(p.get("cy"))
        y_line = y1 + (cx - x1) * (y2 - y1) / (x2 - x1)
        assert (cy > y_line) == (r.error < 0), r.id  # SVG y grows downwards
    assert sum(e.get("class") == "band" for e in root.iter()) == 1


def test_out_png(cached, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "acc.png"
    code, out, err = run_cli("--json", "--out", str(path))
    assert (code, err) == (0, "")
    json.loads(out)  # still one JSON object and nothing else
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# ---- bad input ----------------------------------------------------------------------------------


@pytest.fixture
def no_report(monkeypatch):
    """Bad input is refused before any run is predicted."""
    def build(*args, **kwargs):
        raise AssertionError("the report was built despite bad input")

    monkeypatch.setattr(validate_cmd, "build_report", build)


def test_unknown_source_is_one_line_listing_the_valid_names(no_report):
    code, out, err = run_cli("--source", "korthikanti22,megatron")
    assert_one_error(code, out, err, "error: source: unknown source 'megatron' (valid: " + ", ".join(SOURCES) + ")")


def test_bad_out_extension_is_one_line_and_writes_nothing(no_report, tmp_path):
    assert_one_error(*run_cli("--out", str(tmp_path / "acc.jpg")), "error: out: must be a .svg or .png file")
    assert_one_error(*run_cli("--out", str(tmp_path / "nope" / "acc.svg")), "does not exist")
    assert list(tmp_path.iterdir()) == []
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"the user's picture")
    assert_one_error(*run_cli("--out", str(mine)), f"error: out: '{mine}' already exists; meshplan does not overwrite files")
    assert mine.read_bytes() == b"the user's picture"


def test_json_and_markdown_together_are_refused(no_report):
    assert_one_error(*run_cli("--json", "--markdown"), "error: markdown: give either --json or --markdown")


def test_a_plot_with_nothing_to_draw_is_refused(tmp_path):
    assert_one_error(*run_cli("--source", "opt", "--out", str(tmp_path / "o.svg")), "error: out: no predicted run")
    assert not (tmp_path / "o.svg").exists()
