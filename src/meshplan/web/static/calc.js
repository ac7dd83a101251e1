// The Calculators view: one form per `meshplan calc` calculator (built from its CLI options) ->
// /api/calc/<name> -> the figures with their derivations, the notes, and for the ring all-reduce
// a step-through of the simulated ring (which chunk moves where at each step).
"use strict";
(() => {
  const form = document.getElementById("calc-form");
  const pick = document.getElementById("c-calc");
  const EXAMPLES = {
    collective: { size: "2GB", n: "8" }, overlap: { compute: "200ms", comm: "60ms", buckets: "4" },
    checkpoint: { params: "405B", mtbf: "3h", write_bw: "10", writers: "128" }, zero: { params: "70B", dp: "64", zero: "3" },
    failures: { work: "54d", checkpoint_time: "98s", mtbf: "2.4h", runs: "1000" }, batch: { target: "2048", micro: "1", dp: "128", seq_len: "8192" },
    lr: { preset: "llama3-405b" }, formats: { value: "3.14159" }, "loss-scale": { overflow: "steps=10000:10,50,4000" },
    roofline: { gemm: "8192x8192x8192" }, cost: { gpus: "16384", days: "54", price: "2" },
  };
  let state = MP.readState();
  if (!state.calc) state = { calc: "collective", ...EXAMPLES.collective };
  let seq = 0, ring = null, ringStep = 0, timer = null;

  function options() { return form.querySelector(`.calc-options[data-calc="${CSS.escape(state.calc)}"]`); }
  function showForm() {
    pick.value = state.calc;
    form.querySelectorAll(".calc-options").forEach(d => (d.hidden = d.dataset.calc !== state.calc));
    const box = options();
    if (!box) return;
    box.querySelectorAll("[data-opt]").forEach(el => (el.value = state[el.dataset.opt] ?? ""));
  }
  pick.addEventListener("change", () => { state = { calc: pick.value, ...(EXAMPLES[pick.value] || {}) }; MP.writeState(state); showForm(); load(); });
  form.querySelectorAll("[data-opt]").forEach(el => {
    const ev = el.tagName === "SELECT" ? "change" : "input";
    el.addEventListener(ev, () => {
      const v = el.value.trim();
      if (v === "") delete state[el.dataset.opt]; else state[el.dataset.opt] = v;
      MP.writeState(state);
      refresh();
    });
  });
  const refresh = MP.debounce(load, 200);

  function request() {
    const q = { ...state };
    delete q.calc;
    const allReduce = !q.op || q.op.replace("_", "-") === "all-reduce";
    if (state.calc === "collective" && allReduce && q.trace === undefined && q.simulate !== "false" && Number(q.n || 8) <= 32) q.trace = "true";
    return `/api/calc/${encodeURIComponent(state.calc)}?` + MP.query(q);
  }

  async function load() {
    const mine = ++seq;
    const res = await MP.api(request());
    if (mine !== seq) return;
    MP.clearErrors(form);
    if (!res.ok) { MP.showError(res.body, options() || form); return; }
    const d = res.body;
    document.getElementById("calc-title").textContent = `meshplan calc ${d.calculator}`;
    document.getElementById("calc-figures").innerHTML = `<tr><th>figure</th><th>value</th><th>formula</th></tr>` +
      (d.derivations || []).map(x => `<tr title="${MP.esc(x.source || "")}"><td>${MP.esc(x.title)}</td><td><b>${MP.esc(x.value)}</b></td>
        <td><details><summary class="note">${MP.esc(x.formula)}</summary>${x.symbols.map(([s, v]) => `<div class="note"><b>${MP.esc(s)}</b> ${MP.esc(v)}</div>`).join("")}
        ${x.source ? `<div class="note">source: ${MP.esc(x.source)}</div>` : ""}</details></td></tr>`).join("");
    document.getElementById("calc-notes").innerHTML = (d.notes || []).map(n => `<li>${MP.esc(n)}</li>`).join("");
    drawRing(d.simulation && d.simulation.trace ? d.simulation : null);
    await drawChart(d);
    if (mine === seq) MP.drawn();
  }

  // ---- ring all-reduce step-through: replays the simulation's trace ----------------------------
  function steps(sim) {
    const out = [];
    for (const [phase, step, src, dst, chunk, bytes] of sim.trace) {
      const key = `${phase} ${step}`;
      if (!out.length || out[out.length - 1].key !== key) out.push({ key, phase, step, moves: [] });
      out[out.length - 1].moves.push({ src, dst, chunk, bytes });
    }
    return out;
  }
  // Which inputs each rank's copy of each chunk holds after the first k steps (sets of ranks).
  function holdings(sim, list, k) {
    const n = sim.n;
    const h = Array.from({ length: n }, (_, r) => Array.from({ length: n }, () => new Set([r])));
    for (let i = 0; i < k; i++) {
      const sent = list[i].moves.map(m => new Set(h[m.src][m.chunk]));
      list[i].moves.forEach((m, j) => {
        if (list[i].phase === "reduce-scatter") sent[j].forEach(x => h[m.dst][m.chunk].add(x));
        else h[m.dst][m.chunk] = sent[j];
      });
    }
    return h;
  }
  function drawRing(sim) {
    const panel = document.getElementById("ring-panel");
    panel.hidden = !sim;
    if (!sim) { ring = null; return; }
    ring = { sim, list: steps(sim) };
    ringStep = Math.min(ringStep, ring.list.length);
    renderRing();
  }
  function renderRing() {
    const { sim, list } = ring, n = sim.n, k = ringStep;
    const h = holdings(sim, list, k);
    const cur = k > 0 ? list[k - 1] : null;
    document.getElementById("ring-label").textContent = cur
      ? `${cur.phase}, step ${cur.step + 1} of ${n - 1} (${k} of ${list.length}): ` + cur.moves.map(m => `${m.src}→${m.dst} c${m.chunk}`).join(", ")
      : `start: each of the ${n} ranks holds its own ${n} chunks; ${list.length} steps in all`;
    const R = 120, cx = 160, cy = 150, pos = r => [cx + R * Math.sin((2 * Math.PI * r) / n), cy - R * Math.cos((2 * Math.PI * r) / n)];
    let svg = `<svg width="320" height="300" viewBox="0 0 320 300" role="img" aria-label="ring of ${n} ranks">
      <defs><marker id="arr" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#e6864c"/></marker></defs>`;
    for (let r = 0; r < n; r++) {
      const [x1, y1] = pos(r), [x2, y2] = pos((r + 1) % n);
      const m = cur && cur.moves.find(mm => mm.src === r);
      svg += `<line x1="${x1}" y1="${y1}" x2="${x2}" y2="${y2}" stroke="${m ? "#e6864c" : "#d5dbe5"}" stroke-width="${m ? 3 : 1.5}" ${m ? 'marker-end="url(#arr)"' : ""}/>`;
      if (m) svg += `<text x="${(x1 + x2) / 2}" y="${(y1 + y2) / 2 - 4}" font-size="11" fill="#b35a1f" text-anchor="middle">c${m.chunk}</text>`;
    }
    for (let r = 0; r < n; r++) {
      const [x, y] = pos(r);
      svg += `<circle cx="${x}" cy="${y}" r="16" fill="#2f6fdb"/><text x="${x}" y="${y + 4}" font-size="12" fill="#fff" text-anchor="middle">${r}</text>`;
    }
    document.getElementById("ring-svg").innerHTML = svg + "</svg>";
    let t = `<tr><th>rank</th>${Array.from({ length: n }, (_, c) => `<th>c${c}</th>`).join("")}</tr>`;
    for (let r = 0; r < n; r++) {
      t += `<tr><td>${r}</td>` + h[r].map(s => {
        const full = s.size === n, a = 0.12 + 0.75 * (s.size / n);
        return `<td style="background:rgba(47,111,219,${a.toFixed(2)});color:${a > 0.55 ? "#fff" : "#1d2430"}" title="sum of ranks ${[...s].sort((x, y) => x - y).join(", ")}">${full ? "Σ" : s.size + "/" + n}</td>`;
      }).join("") + "</tr>";
    }
    document.getElementById("ring-chunks").innerHTML = t;
    document.getElementById("ring-check").textContent = `cells: how many ranks' inputs each copy of a chunk sums (Σ = all ${n}). ` +
      `The numpy run: ${sim.steps} steps (model ${sim.model_steps}), each rank sent ${MP.fmt.int(sim.sent_bytes[0])} bytes ` +
      `(model 2(n−1)/n·S = ${MP.fmt.num(sim.model_sent_bytes, 1)}), result ${sim.correct ? "equals the element-wise sum on every rank" : "WRONG"}.`;
  }
  document.getElementById("ring-prev").addEventListener("click", () => { if (ring && ringStep > 0) { ringStep--; renderRing(); } });
  document.getElementById("ring-next").addEventListener("click", () => { if (ring && ringStep < ring.list.length) { ringStep++; renderRing(); } });
  document.getElementById("ring-play").addEventListener("click", e => {
    if (timer) { clearInterval(timer); timer = null; e.target.textContent = "play"; return; }
    if (!ring) return;
    if (ringStep >= ring.list.length) ringStep = 0;
    e.target.textContent = "pause";
    timer = setInterval(() => {
      if (!ring || ringStep >= ring.list.length) { clearInterval(timer); timer = null; e.target.textContent = "play"; return; }
      ringStep++; renderRing();
    }, 700);
  });

  // ---- pictures the JSON carries: LR schedule landmarks, loss-scale changes -------------------
  async function drawChart(d) {
    const panel = document.getElementById("calc-chart-panel"), title = document.getElementById("calc-chart-title");
    const sched = d.milestones ? d : d.schedule && d.schedule.milestones ? d.schedule : null;
    let traces = null, lay = {};
    if (sched) {
      title.textContent = "LR schedule landmarks";
      traces = [{ type: "scatter", mode: "lines+markers", x: sched.milestones.map(m => m.step), y: sched.milestones.map(m => m.lr), name: "LR" }];
      lay = { xaxis: { title: { text: "step" } }, yaxis: { title: { text: "learning rate" } } };
    } else if (d.scale_changes && d.scale_changes.length) {
      title.textContent = "Loss scale over steps";
      traces = [{ type: "scatter", mode: "lines", line: { shape: "hv" }, x: d.scale_changes.map(c => c.step), y: d.scale_changes.map(c => c.scale), name: "scale" }];
      lay = { xaxis: { title: { text: "step" } }, yaxis: { title: { text: "loss scale" }, type: "log" } };
    }
    panel.hidden = !traces;
    if (traces) await MP.plot("calc-chart", traces, { margin: { l: 70, r: 10, t: 28, b: 45 }, font: { size: 11 }, ...lay });
  }

  MP.writeState(state);
  showForm();
  load();
})();
