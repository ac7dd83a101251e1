"""docs/accuracy.md's generated part (every run's prediction, the bias tables, the scaling series
and the interval's coverage) is what the current model gives: rebuilt from the validated runs and
compared with the page, the date aside. A change that moves a number fails here until
``python -m meshplan.cli.validate_docs`` is re-run (and the prose quoting it checked)."""

from __future__ import annotations

from pathlib import Path

from meshplan.accuracy.validate import validate_runs
from meshplan.cli.validate_docs import generated_section, main, section_of, undated

PAGE = Path(__file__).resolve().parents[1] / "docs" / "accuracy.md"


def test_the_generated_part_is_current(validated_all):
    page = PAGE.read_text()
    fresh = generated_section(validated_all, "2000-01-01")
    assert undated(section_of(page)) == undated(fresh)


def test_a_set_of_the_all_report_is_that_set_validated_alone(validated_all):
    # of_set reuses the rows of --set all; the summaries must be those of the set's own run
    visible = validated_all.of_set("visible")
    alone = validate_runs(run_set="visible")
    assert [r.id for r in visible.rows] == [r.id for r in alone.rows]
    assert visible.overall == alone.overall and visible.groups == alone.groups and visible.buckets == alone.buckets
    assert list(visible.series) == list(alone.series) and [r.id for r in visible.worst] == [r.id for r in alone.worst]


def test_undated_blanks_only_the_date():
    assert undated("x on 2026-11-29. y on 2026-11-30.") == "x on DATE. y on 2026-11-30."


def test_a_page_without_the_part_is_refused_untouched(tmp_path, capsys):
    page = tmp_path / "p.md"
    page.write_text("no markers here\n")
    assert main([str(page)]) == 2 and page.read_text() == "no markers here\n"
    assert main([str(tmp_path / "missing.md")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("error: page: ") and "has no generated part" in err[0]
