"""How the workbook says how far a wrong numeric answer is: finite words for every finite answer
(zero, negative, tiny, huge) against positive and negative expected values, in the library, the
terminal and the web Learn view."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from meshplan.cli.app import app
from meshplan.learn import generate, grade
from meshplan.learn.model import Numeric, relative_error

RING = generate("ring-volume")  # 1.75 GB, ±1%
COSINE = generate("lr-cosine")  # 4.0817e-05, ±1%


def expecting(value: float, rtol: float = 0.01):
    """ring-volume with another expected value (a pure number)."""
    return replace(RING, answer=Numeric(value=value, unit="", scale=1.0, rtol=rtol))


@pytest.mark.parametrize("expected,answer,error", [
    # positive expected value
    (1.75, 0, "100% too low (tolerance ±1%)"),
    (1.75, 1e308, "about 10^308 times too high (tolerance ±1%)"),  # log10(1e308 / 1.75) = 307.76
    (1.75, 1.7976931348623157e308, "about 10^308 times too high (tolerance ±1%)"),  # the largest float
    (1.75, 1e-300, "about 10^300 times too low (tolerance ±1%)"),  # log10(1.75e300) = 300.24
    (1.75, 5e-324, "about 10^324 times too low (tolerance ±1%)"),  # the smallest float: 1.75 / 4.94e-324 = 10^323.55
    (1.75, -1e308, "the sign is wrong: the answer is positive and about 10^308 times too large in magnitude (tolerance ±1%)"),
    (1.75, -1.75, "the sign is wrong: the answer is positive (tolerance ±1%)"),
    (1.75, -3.5, "the sign is wrong: the answer is positive and 2 times too large in magnitude (tolerance ±1%)"),
    (1.75, 3.5, "100% too high (tolerance ±1%); off by a factor 2"),
    (1.75, 14, "700% too high (tolerance ±1%); off by a factor 8 (bits vs bytes?)"),
    (1.75, 0.875, "50% too low (tolerance ±1%); off by a factor 2"),
    (1.75, 0.2, "88.6% too low (tolerance ±1%)"),  # 1.55 / 1.75 = 0.8857
    (1.75, 17.5, "10 times too high (tolerance ±1%)"),  # from a factor 10 on, the factor
    (1.75, 0.175, "10 times too low (tolerance ±1%)"),
    (1.75, 1750, "1,000 times too high (tolerance ±1%); off by a factor 1000 (a unit prefix?)"),
    (1.75, 2e-5, "87,500 times too low (tolerance ±1%)"),
    (1.75, 1.75e5, "100,000 times too high (tolerance ±1%)"),
    (1.75, 1.75e6, "about 10^6 times too high (tolerance ±1%)"),  # from a million on, the power of ten
    # negative expected value: high and low as on the number line, factors in magnitude
    (-1.75, 0, "100% too high (tolerance ±1%)"),
    (-1.75, -3.5, "100% too low (tolerance ±1%); off by a factor 2"),
    (-1.75, -0.875, "50% too high (tolerance ±1%); off by a factor 2"),
    (-1.75, 1.75, "the sign is wrong: the answer is negative (tolerance ±1%)"),
    (-1.75, 1e308, "the sign is wrong: the answer is negative and about 10^308 times too large in magnitude (tolerance ±1%)"),
    (-1.75, -1e308, "about 10^308 times too large in magnitude (tolerance ±1%)"),
    (-1.75, -1e-300, "about 10^300 times too small in magnitude (tolerance ±1%)"),
    (-1.75, 1e-300, "the sign is wrong: the answer is negative and about 10^300 times too small in magnitude (tolerance ±1%)"),
    (-1.75, -17.5, "10 times too large in magnitude (tolerance ±1%)"),
    # tiny and huge expected values
    (4e-5, 1e308, "about 10^312 times too high (tolerance ±1%)"),  # log10(2.5e312) = 312.4
    (-4e-5, 1e308, "the sign is wrong: the answer is negative and about 10^312 times too large in magnitude (tolerance ±1%)"),
    (1e300, 1e-300, "about 10^600 times too low (tolerance ±1%)"),
    (-1e-300, -1e300, "about 10^600 times too large in magnitude (tolerance ±1%)"),
])
def test_numeric_error_words(expected, answer, error):
    fb = grade(expecting(expected), answer)
    assert not fb.correct and fb.valid
    assert fb.error == error


def test_a_huge_answer_to_a_small_value_is_finite_everywhere():
    fb = grade(COSINE, 1e308)
    assert fb.error == "about 10^312 times too high (tolerance ±1%)"  # log10(1e308 / 4.0817e-05) = 312.39
    assert fb.relative_error is None  # (1e308 − 4e-5) / 4e-5 is past a float
    json.dumps(fb.to_dict(), allow_nan=False)
    assert grade(COSINE, "1e308").error == fb.error and grade(COSINE, "-1e308").relative_error is None


@pytest.mark.parametrize("expected", [1.75, -1.75, 4e-5, -4e-5, 1e300, -1e300, 1e-300, -1e-300])
def test_no_answer_is_infinitely_wrong(expected):
    ex = expecting(expected)
    for answer in (0.0, -0.0, 1e308, -1e308, 1.7976931348623157e308, -1.7976931348623157e308, 1e-308, -1e-308, 5e-324, -5e-324,
                   2.5, -2.5, 1, -1):
        fb = grade(ex, answer)
        assert not fb.correct and fb.valid, (expected, answer)
        assert not any(word in fb.error for word in ("∞", "inf", "nan", "NaN")), (expected, answer, fb.error)
        rel = fb.relative_error
        assert rel is None or math.isfinite(rel)
        if rel is not None:
            assert rel == (answer - expected) / expected  # exactly the quotient, where a float holds it
        json.dumps(fb.to_dict(), allow_nan=False)


def test_relative_error():
    assert relative_error(3.5, 1.75) == 1.0
    assert relative_error(-3.5, -1.75) == 1.0  # the quotient keeps the convention: (x − e) / e
    assert relative_error(0.0, -1.75) == -1.0
    assert relative_error(1.0, 0.0) is None
    assert relative_error(1e308, 1e-5) is None and relative_error(-1e308, 1e-5) is None
    assert relative_error(1e308, -1e308) is None  # the difference itself overflows
    assert relative_error(1e-300, 1.75) == pytest.approx(-1.0, abs=1e-299)


def test_answers_within_tolerance_are_right_whatever_the_sign():
    assert grade(expecting(-1.75), -1.76).correct and not grade(expecting(-1.75), -1.78).correct
    assert grade(expecting(4e-5), 4.03e-5).correct and not grade(expecting(4e-5), 4.05e-5).correct


def test_the_terminal_says_the_same():
    r = CliRunner().invoke(app, ["learn", "--fixed", "--exercise", "lr-cosine"], input="1e308\nskip\n")
    assert r.exit_code == 0, r.output
    assert "wrong: 1e+308: about 10^312 times too high (tolerance ±1%)" in r.output and "∞" not in r.output


def test_the_web_learn_view_says_the_same(client):
    for answer in (1e308, "1e308"):
        got = client.post("/api/learn/lr-cosine/grade?fixed=true", json={"answer": answer}).json()
        assert got["correct"] is False and got["valid"] is True
        assert got["error"] == "about 10^312 times too high (tolerance ±1%)" and got["relative_error"] is None
    got = client.post("/api/learn/ring-volume/grade?fixed=true", json={"answer": -1e308}).json()
    assert got["error"] == "the sign is wrong: the answer is positive and about 10^308 times too large in magnitude (tolerance ±1%)"
    assert got["relative_error"] == pytest.approx(-1e308 / 1.75 - 1)
