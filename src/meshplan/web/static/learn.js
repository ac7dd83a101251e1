// The Learn view: the workbook of `meshplan learn` -> /api/learn (the list), /api/learn/<id> (one
// exercise, without its answer), /api/learn/<id>/grade (the feedback and the worked solution).
// State (topic, seed or fixed, exercise) in the URL; progress per exercise id in localStorage only.
"use strict";
(() => {
  const KEY = "meshplan.learn.progress";
  const LETTERS = "abcdefghijklmnopqrstuvwxyz";
  const $ = id => document.getElementById(id);
  const VIEW_NAMES = { "/plan": "Plan", "/pipeline": "Pipeline", "/calc": "Calculators", "/search": "Search" };

  let state = MP.readState();
  if (state.fixed !== "true" && state.fixed !== "1" && !state.seed) state.seed = freshSeed();
  if (state.fixed === "1") state.fixed = "true";
  let list = [], ex = null, shownHints = 0, order = [], line = null, seq = 0;

  function freshSeed() { return String(Math.floor(Math.random() * 1e6)); }
  function isFixed() { return state.fixed === "true"; }
  function variantQuery() { return isFixed() ? { fixed: "true" } : { seed: state.seed }; }
  function save() { MP.writeState({ topic: state.topic, seed: isFixed() ? "" : state.seed, fixed: isFixed() ? "true" : "", ex: state.ex }); }

  // ---- progress: {id: {answered, right}} in localStorage ----------------------------------------
  function progress() {
    try { return JSON.parse(localStorage.getItem(KEY) || "{}") || {}; } catch (e) { return {}; }
  }
  function record(id, right) {
    const p = progress();
    const e = p[id] || { answered: 0, right: 0 };
    e.answered += 1;
    e.right += right ? 1 : 0;
    p[id] = e;
    localStorage.setItem(KEY, JSON.stringify(p));
  }
  function drawProgress() {
    const p = progress();
    const n = list.length;
    const right = list.filter(e => (p[e.id] || {}).right > 0).length;
    const answered = list.filter(e => (p[e.id] || {}).answered > 0).length;
    $("l-progress-bar").style.width = n ? `${(100 * right) / n}%` : "0";
    $("l-progress-text").textContent = `${right} of ${n} right · ${answered} answered`;
    document.querySelectorAll("#l-list li").forEach(li => {
      const e = p[li.dataset.id];
      li.dataset.mark = !e ? "" : e.right > 0 ? "right" : "wrong";
      li.querySelector(".mark").textContent = !e ? "" : e.right > 0 ? "✓" : "✗";
      li.title = e ? `answered ${e.answered}×, right ${e.right}×` : "not answered yet";
    });
  }

  // ---- the list --------------------------------------------------------------------------------
  async function loadList() {
    const res = await MP.api("/api/learn?" + MP.query({ topic: state.topic, ...variantQuery() }));
    MP.clearErrors();
    if (!res.ok) { MP.showError(res.body); return; }
    list = res.body.exercises;
    if (!list.some(e => e.id === state.ex)) state.ex = list.length ? list[0].id : "";
    save();
    $("l-list").innerHTML = list.map(e => `<li data-id="${MP.esc(e.id)}"><span class="mark"></span><a href="#" data-go="${MP.esc(e.id)}">${MP.esc(e.title)}</a>
      <span class="note">${MP.esc(e.kind)} · ${MP.esc(e.difficulty)}</span></li>`).join("");
    $("l-list").querySelectorAll("[data-go]").forEach(a => a.addEventListener("click", ev => { ev.preventDefault(); go(a.dataset.go); }));
    drawProgress();
    await loadExercise();
  }

  function go(id) {
    state.ex = id;
    save();
    loadExercise();
  }

  // ---- one exercise ----------------------------------------------------------------------------
  async function loadExercise() {
    if (!state.ex) return;
    const mine = ++seq;
    const res = await MP.api(`/api/learn/${encodeURIComponent(state.ex)}?` + MP.query(variantQuery()));
    if (mine !== seq) return;
    MP.clearErrors();
    if (!res.ok) { MP.showError(res.body); return; }
    ex = res.body;
    shownHints = 0; line = null;
    $("l-title").textContent = ex.title;
    $("l-meta").textContent = `${ex.topic} · ${ex.difficulty} · ${ex.kind} · ${ex.fixed ? "as in the source" : "seed " + ex.seed}`;
    $("l-prompt").textContent = ex.prompt;
    $("l-source").textContent = `source: ${ex.source}`;
    $("l-hints").innerHTML = "";
    $("l-hint").disabled = !ex.hints.length;
    $("l-hint").textContent = ex.hints.length ? `hint (${ex.hints.length})` : "no hints";
    $("l-feedback").hidden = true;
    drawAnswer();
    document.querySelectorAll("#l-list li").forEach(li => li.classList.toggle("current", li.dataset.id === ex.id));
    document.querySelector("#l-list li.current")?.scrollIntoView({ block: "nearest" });  // an exercise far down the list stays in sight
    const k = list.findIndex(e => e.id === ex.id);
    $("l-prev").disabled = k <= 0;
    $("l-next").disabled = k < 0 || k >= list.length - 1;
    MP.drawn();
  }

  function drawAnswer() {
    const a = ex.answer, box = $("l-answer");
    if (a.kind === "numeric") {
      box.innerHTML = `<div class="numeric"><input type="text" id="l-number" inputmode="decimal" placeholder="your answer">
        <span class="unit">${MP.esc(a.unit)}</span></div><div class="note" id="l-tolerance">${MP.esc(a.tolerance)}</div>`;
      $("l-number").focus();
    } else if (a.kind === "choice") {
      box.innerHTML = a.options.map((o, i) => `<label class="option"><input type="radio" name="l-choice" value="${i}">
        <b>${LETTERS[i]})</b> ${MP.esc(o)}</label>`).join("");
    } else if (a.kind === "ordering") {
      order = a.items.map((_, i) => i);
      drawOrder();
    } else {
      box.innerHTML = `<div class="note">click the line with the mistake</div><ol class="code" id="l-code">${a.lines.map((t, i) =>
        `<li><button type="button" data-line="${i + 1}"><span class="ln">${i + 1}</span><code>${MP.esc(t)}</code></button></li>`).join("")}</ol>`;
      box.querySelectorAll("[data-line]").forEach(b => b.addEventListener("click", () => {
        line = Number(b.dataset.line);
        box.querySelectorAll("[data-line]").forEach(x => x.classList.toggle("picked", x === b));
      }));
    }
  }

  // Ordering: up/down buttons, or drag an item onto another's place.
  function drawOrder() {
    const a = ex.answer, box = $("l-answer");
    box.innerHTML = `<div class="note">${MP.esc(a.first)} first, ${MP.esc(a.last)} last: drag the items or use ▲ ▼</div>
      <ol class="order" id="l-order">${order.map((i, p) => `<li draggable="true" data-pos="${p}" data-item="${i}">
        <span class="grip">⋮⋮</span><span class="item">${MP.esc(a.items[i])}</span>
        <button type="button" class="up" data-up="${p}" ${p === 0 ? "disabled" : ""} title="move up">▲</button>
        <button type="button" class="down" data-down="${p}" ${p === order.length - 1 ? "disabled" : ""} title="move down">▼</button></li>`).join("")}</ol>`;
    const move = (from, to) => {
      if (to < 0 || to >= order.length || from === to) return;
      const [x] = order.splice(from, 1);
      order.splice(to, 0, x);
      drawOrder();
    };
    box.querySelectorAll("[data-up]").forEach(b => b.addEventListener("click", () => move(Number(b.dataset.up), Number(b.dataset.up) - 1)));
    box.querySelectorAll("[data-down]").forEach(b => b.addEventListener("click", () => move(Number(b.dataset.down), Number(b.dataset.down) + 1)));
    box.querySelectorAll("li[draggable]").forEach(li => {
      li.addEventListener("dragstart", e => { e.dataTransfer.setData("text/plain", li.dataset.pos); li.classList.add("dragging"); });
      li.addEventListener("dragend", () => li.classList.remove("dragging"));
      li.addEventListener("dragover", e => { e.preventDefault(); li.classList.add("over"); });
      li.addEventListener("dragleave", () => li.classList.remove("over"));
      li.addEventListener("drop", e => { e.preventDefault(); move(Number(e.dataTransfer.getData("text/plain")), Number(li.dataset.pos)); });
    });
  }

  // The answer in the shape POST /api/learn/<id>/grade takes; null (with a message) if none given.
  function answer() {
    const a = ex.answer;
    if (a.kind === "numeric") return $("l-number").value;
    if (a.kind === "choice") {
      const r = document.querySelector("input[name=l-choice]:checked");
      return r ? Number(r.value) : null;
    }
    if (a.kind === "ordering") return order.slice();
    return line;
  }

  async function check(ev) {
    ev.preventDefault();
    if (!ex) return;
    const given = answer();
    MP.clearErrors();
    if (given === null) {
      MP.showError({ field: "answer", rule: ex.kind === "choice" ? "pick an option" : "click a line" });
      return;
    }
    const res = await MP.api(`/api/learn/${encodeURIComponent(ex.id)}/grade?` + MP.query(variantQuery()), {
      method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ answer: given }),
    });
    if (!res.ok) { MP.showError(res.body); return; }
    const fb = res.body;
    record(ex.id, fb.correct);
    drawProgress();
    drawFeedback(fb);
  }

  function drawFeedback(fb) {
    const panel = $("l-feedback");
    panel.hidden = false;
    panel.classList.toggle("right", fb.correct);
    panel.classList.toggle("wrong", !fb.correct);
    $("l-verdict").textContent = fb.correct ? "right" : "wrong";
    $("l-given").textContent = `your answer: ${fb.given}`;
    $("l-error").textContent = fb.error;
    $("l-expected").innerHTML = `answer: <b>${MP.esc(fb.expected)}</b>`;
    $("l-source-note").textContent = fb.source_note ? `the source: ${fb.source_note}` : "";
    $("l-derivations").innerHTML = MP.derivationsHTML(fb.derivations);
    $("l-explanation").textContent = fb.explanation;
    const path = fb.url.split("?")[0];
    const calc = new URLSearchParams(fb.url.split("?")[1] || "").get("calc");
    const link = $("l-open");
    link.href = fb.url;
    link.target = "_blank";
    link.rel = "noopener";
    link.textContent = `open in ${VIEW_NAMES[path] || path}${calc ? " (" + calc + ")" : ""} with these numbers ↗`;
    $("l-command").textContent = fb.command;
    if (ex.answer.kind === "faulty-line" && !fb.correct) {
      const bug = (fb.expected.match(/^line (\d+)/) || [])[1];
      document.querySelectorAll("#l-code [data-line]").forEach(b => b.classList.toggle("bug", b.dataset.line === bug));
    }
    document.body.dataset.graded = String(Number(document.body.dataset.graded || 0) + 1);
    panel.scrollIntoView({ block: "nearest" });
  }

  function hint() {
    if (!ex || shownHints >= ex.hints.length) return;
    $("l-hints").insertAdjacentHTML("beforeend", `<li>${MP.esc(ex.hints[shownHints])}</li>`);
    shownHints += 1;
    const left = ex.hints.length - shownHints;
    $("l-hint").disabled = left === 0;
    $("l-hint").textContent = left ? `hint (${left} more)` : "no more hints";
  }

  function step(d) {
    const k = list.findIndex(e => e.id === state.ex);
    if (k + d >= 0 && k + d < list.length) go(list[k + d].id);
  }

  // ---- the inputs ------------------------------------------------------------------------------
  function drawInputs() {
    $("l-topic").value = state.topic || "";
    $("l-fixed").checked = isFixed();
    $("l-random").checked = !isFixed();
    $("l-seed").value = isFixed() ? "" : state.seed;
    $("l-seed").disabled = isFixed();
    $("l-new-seed").disabled = isFixed();
  }
  $("l-topic").addEventListener("change", () => { state.topic = $("l-topic").value; state.ex = ""; loadList(); });
  document.querySelectorAll("input[name=l-variant]").forEach(r => r.addEventListener("change", () => {
    if (r.value === "fixed") state.fixed = "true";
    else { delete state.fixed; if (!state.seed) state.seed = freshSeed(); }
    drawInputs();
    save();
    loadExercise();
  }));
  const seedChanged = MP.debounce(() => { save(); loadExercise(); }, 250);
  $("l-seed").addEventListener("input", () => { state.seed = $("l-seed").value.trim(); seedChanged(); });
  $("l-new-seed").addEventListener("click", () => { state.seed = freshSeed(); drawInputs(); save(); loadExercise(); });
  $("l-reset").addEventListener("click", () => {
    if (!confirm("Forget which exercises you answered?")) return;
    localStorage.removeItem(KEY);
    drawProgress();
  });
  $("l-answer-form").addEventListener("submit", check);
  $("l-hint").addEventListener("click", hint);
  $("l-prev").addEventListener("click", () => step(-1));
  $("l-next").addEventListener("click", () => step(1));

  drawInputs();
  loadList();
})();
