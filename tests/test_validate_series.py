"""Scaling series in ``meshplan validate``: one layout at several GPU counts, its scaling efficiency
published and predicted, and the drift of the error per doubling of the GPU count — the formulas on
hand-made rows, the series found among the validated runs, and the text, JSON, Markdown and
picture."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from test_validate_cli import assert_one_error, run_cli

from meshplan.accuracy.series import drift, drift_summary, efficiency, scaling_kind, scaling_series
from meshplan.accuracy.validate import RunResult
from meshplan.cli import validate_cmd


def _row(run: str, series: str, gpus: int, tokens: int, published: float, predicted: float, label: str = "") -> RunResult:
    return RunResult(id=run, run_id=run, group="src", source="src", gpu="h100-sxm-80gb", gpus=gpus, status="ok",
                     published_step_s=published, predicted_step_s=predicted, error=(predicted - published) / published,
                     series_id=series, series=label or series, tokens=tokens)


def test_efficiency_drift_and_kind_by_hand():
    # 8 -> 32 GPUs, 4x the tokens (weak), published step 10 -> 11 s: efficiency 10/11
    assert efficiency((1000, 4000), (10.0, 11.0), (8, 32)) == pytest.approx(10 / 11, rel=1e-15)
    # strong: same tokens on twice the GPUs in 0.6 of the time: 1/(2·0.6)
    assert efficiency((1000, 1000), (10.0, 6.0), (8, 16)) == pytest.approx(1 / 1.2, rel=1e-15)
    # errors -1, -2, -3 % at 8, 16, 32 GPUs: one point per doubling, exactly
    assert drift([8, 16, 32], [-0.01, -0.02, -0.03]) == pytest.approx(-0.01, abs=1e-15)
    # two points two doublings apart
    assert drift([8, 32], [0.0, -0.04]) == pytest.approx(-0.02, abs=1e-15)
    # least squares, not end to end: 8, 16, 64 GPUs (x = 3, 4, 6), errors 0, 0, -0.03 -> slope -21/14 %
    assert drift([8, 16, 64], [0.0, 0.0, -0.03]) == pytest.approx(-0.03 * (6 - 13 / 3) / (14 / 3), abs=1e-15)
    with pytest.raises(ValueError):
        drift([8, 8], [0.0, 0.1])
    assert scaling_kind([1000, 1000, 1000], [8, 16, 32]) == "strong"
    assert scaling_kind([1000, 2000, 4000], [8, 16, 32]) == "weak"
    assert scaling_kind([1000, 1500], [8, 16]) == "mixed"


def test_series_groups_orders_and_skips():
    rows = [
        _row("b32", "B", 32, 4000, 11.0, 10.0),
        _row("b8", "B", 8, 1000, 10.0, 10.0),
        _row("b16", "B", 16, 2000, 10.5, 10.0),
        _row("b16-again", "B", 16, 2000, 12.0, 10.0),  # a second run at a count the series holds: the first kept
        _row("a8", "A", 8, 1000, 10.0, 9.0),  # one GPU count only: no series
        _row("a8-again", "A", 8, 1000, 10.0, 9.0),
        replace(_row("c8", "C", 8, 1000, 10.0, 9.0), status="unsupported"),
        _row("c16", "C", 16, 2000, 10.0, 9.0),
        _row("d8", "D", 8, 1000, 10.0, 9.0, label="B"),  # another series whose label reads as B's
        _row("d64", "D", 64, 1000, 10.0, 9.0, label="B"),
    ]
    series = scaling_series(rows)
    assert list(series) == ["B", "B (2)"]
    assert (series["B (2)"].rows, series["B (2)"].kind, series["B (2)"].drift_per_doubling) == (["d8", "d64"], "strong", 0.0)
    b = series["B"]
    assert (b.rows, b.gpus, b.tokens, b.kind) == (["b8", "b16", "b32"], [8, 16, 32], [1000, 2000, 4000], "weak")
    assert b.errors == pytest.approx([0.0, 10 / 10.5 - 1, 10 / 11 - 1], rel=1e-15)
    assert b.published_efficiency == pytest.approx(10 / 11, rel=1e-15)
    assert b.predicted_efficiency == pytest.approx(1.0, rel=1e-15)
    # E_pred / E_pub = (1 + e0) / (1 + e1), exactly (module docstring)
    assert b.predicted_efficiency / b.published_efficiency == pytest.approx((1 + b.errors[0]) / (1 + b.errors[-1]), rel=1e-14)
    d = drift_summary({"B": b})
    assert (d.series, d.fast) == (1, 1) and d.mean == d.median == b.drift_per_doubling < 0
    d = drift_summary(series)
    assert (d.series, d.fast, d.median) == (2, 1, b.drift_per_doubling / 2)
    assert drift_summary({}).series == 0 and drift_summary({}).mean is None


def test_the_validated_runs_series(validated_all):
    series = validated_all.series
    assert len(series) == 29
    by_rows = {tuple(s.rows): s for s in series.values()}
    mtnlg = by_rows[("mtnlg_530b_2240gpu", "mtnlg_530b_2800gpu", "mtnlg_530b_3360gpu")]
    assert (mtnlg.kind, mtnlg.gpus) == ("strong", [2240, 2800, 3360])
    # published: 60.1 s on 2,240 GPUs, 44.4 s on 3,360, the same 1,920 x 2,048 tokens
    assert mtnlg.published_efficiency == pytest.approx((60.1 * 2240) / (44.4 * 3360), rel=1e-12)
    llama3 = by_rows[("llama3_405b_8192gpu_seq8192", "llama3_405b_16384gpu_seq8192")]
    assert llama3.kind == "strong" and llama3.tokens == [16 * 2 ** 20] * 2
    nemotron = [s for s in series.values() if s.rows[0] == "dgxc_nemotron4_15b_bf16_16gpu"][0]
    assert (nemotron.kind, len(nemotron.rows), nemotron.gpus[-1]) == ("weak", 8, 2048)
    # a torchtitan series never mixes the compiled and eager stacks, nor FP8 with BF16
    titan = [s for s in series.values() if s.group == "torchtitan"]
    assert sorted(s.rows[0] for s in titan) == [
        "torchtitan_8b_8gpu_fsdp", "torchtitan_8b_8gpu_fsdp_compile", "torchtitan_8b_8gpu_fsdp_compile_fp8"]
    # the 70B rows with and without AsyncTP read alike in the label but differ in the stack: not one series
    tp = validated_all.row("torchtitan_70b_256gpu_2d"), validated_all.row("torchtitan_70b_256gpu_2d_asynctp")
    assert tp[0].series == tp[1].series and tp[0].series_id != tp[1].series_id
    for s in series.values():
        assert s.gpus == sorted(set(s.gpus)) and len(s.gpus) >= 2
        rows = [validated_all.row(r) for r in s.rows]
        assert len({r.series_id for r in rows}) == 1 and {r.series for r in rows} == {s.label}
        assert len({r.group for r in rows}) == 1
        assert s.errors == [r.error for r in rows]
    d = validated_all.drift()
    assert (d.series, d.fast) == (29, 23)
    assert f"{100 * d.mean:+.1f}" == "-0.5"


def test_json_text_markdown_and_picture(validated_all, monkeypatch, tmp_path):
    monkeypatch.setattr(validate_cmd, "build_report", lambda sources=None, run_set="visible": validated_all)
    code, out, err = run_cli("--json", "--set", "all")
    assert (code, err) == (0, "")
    d = json.loads(out)
    assert len(d["series"]) == 29 and d["series_drift"]["series"] == 29
    first = next(iter(d["series"].values()))
    assert list(first)[-3:] == ["published_efficiency", "predicted_efficiency", "drift_per_doubling"]
    code, out, err = run_cli("--set", "all")
    assert "Scaling series: one layout at several GPU counts" in out
    assert "drift of the error per doubling of the GPU count over 29 series: mean -0.5 pt" in out
    assert re.search(r"2,240–3,360\s+3\s+strong\s+0\.902\s+0\.939\s+-18\.3% → -21\.5%\s+-5\.4 pt", out)
    code, md, err = run_cli("--markdown", "--set", "all")
    assert "### Scaling series: one layout at several GPU counts" in md
    assert "| 2,240–3,360 | 3 | strong | 0.902 | 0.939 | -18.3% → -21.5% | -5.4 pt |" in md
    path = tmp_path / "series.svg"
    code, out, err = run_cli("--series-out", str(path), "--set", "all")
    assert (code, err) == (0, "") and f"wrote {path}" in out
    svg = path.read_text()
    assert svg.count('class="series"') == 29 and svg.count('class="point"') == sum(len(s.rows) for s in validated_all.series.values())
    # every marker inside the plot area (x 80..700, y 86..506)
    for cx, cy in re.findall(r'class="point" data-run="[^"]+" cx="([\d.]+)" cy="([\d.]+)"', svg):
        assert 80 <= float(cx) <= 700 and 86 <= float(cy) <= 506
    # the MT-NLG line is drawn in its source's colour, with the run's figures as its tooltip
    assert 'data-run="mtnlg_530b_3360gpu"' in svg and "mtnlg_530b_3360gpu: 3,360 GPUs, error -21.5%" in svg


def test_series_out_without_a_series_is_one_line(validated_all, monkeypatch, tmp_path):
    none = replace(validated_all, series={})
    monkeypatch.setattr(validate_cmd, "build_report", lambda sources=None, run_set="visible": none)
    path = tmp_path / "s.svg"
    assert_one_error(*run_cli("--series-out", str(path), "--set", "all"), "series-out: no scaling series")
    assert not path.exists()
    code, out, err = run_cli("--set", "all")
    assert (code, err) == (0, "") and "Scaling series" not in out and "drift of the error" not in out


def test_series_out_refuses_before_any_work(tmp_path):
    assert_one_error(*run_cli("--series-out", str(tmp_path / "a.png")), "series-out: must be a .svg file")
    existing = tmp_path / "b.svg"
    existing.write_text("mine")
    assert_one_error(*run_cli("--series-out", str(existing)), "series-out: '")
    assert existing.read_text() == "mine"
    assert_one_error(*run_cli("--series-out", str(tmp_path / "no" / "c.svg")), "does not exist")
