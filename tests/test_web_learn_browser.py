"""The Learn view in a real browser (the fixtures of ``conftest.py``: headless Chromium, every
request off the machine aborted, screenshots to ``tests/artifacts/``): three exercises answered
(one right, one wrong, one ordering) with the feedback checked against :func:`meshplan.learn.grade`,
progress kept across a reload, and the feedback's links opening working views with the problem's
numbers filled in."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from web_support import CHROMIUM, loaded, shot

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")
pytest.importorskip("uvicorn", reason="uvicorn is not installed (the web extra)")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run installs it)", allow_module_level=True)

from meshplan.learn import generate, grade, specs  # noqa: E402
from meshplan.learn.model import LETTERS  # noqa: E402


def graded(pg, after: int = 0) -> int:
    """Wait until the page has shown feedback more than ``after`` times; the count."""
    pg.wait_for_function(f"Number(document.body.dataset.graded || 0) > {after}", timeout=20_000)
    return int(pg.evaluate("document.body.dataset.graded"))


def open_exercise(pg, id: str, n: int) -> int:
    """Click exercise ``id`` in the list and wait until it is drawn."""
    pg.click(f"#l-list [data-go='{id}']")
    n = loaded(pg, n)
    assert pg.text_content("#l-title") == generate(id).title
    assert parse_qs(urlparse(pg.url).query)["ex"] == [id]
    return n


def feedback_matches(pg, ex, answer) -> dict:
    want = grade(ex, answer).to_dict()
    assert pg.text_content("#l-verdict") == ("right" if want["correct"] else "wrong")
    assert pg.text_content("#l-given") == f"your answer: {want['given']}"
    assert pg.text_content("#l-error") == want["error"]
    assert pg.text_content("#l-expected") == f"answer: {want['expected']}"
    assert pg.locator("#l-derivations .deriv").count() == len(ex.solution)
    assert [pg.locator("#l-derivations .deriv .val").nth(i).text_content() for i in range(len(ex.solution))] == [d.value for d in ex.solution]
    assert pg.text_content("#l-command") == want["command"]
    assert pg.get_attribute("#l-open", "href") == want["url"]
    return want


def test_three_answers_their_feedback_and_progress_after_reload(server, page):
    page.goto(f"{server}/learn?fixed=true&ex=ring-volume")
    n = loaded(page)
    assert page.is_checked("#l-fixed") and page.is_disabled("#l-seed")
    assert page.locator("#l-list li").count() == len(specs())
    assert page.text_content("#l-progress-text") == f"0 of {len(specs())} right · 0 answered"

    # 1. numeric, right: the tolerance is stated, the answer typed with its unit
    ex = generate("ring-volume")
    assert page.text_content("#l-tolerance") == ex.answer.tolerance_text()
    assert page.text_content("#l-answer .unit") == "GB"
    page.click("#l-hint")
    assert page.locator("#l-hints li").count() == 1 and page.text_content("#l-hints li") == ex.hints[0]
    page.fill("#l-number", "1.75 GB")
    page.click("#l-check")
    g = graded(page)
    feedback_matches(page, ex, "1.75 GB")
    assert page.text_content("#l-verdict") == "right" and "right" in page.get_attribute("#l-feedback", "class")
    shot(page, "learn-right")

    # 2. multiple choice, wrong: a radio button that is not the answer
    n = open_exercise(page, "tp-shard-shape", n)
    ex = generate("tp-shard-shape")
    assert page.is_hidden("#l-feedback")
    wrong = (ex.answer.correct + 1) % len(ex.answer.options)
    assert page.locator("input[name=l-choice]").count() == len(ex.answer.options)
    page.check(f"input[name=l-choice][value='{wrong}']")
    page.click("#l-check")
    g = graded(page, g)
    want = feedback_matches(page, ex, wrong)
    assert want["correct"] is False and page.text_content("#l-error") == f"you picked {LETTERS[wrong]}) {ex.answer.options[wrong]}"
    assert page.evaluate("getComputedStyle(document.getElementById('l-verdict')).color") == "rgb(198, 40, 40)"
    shot(page, "learn-wrong")

    # 3. ordering: Llama 3's mesh axes, innermost first, put in order with the up/down buttons
    n = open_exercise(page, "l3-axis-order", n)
    ex = generate("l3-axis-order")
    shown = [page.locator("#l-order li .item").nth(i).text_content() for i in range(len(ex.answer.items))]
    assert shown == list(ex.answer.items)
    for pos, item in enumerate(ex.answer.correct):  # selection sort by clicking ▲
        at = [page.locator("#l-order li").nth(i).get_attribute("data-item") for i in range(len(shown))].index(str(item))
        for _ in range(at - pos):
            page.click(f"#l-order [data-up='{at}']")
            at -= 1
    assert [page.locator("#l-order li .item").nth(i).text_content() for i in range(len(shown))] == [ex.answer.items[i] for i in ex.answer.correct]
    page.click("#l-check")
    g = graded(page, g)
    feedback_matches(page, ex, list(ex.answer.correct))
    assert page.text_content("#l-verdict") == "right"
    assert page.text_content("#l-source-note") == f"the source: {ex.source_note}"
    shot(page, "learn-ordering")

    # progress: in localStorage, shown as a bar and marks, kept across a reload
    stored = page.evaluate("JSON.parse(localStorage.getItem('meshplan.learn.progress'))")
    assert stored == {"ring-volume": {"answered": 1, "right": 1}, "tp-shard-shape": {"answered": 1, "right": 0},
                      "l3-axis-order": {"answered": 1, "right": 1}}
    page.reload()
    loaded(page)
    total = len(specs())
    assert page.text_content("#l-progress-text") == f"2 of {total} right · 3 answered"
    width = page.evaluate("document.getElementById('l-progress-bar').style.width")
    assert float(width.rstrip("%")) == pytest.approx(100 * 2 / total, rel=1e-5)  # the style keeps 6 digits
    assert page.text_content("#l-list [data-id='ring-volume'] .mark") == "✓"
    assert page.text_content("#l-list [data-id='tp-shard-shape'] .mark") == "✗"
    assert page.text_content("#l-list [data-id='zero-0'] .mark") == ""
    assert page.text_content("#l-title") == generate("l3-axis-order").title  # the exercise is in the URL
    shot(page, "learn-progress")

    page.on("dialog", lambda d: d.accept())
    page.click("#l-reset")
    assert page.text_content("#l-progress-text") == f"0 of {total} right · 0 answered"
    assert page.evaluate("localStorage.getItem('meshplan.learn.progress')") is None


def test_faulty_line_topic_seed_and_bad_answer(server, page):
    page.goto(f"{server}/learn?topic=checkpoint&seed=7&ex=faulty-young")
    n = loaded(page)
    ids = [s.id for s in specs("checkpoint")]
    assert page.locator("#l-list li").count() == len(ids) and page.input_value("#l-topic") == "checkpoint"
    assert page.input_value("#l-seed") == "7" and page.is_checked("#l-random")
    ex = generate("faulty-young", 7)
    assert page.text_content("#l-prompt") == ex.prompt
    assert page.locator("#l-code [data-line]").count() == len(ex.answer.lines)
    page.click("#l-check")  # nothing picked: said next to the answer, nothing sent
    assert page.text_content("#err-answer") == "click a line"
    wrong = 1 if ex.answer.bug != 1 else 2
    page.click(f"#l-code [data-line='{wrong}']")
    page.click("#l-check")
    g = graded(page)
    feedback_matches(page, ex, wrong)
    assert "bug" in page.get_attribute(f"#l-code [data-line='{ex.answer.bug}']", "class")
    page.click(f"#l-code [data-line='{ex.answer.bug}']")
    page.click("#l-check")
    graded(page, g)
    feedback_matches(page, ex, ex.answer.bug)
    shot(page, "learn-faulty-line")

    # another seed, another problem; the URL follows
    page.fill("#l-seed", "8")
    n = loaded(page, n)
    assert page.text_content("#l-prompt") == generate("faulty-young", 8).prompt
    assert parse_qs(urlparse(page.url).query) == {"topic": ["checkpoint"], "seed": ["8"], "ex": ["faulty-young"]}

    # a negative seed is refused next to the seed box
    page.fill("#l-seed", "-1")
    page.wait_for_function("document.getElementById('err-seed').textContent.length > 0")
    assert page.text_content("#err-seed") == "must be a non-negative whole number (got -1)"
    page.fill("#l-seed", "8")
    n = loaded(page, n)

    # an unreadable number is refused next to the answer, with the engine's rule
    page.click("#l-list [data-go='ckpt-size']")
    loaded(page, n)
    page.fill("#l-number", "lots")
    page.click("#l-check")
    page.wait_for_function("document.getElementById('err-answer').textContent.length > 0")
    assert page.text_content("#err-answer") == grade(generate("ckpt-size", 8), "lots").error
    assert page.is_hidden("#l-feedback")


def test_ordering_by_dragging(server, page):
    page.goto(f"{server}/learn?fixed=true&ex=formats-by-range")
    loaded(page)
    ex = generate("formats-by-range")
    items = lambda: [page.locator("#l-order li .item").nth(i).text_content() for i in range(len(ex.answer.items))]  # noqa: E731
    assert items() == list(ex.answer.items)
    assert page.text_content("#l-answer .note") == "largest first, smallest last: drag the items or use ▲ ▼"
    page.locator("#l-order li").nth(3).drag_to(page.locator("#l-order li").nth(0))
    moved = [ex.answer.items[3], *ex.answer.items[:3]]
    assert items() == moved
    page.click("#l-check")
    graded(page)
    want = feedback_matches(page, ex, [3, 0, 1, 2])
    assert want["given"] == " → ".join(moved)


@pytest.mark.parametrize("id, check", [
    ("ring-volume", {"[data-calc=collective] [data-opt=size]": "1GB", "[data-calc=collective] [data-opt=n]": "8",
                     "[data-calc=collective] [data-opt=bw]": "50", "#c-calc": "collective"}),
    ("bubble-interleaved", {"#p-pp": "4", "#p-microbatches": "12", "#p-vpp": "4", "#p-schedule": "interleaved"}),
    ("cp-kv-traffic", {"#in-model": "llama3-405b", "#in-cp": "8", "#in-seq_len": "128000", "#in-gpus": "8"}),
])
def test_feedback_links_open_views_with_the_numbers(server, page, id, check):
    """The link under the worked solution opens the view preloaded with the problem's numbers, and
    the view computes (no error)."""
    page.goto(f"{server}/learn?fixed=true&ex={id}")
    loaded(page)
    ex = generate(id)
    page.fill("#l-number", "1")
    page.click("#l-check")
    graded(page)
    with page.context.expect_page() as popup:
        page.click("#l-open")
    view = popup.value
    view.wait_for_load_state()
    loaded(view)
    assert urlparse(view.url).path + "?" + urlparse(view.url).query == ex.url
    for selector, value in check.items():
        assert view.input_value(selector) == value, selector
    assert view.evaluate("document.getElementById('banner').hidden")
    shot(view, f"learn-link-{id}")


def test_a_page_without_a_seed_draws_one_into_the_url(server, page):
    page.goto(f"{server}/learn?topic=lr")
    loaded(page)
    query = parse_qs(urlparse(page.url).query)
    seed = int(query["seed"][0])
    assert 0 <= seed < 1_000_000 and query["topic"] == ["lr"] and query["ex"] == [specs("lr")[0].id]
    assert page.input_value("#l-seed") == str(seed)
    assert page.text_content("#l-prompt") == generate(specs("lr")[0].id, seed).prompt
    page.check("#l-fixed")
    page.wait_for_function("new URLSearchParams(location.search).get('fixed') === 'true'")
    loaded(page, 1)
    assert page.text_content("#l-meta").endswith("as in the source")
    assert page.text_content("#l-prompt") == generate(specs("lr")[0].id).prompt
    assert "seed" not in parse_qs(urlparse(page.url).query)
