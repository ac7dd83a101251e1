"""Restructuring changes no number: every published run's prediction (``validate --set all``:
step time, its breakdown, peak memory, MFU, the plan it was estimated with) and the search's top 10
on three spaces (with digests of the whole screen's memory and step bounds) equal, bit for bit,
what ``tests/data/pinned/numbers.json`` recorded (``tests/pinned_support.py``). A change meant to
move numbers rewrites the file and says so."""

from __future__ import annotations

import json

import pytest
from pinned_support import PINNED, search_numbers, validate_numbers

PINS = json.loads(PINNED.read_text())


@pytest.fixture(scope="module")
def validated():
    return validate_numbers()


def test_every_published_run_predicts_as_pinned(validated):
    assert sorted(validated) == sorted(PINS["validate"])
    changed = [k for k in PINS["validate"] if validated[k] != PINS["validate"][k]]
    assert not changed, f"{len(changed)} rows changed, e.g. {changed[0]}: {validated[changed[0]]} != {PINS['validate'][changed[0]]}"
    assert sum(v.get("status") != "unsupported" for v in validated.values()) >= 200


def test_search_top_ten_as_pinned():
    got = search_numbers()
    assert sorted(got) == sorted(PINS["search"])
    for name, want in PINS["search"].items():
        assert len(want["top"]) == 10
        for key in want:
            assert got[name][key] == want[key], f"{name}: {key} changed"
