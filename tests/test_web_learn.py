"""The Learn view's JSON API (FastAPI's TestClient): the list, one exercise without its answer, the
grade (equal to :func:`meshplan.learn.grade`), bad input as 422 naming the field and the rule, and
every exercise's link opening a view whose API accepts the problem's numbers."""

from __future__ import annotations

import json
import shlex
from urllib.parse import parse_qsl, urlparse

import pytest
from web_support import bad

pytest.importorskip("fastapi", reason="fastapi is not installed (the web extra)")
from typer.testing import CliRunner  # noqa: E402

from meshplan.cli.app import app as cli  # noqa: E402
from meshplan.cli.options import PLAN_OPTIONS  # noqa: E402
from meshplan.learn import TOPICS, generate, grade, specs  # noqa: E402
from meshplan.learn.model import LETTERS  # noqa: E402

#: What the page may see of each kind's answer before grading.
SHOWN = {"numeric": {"kind", "unit", "rtol", "tolerance"}, "choice": {"kind", "options"},
         "ordering": {"kind", "items", "first", "last"}, "faulty-line": {"kind", "lines", "function", "args"}}
HIDDEN = {"solution", "solution_text", "explanation", "source_note", "command", "url", "params"}
IDS = [s.id for s in specs()]


def right_answer(ex):
    """The expected answer in the shape the page sends."""
    a = ex.answer
    return {"numeric": lambda: f"{a.display!r}", "choice": lambda: a.correct, "ordering": lambda: list(a.correct),
            "faulty-line": lambda: a.bug}[ex.kind]()


def wrong_answer(ex):
    a = ex.answer
    if ex.kind == "numeric":
        return 1.5 * a.display + 1  # outside every tolerance, and not the whole number
    if ex.kind == "choice":
        return (a.correct + 1) % len(a.options)
    if ex.kind == "ordering":
        return list(reversed(a.correct))
    return 1 if a.bug != 1 else 2


def expected_feedback(ex, answer) -> dict:
    shown = ex.to_dict()
    return {**grade(ex, answer).to_dict(), "derivations": shown["solution"], "explanation": shown["explanation"]}


# ---- the list -----------------------------------------------------------------------------------


def test_list_every_exercise_and_topic(client):
    body = client.get("/api/learn").json()
    assert [t["name"] for t in body["topics"]] == list(TOPICS)
    assert {t["name"]: t["description"] for t in body["topics"]} == TOPICS
    assert {t["name"]: t["count"] for t in body["topics"]} == {t: len(specs(t)) for t in TOPICS}
    assert sum(t["count"] for t in body["topics"]) == len(IDS) >= 40
    assert [e["id"] for e in body["exercises"]] == IDS
    for e, s in zip(body["exercises"], specs()):
        assert e == {"id": s.id, "topic": s.topic, "title": s.title, "difficulty": s.difficulty, "kind": generate(s.id, 11).kind,
                     "source": s.source}
    assert {e["kind"] for e in body["exercises"]} == set(SHOWN)
    assert (body["topic"], body["seed"], body["fixed"]) == (None, None, False)


def test_list_one_topic_and_the_variant(client):
    body = client.get("/api/learn", params={"topic": "pipeline", "seed": 7}).json()
    assert [e["id"] for e in body["exercises"]] == [s.id for s in specs("pipeline")]
    assert all(e["topic"] == "pipeline" for e in body["exercises"]) and len(body["exercises"]) == 9
    assert (body["topic"], body["seed"], body["fixed"]) == ("pipeline", 7, False)
    assert client.get("/api/learn", params={"fixed": "true"}).json()["fixed"] is True


def test_list_bad_input(client):
    assert bad(client.get("/api/learn", params={"topic": "nope"}), "topic").startswith("unknown topic 'nope' (one of: collectives,")
    assert bad(client.get("/api/learn", params={"seed": -1}), "seed") == "must be a non-negative whole number (got -1)"
    assert bad(client.get("/api/learn", params={"seed": "x"}), "seed").startswith("Input should be a valid integer")
    assert bad(client.get("/api/learn", params={"seed": 3, "fixed": "true"}), "seed") == "seed and fixed exclude each other (fixed is the source's variant)"
    assert bad(client.get("/api/learn", params={"fixed": "maybe"}), "fixed").startswith("Input should be a valid boolean")


# ---- one exercise, before grading ---------------------------------------------------------------


@pytest.mark.parametrize("seed", [None, 0, 42])
def test_exercise_is_shown_without_its_answer(client, seed):
    for id in IDS:
        ex = generate(id, seed)
        params = {"fixed": "true"} if seed is None else {"seed": seed}
        got = client.get(f"/api/learn/{id}", params=params).json()
        full = ex.to_dict()
        assert set(got) == set(full) - HIDDEN
        assert {k: v for k, v in got.items() if k != "answer"} == {k: v for k, v in full.items() if k not in HIDDEN | {"answer"}}
        assert got["answer"] == {k: full["answer"][k] for k in SHOWN[ex.kind]}
        assert got["seed"] == seed and got["fixed"] is (seed is None)


def test_exercise_json_is_the_cli_json_less_the_answer(client):
    run = CliRunner().invoke(cli, ["learn", "--list", "--json", "--topic", "zero", "--seed", "5"])
    assert run.exit_code == 0, run.output
    for item in json.loads(run.output):
        got = client.get(f"/api/learn/{item['id']}", params={"seed": 5}).json()
        answer = item.pop("answer")
        assert got == {**{k: v for k, v in item.items() if k not in HIDDEN}, "answer": {k: answer[k] for k in SHOWN[answer["kind"]]}}


def test_exercise_bad_input(client):
    assert bad(client.get("/api/learn/ring-volume"), "seed") == "give seed=<whole number ≥ 0> or fixed=true"
    assert bad(client.get("/api/learn/nope", params={"seed": 1}), "exercise") == "unknown exercise 'nope' (see `meshplan learn --list`)"
    assert bad(client.get("/api/learn/ring-volume", params={"seed": -3}), "seed") == "must be a non-negative whole number (got -3)"
    assert bad(client.get("/api/learn/ring-volume", params={"seed": 1, "fixed": "1"}), "seed").startswith("seed and fixed exclude")
    # the exercise is checked before the variant and the answer; a misspelt parameter is refused
    assert bad(client.get("/api/learn/nope"), "exercise").startswith("unknown exercise 'nope'")
    assert bad(client.post("/api/learn/nope/grade", json={}), "exercise").startswith("unknown exercise 'nope'")
    assert bad(client.get("/api/learn/ring-volume", params={"sed": 1}), "sed") == "unknown parameter (this endpoint takes: seed, fixed)"
    assert bad(client.get("/api/learn", params={"topics": "tp"}), "topics") == "unknown parameter (this endpoint takes: topic, seed, fixed)"


# ---- grading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [None, 3])
def test_grade_equals_the_engine(client, seed):
    params = {"fixed": "true"} if seed is None else {"seed": seed}
    for id in IDS:
        ex = generate(id, seed)
        for answer, right in ((right_answer(ex), True), (wrong_answer(ex), False)):
            res = client.post(f"/api/learn/{id}/grade", params=params, json={"answer": answer})
            assert res.status_code == 200, (id, answer, res.text)
            got = res.json()
            assert got == expected_feedback(ex, answer), id
            assert got["correct"] is right and got["valid"] is True, (id, answer)
            assert (got["error"] == "") is right


def test_grade_text_answers_as_typed(client):
    ex = generate("ring-volume")
    got = client.post("/api/learn/ring-volume/grade?fixed=true", json={"answer": "3.5 GB"}).json()
    assert got == expected_feedback(ex, "3.5 GB")
    assert got["correct"] is False and got["error"] == "100% too high (tolerance ±1%); off by a factor 2"
    assert got["relative_error"] == pytest.approx(1.0) and got["expected"] == "1.75 GB"
    assert client.post("/api/learn/ring-volume/grade?fixed=true", json={"answer": 1.76}).json()["correct"] is True
    ch = generate("tp-shard-shape")
    letter = LETTERS[ch.answer.correct]
    assert client.post("/api/learn/tp-shard-shape/grade?fixed=1", json={"answer": letter}).json() == expected_feedback(ch, letter)
    order = generate("l3-axis-order")
    text = " ".join(order.answer.items[i] for i in order.answer.correct)
    got = client.post("/api/learn/l3-axis-order/grade?fixed=1", json={"answer": text}).json()
    assert got["correct"] is True and got["source_note"] == order.source_note and got["given"] == "TP → CP → PP → DP"
    c = list(order.answer.correct)
    swapped = [c[0], c[2], c[1], c[3]]  # the middle two exchanged
    got = client.post("/api/learn/l3-axis-order/grade?fixed=1", json={"answer": swapped}).json()
    assert got["correct"] is False and got["error"] == "positions 2, 3 of 4 are out of place"


def test_grade_of_a_seed_is_that_seeds_problem(client):
    a, b = generate("ring-time", 1), generate("ring-time", 2)
    assert a.answer.display != b.answer.display
    res = client.post("/api/learn/ring-time/grade", params={"seed": 1}, json={"answer": repr(a.answer.display)}).json()
    assert res["correct"] is True
    res = client.post("/api/learn/ring-time/grade", params={"seed": 2}, json={"answer": repr(a.answer.display)}).json()
    assert res["correct"] is False


def test_grade_bad_input(client):
    post = lambda id, body, q="fixed=true": client.post(f"/api/learn/{id}/grade?{q}", json=body)  # noqa: E731
    assert bad(post("ring-volume", {"answer": "lots"}), "answer") == grade(generate("ring-volume"), "lots").error
    assert bad(post("ring-volume", {"answer": "1.75 MB"}), "answer") == "'1.75 MB': give the number in GB, without another unit"
    assert bad(post("ring-volume", {"answer": "  "}), "answer") == "is empty"
    assert bad(post("ring-volume", {}), "answer") == "is required"
    assert bad(post("ring-volume", {"answer": True}), "answer") == "must be text, a number or a list of item indices (got True)"
    assert bad(post("ring-volume", {"answer": None}), "answer").startswith("must be text, a number or a list")
    assert bad(post("ring-volume", {"answer": {"x": 1}}), "answer").startswith("must be text, a number or a list")
    assert bad(post("ring-volume", {"answer": "1", "extra": 2}), "extra") == "unknown field"
    inf = client.post("/api/learn/ring-volume/grade?fixed=true", content=b'{"answer": Infinity}', headers={"content-type": "application/json"})
    assert bad(inf, "answer") == "must be a finite number (got inf)"
    huge = client.post("/api/learn/ring-volume/grade?fixed=true", content=b'{"answer": 1' + b"0" * 400 + b"}",
                       headers={"content-type": "application/json"})
    assert bad(huge, "answer") == "'10000000000000000000…(401 characters)' is not a finite number; give it in GB"
    assert bad(post("ring-volume", {"answer": "1e999"}), "answer") == "'1e999' is not a finite number; give it in GB"
    assert bad(post("tp-shard-shape", {"answer": 9}), "answer") == "option 10 does not exist"
    assert bad(post("tp-shard-shape", {"answer": "z"}), "answer") == grade(generate("tp-shard-shape"), "z").error
    assert bad(post("l3-axis-order", {"answer": [0, 0, 1, 2]}), "answer") == "give each of the 4 items exactly once"
    assert bad(post("l3-axis-order", {"answer": [0, True]}), "answer").startswith("must be text, a number or a list")
    assert bad(post("faulty-young", {"answer": 99}), "answer") == f"line 99 does not exist (1 to {len(generate('faulty-young').answer.lines)})"
    assert bad(post("ring-volume", {"answer": "1"}, q=""), "seed") == "give seed=<whole number ≥ 0> or fixed=true"
    assert bad(post("nope", {"answer": "1"}), "exercise").startswith("unknown exercise 'nope'")


# ---- the links into the explorer ----------------------------------------------------------------


def _view_request(client, link: str):
    """The API request the linked view makes, after checking every parameter is one the view takes."""
    u = urlparse(link)
    q = parse_qsl(u.query, keep_blank_values=True)
    if u.path == "/calc":
        calc = dict(q)["calc"]
        options = {o["key"] for c in client.get("/api/calc").json() if c["name"] == calc for o in c["options"]}
        rest = [(k, v) for k, v in q if k != "calc"]
        assert {k for k, _ in rest} <= options, link
        return client.get(f"/api/calc/{calc}", params=rest)
    if u.path == "/plan":
        assert {k for k, _ in q} <= set(PLAN_OPTIONS), link
        return client.get("/api/view/plan", params=q)
    assert u.path == "/pipeline", link
    assert {k for k, _ in q} <= {"schedule", "pp", "microbatches", "vpp", "fwd", "bwd", "wgrad", "transfer", "stage_times", "pipeline_runtime"}, link
    return client.get("/api/view/pipeline", params=q)


def test_every_link_opens_a_working_view(client):
    seen = set()
    for id in IDS:
        for seed in (None, 0, 1, 2, 3, 4):
            link = generate(id, seed).url
            if link in seen:
                continue
            seen.add(link)
            res = _view_request(client, link)
            assert res.status_code == 200, (id, seed, link, res.text)
    assert len(seen) > 2 * len(IDS)


def test_plan_commands_beside_the_links_run():
    """The ``meshplan estimate`` lines of the feedback name the GPUs their layout needs, as the links do."""
    lines = {generate(id, seed).command for id in IDS for seed in (None, 0, 1)}
    plans = sorted(c for c in lines if c.startswith("meshplan estimate"))
    assert len(plans) >= 10
    for line in plans:
        run = CliRunner().invoke(cli, shlex.split(line)[1:] + ["--json"])
        assert run.exit_code == 0, (line, run.output[-300:])


def test_links_name_the_views_parameters():
    assert generate("ring-volume").url == "/calc?calc=collective&op=all-reduce&size=1GB&n=8&bw=50&latency=0us&algorithm=ring&base_latency=0us"
    assert generate("hierarchical-allreduce").url.endswith("&gpus_per_node=8&inter_bw=12.5&inter_latency=0us")
    assert generate("cp-kv-traffic").url == "/plan?model=llama3-405b&gpus=8&cp=8&seq_len=128000"
    assert generate("formats-by-range").url == "/calc?calc=formats&names=fp16%2Cbf16%2Cfp8-e4m3%2Cfp8-e5m2"
    assert generate("bubble-1f1b").url == "/pipeline?pp=4&microbatches=12&vpp=1&schedule=1f1b"


# ---- the page -----------------------------------------------------------------------------------


def test_learn_page_and_nav(client):
    page = client.get("/learn")
    assert page.status_code == 200
    html = page.text
    assert '<script src="/static/learn.js"></script>' in html and 'id="nav-learn" class="active"' in html
    for topic in TOPICS:
        assert f'<option value="{topic}"' in html
    for view in ("/plan", "/search", "/pipeline", "/calc"):
        assert 'href="/learn" id="nav-learn"' in client.get(view).text
    assert client.get("/static/learn.js").status_code == 200
