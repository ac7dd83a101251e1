"""Gantt pictures of a simulated step (meshplan.pipeline.gantt): the plain and rich terminal rows
and the standalone SVG.

Durations are whole numbers (f = 1, b = 2 per stage; per chunk f/v, b/v with v = 2), and the
widths are chosen so a column is a whole fraction of a time unit, so cell counts are exact."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import pytest

from meshplan.pipeline.gantt import (
    IDLE, caption, gantt_cells, kind_color, n_chunks, nice_step, rich_gantt, round_columns, svg_gantt, text_axis,
    text_gantt,
)
from meshplan.pipeline.schedules import Action, build_schedule
from meshplan.pipeline.simulate import simulate

SVG = "{http://www.w3.org/2000/svg}"


def sim(schedule: str, p: int, m: int, v: int = 1, f: float = 1.0, b: float = 2.0, transfer: float = 0.0):
    n = p * v
    return simulate(build_schedule(schedule, p, m, v), n, [f / v] * n, [b / v] * n, transfer=transfer, keep_timeline=True)


CASES = [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 1, 1, 1), ("1f1b", 8, 3, 1), ("interleaved", 4, 8, 2)]


# ---- text rows ------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule,p,m,v", CASES)
@pytest.mark.parametrize("width", [1, 7, 33, 100, 251])
def test_one_row_per_rank_of_exactly_width_chars(schedule, p, m, v, width):
    rows = text_gantt(sim(schedule, p, m, v), width)
    assert len(rows) == p
    assert all(len(r) == width for r in rows)
    assert all(set(r) <= set("FB0123456789 " + IDLE) for r in rows)


def test_single_stage_cells_scale_with_durations():
    res = sim("gpipe", 1, 1, f=1.0, b=3.0)  # F 0–1, B 1–4
    assert text_gantt(res, 100) == ["F0" + " " * 23 + "B0" + " " * 73]
    res = sim("gpipe", 1, 1, f=1.0, b=2.0)
    assert text_gantt(res, 99) == ["F0" + " " * 31 + "B0" + " " * 64]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("scale", [1, 3])
def test_cell_counts_match_busy_and_idle_time(schedule, scale):
    p, m = 4, 8
    res = sim(schedule, p, m)
    width = int(res.makespan) * scale  # 33·scale columns: `scale` columns per time unit
    for r, (row, cells) in enumerate(zip(res.timeline, gantt_cells(res, width))):
        kinds = [row[i][0].kind if i >= 0 else "." for i in cells]
        assert kinds.count("F") == m * 1 * scale
        assert kinds.count("B") == m * 2 * scale
        assert kinds.count(".") == res.idle[r] * scale == 9 * scale
        assert text_gantt(res, width)[r].count(IDLE) == 9 * scale


def test_narrow_blocks_show_the_kind_letter():
    res = sim("1f1b", 4, 8)
    rows = text_gantt(res, 33)  # one column per time unit: F is 1 column (too narrow for "F0"), B 2
    assert rows == [
        "FFFF······B0FB1FB2FB3FB4·B5·B6·B7",  # 4 warm-up forwards, then waits for B0 from rank 3
        "·FFF····B0FB1FB2FB3FB4FB5·B6·B7··",
        "··FF··B0FB1FB2FB3FB4FB5FB6·B7····",
        "···FB0FB1FB2FB3FB4FB5FB6FB7······",
    ]


def test_rich_rows_match_text_and_colour_by_kind_and_chunk():
    res = sim("interleaved", 4, 8, 2)
    plain, rich = text_gantt(res, 120), rich_gantt(res, 120)
    assert [t.plain for t in rich] == plain
    styles = {str(span.style) for t in rich for span in t.spans}
    for kind in "FB":
        for chunk in (0, 1):
            assert any(s.endswith(f"on {kind_color(kind, chunk, 2, spread=0.25)}") for s in styles), (kind, chunk)
    assert "dim" in styles
    assert kind_color("F", 1, 2) != kind_color("F", 0, 2) != kind_color("B", 0, 2)


def _with_w(res):
    """The same timeline with each backward split in two: B (first half) and W (second half)."""
    lines = []
    for row in res.timeline:
        new = []
        for a, s, e in row:
            if a.kind == "B":
                mid = (s + e) / 2
                new += [(a, s, mid), (Action("W", a.stage, a.microbatch), mid, e)]
            else:
                new.append((a, s, e))
        lines.append(tuple(new))
    return dataclasses.replace(res, timeline=tuple(lines))


def test_w_actions_are_drawn_generically():
    res = _with_w(sim("gpipe", 2, 2, f=1.0, b=4.0))  # B 2 + W 2 per micro-batch
    assert res.makespan == 15
    assert text_gantt(res, 30) == [  # two columns per time unit
        "F0F1" + IDLE * 10 + "B0  W0  B1  W1  ",
        IDLE * 2 + "F0F1B0  W0  B1  W1  " + IDLE * 8,
    ]
    spans = {str(s.style) for t in rich_gantt(res, 60) for s in t.spans}
    assert any(s.endswith(f"on {kind_color('W')}") for s in spans)
    assert kind_color("W") == "#e67e22"
    assert kind_color("Z").startswith("#") and len(kind_color("Z")) == 7  # any other kind letter
    svg = ET.fromstring(svg_gantt(res, "w"))
    texts = " ".join(t.text or "" for t in svg.iter(f"{SVG}text"))
    assert "weight gradient" in texts and "W0" in texts


def test_timeline_required():
    res = simulate(build_schedule("1f1b", 2, 2), 2, [1.0] * 2, [2.0] * 2)
    with pytest.raises(ValueError, match="keep_timeline"):
        text_gantt(res)


# ---- SVG ------------------------------------------------------------------------------------


def _rects(root, cls):
    return [r for r in root.iter(f"{SVG}rect") if r.get("class") == cls]


@pytest.mark.parametrize("schedule,p,m,v", CASES)
def test_svg_is_xml_with_one_rect_per_action_and_one_lane_per_rank(schedule, p, m, v):
    res = sim(schedule, p, m, v)
    root = ET.fromstring(svg_gantt(res, f"{schedule} p={p}"))
    assert root.tag == f"{SVG}svg"
    assert len(_rects(root, "action")) == 2 * m * p * v
    assert len(_rects(root, "lane")) == p
    assert n_chunks(res) == v
    # each lane's rectangles add up to the rank's busy time on the plot's scale
    lane_w = float(_rects(root, "lane")[0].get("width"))
    total = sum(float(r.get("width")) for r in _rects(root, "action"))
    assert total == pytest.approx(sum(res.busy) * lane_w / res.makespan, abs=0.001 * len(_rects(root, "action")))


def test_svg_caption_axis_legend_and_escaping():
    res = sim("1f1b", 4, 8)
    text = svg_gantt(res, 'p < 5 & "quoted" <script>', unit="µs")
    root = ET.fromstring(text)
    assert "<script>" not in text
    strings = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert 'p < 5 & "quoted" <script>' in strings  # the title, escaped in the file, intact once parsed
    cap = caption(res, "µs")
    assert cap in strings
    assert "makespan 33 µs" in cap and "bubble fraction 0.273" in cap and "bubble overhead 0.375" in cap
    assert "time (µs)" in strings
    assert [s for s in strings if s in {"0", "5", "10", "15", "20", "25", "30"}] == ["0", "5", "10", "15", "20", "25", "30"]
    assert any(s.startswith("F: forward") for s in strings) and any(s.startswith("B: backward") for s in strings)
    assert "idle (bubble)" in strings
    titles = [t.text for r in _rects(root, "action") for t in r.iter(f"{SVG}title")]
    assert "0F0 · stage 0, forward, micro-batch 0 · 0–1 µs" in titles


def test_nice_step():
    assert nice_step(33) == 5
    assert nice_step(28.5) == 5
    assert nice_step(1.0) == 0.1
    assert nice_step(100) == 10
    assert nice_step(0.0) == 1.0


def test_span_longer_than_the_makespan_pads_with_idle():
    res = sim("gpipe", 1, 1, f=1.0, b=2.0)  # makespan 3
    assert text_gantt(res, 8, span=4.0) == ["F0B0  ··"]  # columns of 0.5: F 2, B 4, then 2 idle


def test_round_columns_and_axis():
    assert round_columns(33.0, 120) == (66, 33.0)  # columns of 0.5
    assert round_columns(28.5, 120) == (114, 28.5)  # columns of 0.25
    assert round_columns(397.0, 120) == (80, 400.0)  # columns of 5, covering a little past the end
    for span in (0.003, 1.0, 7.3, 1234.5, 9.9e5):
        cols, covered = round_columns(span, 100)
        assert cols <= 100 and covered >= span
    axis = text_axis(33.0, 66, 7, "ms")
    assert axis.startswith("ms     0 ") and axis.split() == ["ms", "0", "10", "20", "30"]
    assert axis.index("10") - 7 == 20  # 10 ms = column 20 at 0.5 ms per column


def test_png_that_cannot_be_written_is_one_out_error(tmp_path):
    """The PNG Gantt saves through meshplan.pyplot.save_figure: an unwritable path is an ``out``
    error naming the file (no traceback), and the figure is closed either way."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from meshplan.errors import InputError
    from meshplan.pipeline.gantt_png import write_png_gantt

    path = tmp_path / "missing" / "g.png"
    before = len(plt.get_fignums())
    with pytest.raises(InputError) as err:
        write_png_gantt(sim("1f1b", 4, 8), "1f1b", path)
    assert err.value.field == "out" and f"cannot write '{path}'" in str(err.value)
    assert len(plt.get_fignums()) == before and not path.exists()
    write_png_gantt(sim("1f1b", 4, 8), "1f1b", tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(plt.get_fignums()) == before
