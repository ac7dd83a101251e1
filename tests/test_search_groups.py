"""The search's table of top plans: plans that differ only in their virtual stages (vpp) are one
row unless ``--all-variants``, the JSON keeps every plan and names its group, and the rows whose
step-time interval overlaps #1's are marked ``≈``.

The expected rows come from the same search's ``--json``.
"""

from __future__ import annotations

import json
import re

from meshplan.accuracy.interval import StepInterval
from meshplan.cli.search_report import overlap_line, vpp_span
from test_bad_input import run_cli

SEARCH = ("search", "--model", "llama3-70b", "--gpus", "256", "--seq-len", "8192", "--global-batch", "512")
# one layout, schedule, batch shape and memory setting: the top five differ in vpp only
ONE_LAYOUT = (*SEARCH, "--tp", "2", "--cp", "2", "--pp", "4", "--schedule", "interleaved", "--recompute", "none",
              "--micro-batch", "1", "--zero", "2", "--top", "5")
ROW = re.compile(r"^\s*(\d+)( ≈)?\s+TP\d+ CP\d+ PP\d+ DP\d+")


def search_json(*args: str) -> dict:
    code, out, err = run_cli(*args, "--json")
    assert code == 0, err
    return json.loads(out)


def same_but_vpp(plan: dict) -> dict:
    """A plan's JSON without its vpp and the layer split that follows from it."""
    return {k: v for k, v in plan.items() if k not in ("vpp", "layer_split")}


def rows(out: str) -> list[tuple[int, bool]]:
    """(rank, tie marker) of each row of the top plans' table."""
    return [(int(m.group(1)), bool(m.group(2))) for m in map(ROW.match, out.splitlines()) if m]


def words(text: str) -> str:
    return " ".join(text.split())


def test_plans_that_differ_only_in_vpp_are_one_row_unless_all_variants():
    d = search_json(*ONE_LAYOUT)
    plans = [t["plan"] for t in d["top"]]
    assert len(plans) == 5 and len({p["vpp"] for p in plans}) == 5
    assert all(same_but_vpp(p) == same_but_vpp(plans[0]) for p in plans)
    assert [t["group"] for t in d["top"]] == [1] * 5
    span = vpp_span([p["vpp"] for p in plans])
    code, out, err = run_cli(*ONE_LAYOUT)
    assert code == 0, err
    assert [rank for rank, _ in rows(out)] == [1]
    assert f"interleaved v{plans[0]['vpp']} ({span}: 5)" in words(out)
    assert "the fastest of 5 plans that differ only in virtual stages per rank" in words(out)
    assert "--all-variants lists each plan" in words(out)
    code, out, err = run_cli(*ONE_LAYOUT, "--all-variants")
    assert code == 0, err
    assert [rank for rank, _ in rows(out)] == [1, 2, 3, 4, 5]
    for p in plans:
        assert f"interleaved v{p['vpp']}" in out
    assert f"({span}: 5)" not in out


def test_the_json_keeps_every_plan_and_names_its_group():
    d = search_json(*SEARCH)
    assert len(d["top"]) == 10 and search_json(*SEARCH, "--all-variants")["top"] == d["top"]
    first: dict[str, int] = {}
    for t in d["top"]:
        key = json.dumps(same_but_vpp(t["plan"]), sort_keys=True)
        assert t["group"] == first.setdefault(key, t["rank"])
        assert "interval_overlaps" in t
    code, out, err = run_cli(*SEARCH)
    assert code == 0, err
    shown = [rank for rank, _ in rows(out)]
    assert shown == sorted({t["group"] for t in d["top"]}) and len(shown) < 10
    assert f"Top 10 plans by throughput, in {len(shown)} rows" in out


def test_rows_within_the_interval_of_the_first_are_marked():
    args = ("search", "--model", "llama3-8b", "--gpus", "64", "--top", "10", "--interval", "0.2")
    d = search_json(*args)
    near = set(d["top"][0]["interval_overlaps"])
    assert near and len(near) < 9  # some of the top ten within #1's error, some not
    code, out, err = run_cli(*args)
    assert code == 0, err
    marked = rows(out)
    assert len(marked) == 10
    for rank, tie in marked:
        assert tie == (rank in near), rank
    assert "≈: within the estimate's error of #1 (their 20 % step-time intervals overlap)." in words(out)


def test_no_marker_line_without_a_tie():
    code, out, err = run_cli("search", "--model", "llama3-8b", "--gpus", "64", "--top", "1")
    assert code == 0, err
    assert "≈" not in out and [rank for rank, _ in rows(out)] == [1]


def test_vpp_spans_and_the_overlap_line_of_the_rows_shown():
    assert vpp_span([8, 3, 4, 5, 6, 7]) == "v3–8"
    assert vpp_span([2, 4, 6, 7, 8]) == "v2,4,6–8"
    ivs = [StepInterval(1.0, lo, hi, 0.8, "g", 10) for lo, hi in ((1.0, 1.2), (1.1, 1.3), (2.0, 2.2))]
    assert overlap_line(ivs, [1, 7, 9]) == ("Within each other's 80 % step-time interval (the ranking between them is within "
                                            "meshplan's error): #1 with #7")
    assert overlap_line(ivs[:2], [1, 7]).startswith("All 2 plans shown lie within each other's 80 % step-time interval")
    assert overlap_line(ivs[:2]).startswith("All 2 top plans lie within")
