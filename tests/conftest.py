"""Fixtures shared by the tests. Every test sees the command line's output at its width for a
file or a pipe (``COLUMNS`` unset: 132 columns at least), whatever the shell running the tests
exports; a test that wants a narrow terminal sets ``COLUMNS`` itself.

The web explorer's tests: the JSON API through FastAPI's TestClient (``client``), and ``meshplan
serve``'s app on a free loopback port (``server``) driven by headless Chromium through Playwright
(``browser``, ``page``). Each skips its test when the extra it needs is not installed; every page
request to a host other than 127.0.0.1 or localhost is aborted and recorded, and the test fails if
there was one or if a script raised."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from web_support import CHROMIUM, LOOPBACK


@pytest.fixture(autouse=True)
def _output_width(monkeypatch):
    """No ``COLUMNS`` from the environment: the CLI prints as to a file (tests/test_terminal_width.py sets it)."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="session")
def validated_all():
    """``validate_runs(run_set="all")``, computed once for the modules that read it (every
    published run predicted: the slowest setup the suite has)."""
    from meshplan.accuracy import validate_runs

    return validate_runs(run_set="all")


@pytest.fixture(scope="module")
def client():
    pytest.importorskip("fastapi", reason="fastapi is not installed (the web extra)")
    pytest.importorskip("httpx", reason="httpx is not installed (the test extra)")
    from fastapi.testclient import TestClient

    from meshplan.web import create_app

    return TestClient(create_app())


@pytest.fixture(scope="module")
def server():
    uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed (the web extra)")
    from meshplan.web import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    assert srv.started, "the server did not start"
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run installs it)")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture()
def page(browser):
    ctx = browser.new_context(viewport={"width": 1440, "height": 1100})
    outside: list[str] = []
    errors: list[str] = []

    def guard(route):
        host = urlparse(route.request.url).hostname
        if route.request.url.startswith("data:") or host in LOOPBACK:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    ctx.route("**/*", guard)
    pg = ctx.new_page()
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    ctx.close()
    assert outside == [], f"requests left the machine: {outside}"
    assert errors == [], f"script errors: {errors}"


def _hypothesis_profiles() -> None:
    """Hypothesis draws afresh on every run, except where ``HYPOTHESIS_PROFILE=ci`` (``.ci/run``
    sets it): there each property test's examples derive from the test alone, so that one commit
    always meets the same draws; a failing draw found elsewhere is replayed first from
    ``.hypothesis/``."""
    import os

    try:
        from hypothesis import settings
    except ImportError:  # the test extra is not installed: the property tests skip
        return
    settings.register_profile("ci", derandomize=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


_hypothesis_profiles()
