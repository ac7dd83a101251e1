"""Checks shared by the web explorer's tests (the fixtures are in ``conftest.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

#: Where the browser tests write their screenshots.
ARTIFACTS = Path(__file__).parent / "artifacts"
#: The browser the tests drive (Debian's package; .ci/run installs it).
CHROMIUM = "/usr/bin/chromium"
#: The hosts a page may reach.
LOOPBACK = {"127.0.0.1", "localhost"}


def bad(response, field: str) -> str:
    """The rule of a 422 answer, after checking it names ``field`` in one line as the CLI does."""
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == field
    assert body["detail"] == f"{field}: {body['rule']}"
    assert "\n" not in body["detail"]
    return body["rule"]


def loaded(pg, after: int = 0, timeout: float = 20_000) -> int:
    """Wait until the page has drawn an API answer more than ``after`` times; the count."""
    pg.wait_for_function(f"Number(document.body.dataset.loaded || 0) > {after}", timeout=timeout)
    return int(pg.evaluate("document.body.dataset.loaded"))


def reveal(pg, selector: str) -> None:
    """Open the collapsed group (``<details>``) that holds the input ``selector``."""
    pg.evaluate("s => { const g = document.querySelector(s).closest('details'); if (g) g.open = true; }", selector)


def shot(pg, name: str) -> Path:
    """A full-page screenshot in :data:`ARTIFACTS`, checked to be a PNG with something drawn."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path


def record(name: str, seconds: float) -> float:
    """Keep a measured time in ``ARTIFACTS/timings.json`` (name: seconds), for the record beside
    the test's own generous bound; returns it."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "timings.json"
    try:
        times = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):  # none yet, or one another test process is replacing
        times = {}
    times[name] = round(seconds, 3)
    # written whole, then renamed over the old file: the test processes of `make test` share it
    part = path.with_name(f"timings.{os.getpid()}.json")
    part.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
    os.replace(part, path)
    return seconds


def phone(pg) -> None:
    """The page at a phone's size (390 × 844 CSS pixels)."""
    pg.set_viewport_size({"width": 390, "height": 844})


def fits_width(pg) -> None:
    """Nothing wider than the viewport: no sideways scrolling of the page (a wide table scrolls
    inside its own box)."""
    width, inner = pg.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width <= inner, f"the page is {width} px wide in a {inner} px viewport"
