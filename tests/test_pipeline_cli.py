"""``meshplan pipeline``: the JSON contract, the closed forms it must reproduce, the human output,
the SVG file, and bad input (one line ``error: <field>: <rule>``, exit 2, nothing on stdout).

Expected numbers are arithmetic on the flags: 1F1B and GPipe with f = 1, b = 2 per rank take
(m + p − 1)·(f + b); interleaved with v chunks of f/v, b/v takes (m·v + p − 1)·(f + b)/v.
Bubble fraction = (p − 1)/(m·v + p − 1) (idle share of the step), bubble overhead = (p − 1)/(m·v)
(idle relative to busy time)."""

from __future__ import annotations

import contextlib
import io
import json
import xml.etree.ElementTree as ET

import pytest

from meshplan.cli.app import main
from meshplan.pipeline.schedules import build_schedule, format_actions
from meshplan.pipeline.simulate import simulate


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["pipeline", *args])
    return code, out.getvalue(), err.getvalue()


def run_json(*args: str) -> dict:
    code, out, err = run_cli("--json", *args)
    assert (code, err) == (0, ""), err
    assert out.count("\n") == 1
    return json.loads(out)


def assert_one_error(code: int, out: str, err: str, needle: str) -> None:
    assert code == 2, (code, out, err)
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in err
    assert needle in err, err


# ---- JSON -----------------------------------------------------------------------------------


def test_default_is_1f1b_p4_m8():
    d = run_json("--pp", "4", "-m", "8")
    assert set(d) == {"schedule", "pp", "microbatches", "vpp", "pipeline_runtime", "pipeline_runtime_requested", "runtime_note",
                      "dependency_makespan", "makespan", "bubble_fraction", "bubble_overhead", "ranks"}
    assert (d["pipeline_runtime"], d["pipeline_runtime_requested"], d["dependency_makespan"]) == ("dependency", "dependency", 33.0)
    assert (d["schedule"], d["pp"], d["microbatches"], d["vpp"]) == ("1f1b", 4, 8, 1)
    assert d["makespan"] == 33.0 == (8 + 4 - 1) * (1 + 2)
    assert d["bubble_fraction"] == pytest.approx(3 / 11, rel=1e-12)
    assert d["bubble_overhead"] == pytest.approx(3 / 8, rel=1e-12)
    assert [r["rank"] for r in d["ranks"]] == [0, 1, 2, 3]
    assert [r["peak_inflight"] for r in d["ranks"]] == [4, 3, 2, 1]  # p − r for 1F1B
    assert all(r["busy"] == 24.0 and r["idle"] == 9.0 for r in d["ranks"])
    expected = format_actions(build_schedule("1f1b", 4, 8, 1))
    assert [",".join(r["actions"]) for r in d["ranks"]] == expected
    assert d["ranks"][0]["actions"][:5] == ["0F0", "0F1", "0F2", "0F3", "0B0"]
    tl = d["ranks"][3]["timeline"]
    assert tl[:2] == [["3F0", 3.0, 4.0], ["3B0", 4.0, 6.0]]
    assert len(tl) == 16 and tl[-1][2] == 27.0


def test_gpipe_same_makespan_more_in_flight():
    d = run_json("--schedule", "gpipe")
    assert d["schedule"] == "gpipe" and d["makespan"] == 33.0
    assert d["bubble_fraction"] == pytest.approx(3 / 11, rel=1e-12)
    assert [r["peak_inflight"] for r in d["ranks"]] == [8, 8, 8, 8]


def test_interleaved_chunks_get_1_over_v_of_the_rank_time():
    d = run_json("--vpp", "2", "-m", "8", "--pp", "4")
    assert (d["schedule"], d["vpp"]) == ("interleaved", 2)
    assert d["makespan"] == 28.5 == (8 * 2 + 4 - 1) * (1 + 2) / 2
    assert d["bubble_fraction"] == pytest.approx(3 / 19, rel=1e-12)
    assert d["bubble_overhead"] == pytest.approx(3 / 16, rel=1e-12)
    assert all(r["busy"] == 24.0 for r in d["ranks"])  # same work per rank as 1F1B
    first = d["ranks"][0]["timeline"][0]
    assert first == ["0F0", 0.0, 0.5]
    assert run_json("--schedule", "interleaved")["vpp"] == 2  # interleaved without --vpp: v = 2


def test_fwd_bwd_and_transfer_scale_the_step():
    d = run_json("--pp", "2", "-m", "4", "--fwd", "3", "--bwd", "5")
    assert d["makespan"] == (4 + 2 - 1) * (3 + 5)
    with_transfer = run_json("--pp", "4", "-m", "8", "--transfer", "0.5")
    lib = simulate(build_schedule("1f1b", 4, 8, 1), 4, [1.0] * 4, [2.0] * 4, transfer=0.5)
    assert with_transfer["makespan"] == lib.makespan > 33.0


def test_uneven_stage_times():
    d = run_json("--stage-times", "1:2, 2:4 ,1:2,1:2")
    lib = simulate(build_schedule("1f1b", 4, 8, 1), 4, [1.0, 2.0, 1.0, 1.0], [2.0, 4.0, 2.0, 2.0])
    assert d["makespan"] == lib.makespan
    assert d["makespan"] > 33.0
    assert [r["busy"] for r in d["ranks"]] == [24.0, 48.0, 24.0, 24.0]
    d2 = run_json("--vpp", "2", "--stage-times", ",".join(["0.5:1"] * 8))
    assert d2["makespan"] == 28.5  # the same as the default split per chunk


def test_wgrad_is_accepted_and_unused_without_split_backward():
    code, out, err = run_cli("--wgrad", "0.5")
    assert code == 0 and err == ""
    assert "backward 2 ms, of which W (weight gradient) 0.5 ms" in out
    assert "the W time is unused: the 1f1b schedule does not split the backward" in out
    assert run_json("--wgrad", "0.5")["makespan"] == 33.0


# ---- human output ---------------------------------------------------------------------------


def test_human_output():
    code, out, err = run_cli("--pp", "4", "-m", "8")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("1f1b pipeline schedule: p = 4 ranks, m = 8 micro-batches, v = 1")
    assert "forward 1 ms, backward 2 ms" in lines[1]
    rows = [ln for ln in lines if ln.startswith("rank ")]
    assert len(rows) == 4
    assert len({len(r.rstrip()) for r in rows}) <= 2  # rows of equal width (some end in spaces)
    assert rows[3].startswith("rank 3 ···")  # the last rank waits for the first forward
    assert "makespan 33 ms" in out
    assert "bubble fraction 0.273 (idle share of the step" in out
    assert "bubble overhead 0.375 (idle relative to busy" in out
    assert "(m + p − 1)·(f + b) = (8 + 4 − 1)·(1 + 2) = 33 ms" in out
    assert "the simulation agrees with the closed form" in out
    assert "27.3%" in out  # idle % of the step, every rank
    # default width: round columns (0.5 ms here), so F takes 2 columns and B 4, exactly
    assert "one column = 0.5 ms" in out
    assert rows[3] == "rank 3 " + "······F0B0  " + "F1B1  F2B2  F3B3  F4B4  F5B5  F6B6  F7B7  " + "·" * 12


def test_human_output_units_actions_and_uneven():
    code, out, _ = run_cli("--unit", "s", "--actions", "--pp", "2", "-m", "2", "--width", "30")
    assert code == 0
    assert "makespan 9 s" in out and "forward 1 s, backward 2 s; transfer 0 s" in out
    assert "rank 0: 0F0,0F1,0B0,0B1" in out and "rank 1: 1F0,1B0,1F1,1B1" in out
    gantt = [ln for ln in out.splitlines() if ln.startswith("rank ") and ":" not in ln]
    assert [len(g) for g in gantt] == [len("rank 1 ") + 30] * 2
    code, out, _ = run_cli("--stage-times", "1:2,2:4,1:2,1:2")
    assert code == 0 and "closed form: not shown" in out and "agrees" not in out
    code, out, _ = run_cli("--vpp", "2")
    assert "(m·v + p − 1)·(f + b)/v = (8·2 + 4 − 1)·(1 + 2)/2 = 28.5 ms" in out
    assert "bubble fraction 0.158" in out


# ---- SVG file -------------------------------------------------------------------------------


def test_out_writes_svg(tmp_path):
    path = tmp_path / "x.svg"
    code, out, err = run_cli("--out", str(path))
    assert code == 0 and err == ""
    assert f"wrote {path}" in out
    root = ET.fromstring(path.read_text(encoding="utf-8"))
    acts = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "action"]
    assert len(acts) == 2 * 8 * 4
    code, out, err = run_cli("--json", "--vpp", "2", "--out", str(tmp_path / "y.SVG"))
    assert code == 0 and json.loads(out)["makespan"] == 28.5
    assert (tmp_path / "y.SVG").exists()


def test_out_writes_png(tmp_path):
    """`--out x.png` draws the same Gantt with matplotlib (the plot extra, installed for tests)."""
    pytest.importorskip("matplotlib")
    code, out, err = run_cli("--schedule", "interleaved", "--vpp", "2", "--out", str(tmp_path / "g.png"))
    assert code == 0 and err == ""
    data = (tmp_path / "g.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_out_refuses_other_extensions_and_directories(tmp_path):
    assert_one_error(*run_cli("--out", str(tmp_path / "x.jpg")), "error: out: must be a .svg or .png file")
    assert not (tmp_path / "x.jpg").exists()
    folder = tmp_path / "d.svg"
    folder.mkdir()
    assert_one_error(*run_cli("--out", str(folder)), "error: out:")
    assert_one_error(*run_cli("--out", str(tmp_path / "nope" / "x.svg")), "does not exist")
    assert_one_error(*run_cli("--pp", "0", "--out", str(tmp_path / "z.svg")), "error: pp:")
    assert not (tmp_path / "z.svg").exists()  # nothing written on bad input


def test_out_never_overwrites_a_file(tmp_path):
    mine = tmp_path / "mine.svg"
    mine.write_text("<svg>the user's drawing</svg>")
    assert_one_error(*run_cli("--out", str(mine)), f"error: out: '{mine}' already exists; meshplan does not overwrite files")
    assert mine.read_text() == "<svg>the user's drawing</svg>"


# ---- bad input ------------------------------------------------------------------------------


BAD = [
    (["--pp", "0"], "error: pp: must be a positive integer"),
    (["--pp", "-3"], "error: pp:"),
    (["--pp", "5000"], "error: pp: must be at most"),
    (["-m", "0"], "error: microbatches:"),
    (["--vpp", "0"], "error: vpp:"),
    (["--vpp", "2", "-m", "9"], "equal rounds"),
    (["--schedule", "1f1b", "--vpp", "2"], "error: vpp:"),
    (["--schedule", "zigzag"], "error: schedule: unknown schedule 'zigzag'"),
    (["--fwd", "-1"], "error: fwd: must be a positive"),
    (["--bwd", "0"], "error: bwd:"),
    (["--fwd", "nan"], "error: fwd:"),
    (["--transfer", "-0.1"], "error: transfer: must be a non-negative"),
    (["--wgrad", "-1"], "error: wgrad:"),
    (["--wgrad", "3"], "error: wgrad: must not exceed the backward time 2"),
    (["--stage-times", "1:2:3,1:2:1,1:2:1,1:2:1"], "error: stage_times: entry 0: W time (3) must not exceed"),
    (["--stage-times", "1:2:1,1:2,1:2,1:2"], "error: stage_times: give a W time"),
    (["--stage-times", "1:2,1:2,1:2"], "error: stage_times: needs one forward:backward pair per virtual stage, p·v = 4, got 3"),
    (["--stage-times", "1:2,1:2,1:2,3"], "error: stage_times: entry 3"),
    (["--stage-times", "1:2,a:b,1:2,1:2"], "error: stage_times: entry 1"),
    (["--stage-times", "1:2,1:-2,1:2,1:2"], "error: stage_times: entry 1: backward time"),
    (["--stage-times", "1:2,1:2,1:2,1:2", "--fwd", "1"], "error: stage_times: give either"),
    (["--stage-times", "1:2,1:2,1:2,1:2", "--wgrad", "1"], "error: stage_times: give either"),
    (["--unit", ""], "error: unit:"),
    (["--width", "0"], "error: width:"),
    (["--pp", "abc"], "error:"),
]


@pytest.mark.parametrize("args,needle", BAD)
def test_bad_input_one_line_exit_2(args, needle):
    assert_one_error(*run_cli(*args), needle)


# ---- split backward (I + W), through a schedule patched in ------------------------------------


def test_split_backward_schedule_is_drawn_and_timed(tmp_path):
    """ZB-H1 (I and W actions): the JSON timeline is the library's simulation, every rank is busy
    m·(F + B), and the makespan is the closed form m·(f + b) + (p − 1)·(f + i − w) = 24 + 3·2 = 30."""
    d = run_json("--schedule", "zbh1", "--wgrad", "0.5")
    lib = simulate(build_schedule("zbh1", 4, 8, 1), 4, [1.0] * 4, [2.0] * 4, keep_timeline=True, wgt=[0.5] * 4)
    assert d["makespan"] == lib.makespan == 30.0
    assert d["ranks"][3]["timeline"][:3] == [["3F0", 3.0, 4.0], ["3I0", 4.0, 5.5], ["3F1", 5.5, 6.5]]
    assert all(r["busy"] == 24.0 for r in d["ranks"])
    code, out, err = run_cli("--schedule", "zbh1", "--out", str(tmp_path / "s.svg"))
    assert code == 0 and err == ""
    assert "of which W (weight gradient) half of it (default)" in out
    assert "the simulation agrees with the closed form" in out
    gantt = [ln for ln in out.splitlines() if ln.startswith("rank ")]
    assert any("I" in g for g in gantt) and any("W" in g for g in gantt)
    root = ET.fromstring((tmp_path / "s.svg").read_text(encoding="utf-8"))
    assert sum(r.get("class") == "action" for r in root.iter("{http://www.w3.org/2000/svg}rect")) == 3 * 8 * 4


# ---- schedules from a file in torch's notation -----------------------------------------------------


def test_actions_file_simulates_what_it_reads(tmp_path):
    """A schedule written in torch's notation (one rank per line, comm actions and comments
    allowed) simulates to the same makespan as the built-in one it came from."""
    from meshplan.pipeline.schedules import format_actions

    rows = format_actions(build_schedule("zbv", 4, 8, 2))
    rows[0] = "4SEND_F0," + rows[0] + ",0REDUCE_GRAD"  # torch's runtime actions are skipped
    f = tmp_path / "zbv.txt"
    f.write_text("# ZBV, p = 4, m = 8\n" + "\n".join(rows) + "\n", encoding="utf-8")
    got = run_json("--actions-file", str(f))
    built = run_json("--schedule", "zbv", "-m", "8")
    assert (got["pp"], got["microbatches"], got["vpp"]) == (4, 8, 2)
    assert got["makespan"] == built["makespan"] == 25.5
    assert [r["actions"] for r in got["ranks"]] == [r["actions"] for r in built["ranks"]]


def test_actions_file_bad_input(tmp_path):
    assert_one_error(*run_cli("--actions-file", str(tmp_path / "missing.txt")), "error: actions_file: no such file")
    (tmp_path / "empty.txt").write_text("# nothing\n\n", encoding="utf-8")
    assert_one_error(*run_cli("--actions-file", str(tmp_path / "empty.txt")), "has no actions")
    (tmp_path / "junk.txt").write_text("0F0,0X1\n", encoding="utf-8")
    assert_one_error(*run_cli("--actions-file", str(tmp_path / "junk.txt")), "error: actions.rank0:")
    (tmp_path / "stuck.txt").write_text("0F0,0B1\n1F0,1B0\n", encoding="utf-8")  # 0B1 waits forever
    assert_one_error(*run_cli("--actions-file", str(tmp_path / "stuck.txt")), "deadlocked")
