// The Search view: the form -> POST /api/search, progress from GET /api/search/{id}; the top plans
// as soon as they are known (click one to open it in Plan), then the baseline's place and the
// memory vs objective front; the rejections in words.
"use strict";
(() => {
  const form = document.getElementById("search-form");
  let state = MP.readState();
  let current = 0;  // the search whose answers are drawn (a newer one takes over)
  const NUMERIC = new Set(["gpus", "seq_len", "tp", "pp", "cp", "ep", "max_tp", "max_pp", "max_cp", "max_ep", "max_vpp", "max_micro_batch", "top", "price"]);
  const SCORE = { throughput: "seconds per token (lower is better)", "time-to-train": "days for the token budget", cost: "dollars for the token budget" };
  const REASONS = JSON.parse(document.getElementById("reasons").textContent);
  const STOPPED_IN = {
    top: "the plans shown are the best of those simulated before it stopped; the space may hold faster ones",
    baseline: "the top plans are complete; how many plans beat the baseline is a bound",
    pareto: "the top plans are complete; the memory front reaches only as far as drawn",
  };

  form.querySelectorAll("[data-field]").forEach(el => {
    if (state[el.dataset.field] !== undefined) el.value = state[el.dataset.field];
    el.addEventListener("change", () => {
      const v = el.value.trim();
      if (v === "") delete state[el.dataset.field]; else state[el.dataset.field] = v;
      delete state.run;
      MP.writeState(state);
    });
  });
  MP.openGroupsOf(form, state);
  document.getElementById("run-search").addEventListener("click", () => { state.run = "1"; MP.writeState(state); run(); });

  function body() {
    const out = {};
    for (const [k, v] of Object.entries(state)) {
      if (k === "run") continue;
      if (NUMERIC.has(k) && /^[0-9.eE+-]+$/.test(v)) out[k] = Number(v);
      else out[k] = v;
    }
    return out;
  }

  async function run() {
    const mine = ++current;
    MP.clearErrors(form);
    const btn = document.getElementById("run-search");
    btn.disabled = true;
    document.getElementById("progress-panel").hidden = false;
    progress({ phase: "checking", done: 0, total: 0, elapsed_s: 0, simulated: 0 });
    const sum = document.getElementById("search-summary"), before = sum.innerHTML;
    sum.textContent = "Searching: the best plans appear here as soon as they are known.";
    try {
      const res = await MP.api("/api/search", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body()) });
      if (mine !== current) return;
      if (!res.ok) {
        MP.showError(res.body, form);
        document.getElementById("progress-panel").hidden = true;
        sum.innerHTML = before;
        return;
      }
      let job = res.body, shown = false;
      while (job.status === "running") {
        progress(job);
        if (job.partial && !shown) { show(job.result, true); shown = true; btn.disabled = false; }
        await new Promise(r => setTimeout(r, 150));
        const next = await MP.api(`/api/search/${job.id}`);
        if (mine !== current) return;
        if (!next.ok) { MP.showError(next.body, form); sum.innerHTML = before; return; }
        job = next.body;
      }
      progress(job);
      if (job.status === "error") { MP.showError(job.error, form); sum.innerHTML = before; return; }
      show(job.result, false);
    } finally { if (mine === current) btn.disabled = false; }
  }

  function progress(job) {
    const frac = job.total ? job.done / job.total : 0;
    document.getElementById("progress-bar").style.width = `${Math.round(100 * (job.phase === "screen" ? frac : job.phase === "checking" ? 0 : 1))}%`;
    const what = job.phase === "screen" ? `screening plans: ${MP.fmt.int(job.done)} of ${MP.fmt.int(job.total)}`
      : job.phase === "simulate" ? `simulating contenders exactly: ${MP.fmt.int(job.simulated)}`
      : job.phase === "extras" ? `top plans found; placing the baseline and walking the memory front: ${MP.fmt.int(job.simulated)} plans simulated`
      : job.phase === "finished" ? `finished: ${MP.fmt.int(job.total)} plans screened, ${MP.fmt.int(job.simulated)} simulated` : "checking the inputs";
    document.getElementById("progress-text").textContent = `${what} · ${MP.fmt.num(job.elapsed_s, 1)} s`;
  }

  function layout(p) {
    return `TP${p.tp} CP${p.cp} PP${p.pp} DP${p.dp}` + (p.ep > 1 ? ` EP${p.ep}` : "");
  }
  function pipeline(p) {
    return p.pp > 1 ? p.schedule + (p.vpp > 1 ? " v" + p.vpp : "") : "-";
  }
  function planURL(query) {
    return "/plan?" + MP.query(query);
  }

  // The table's columns: [heading, cell of a top entry]; EP, HSDP, days and $ only where they say something.
  function columns(r) {
    const plans = r.top.map(t => t.plan);
    const cols = [
      ["#", t => t.rank], ["layout", t => `TP${t.plan.tp} CP${t.plan.cp} PP${t.plan.pp} DP${t.plan.dp}`],
    ];
    if (plans.some(p => p.ep > 1)) cols.push(["EP", t => t.plan.ep]);
    if (plans.some(p => p.dp_shard !== p.dp)) cols.push(["HSDP shard", t => (t.plan.dp_shard !== t.plan.dp ? t.plan.dp_shard : "-")]);
    cols.push(["pipeline", t => pipeline(t.plan)], ["b × m", t => `${t.plan.micro_batch} × ${t.plan.grad_accum}`],
      ["recompute, SP, ZeRO", t => `${t.plan.recompute}${t.plan.sequence_parallel && t.plan.tp > 1 ? ", SP" : ""}, ZeRO-${t.plan.zero}`],
      ["peak GiB", t => MP.fmt.gib(t.memory.peak_bytes)], ["step (s)", stepCell], ["bubble", t => MP.fmt.pct(t.time.bubble_fraction)],
      ["MFU", t => MP.fmt.pct(t.throughput.mfu)], ["tok/s/GPU", t => MP.fmt.num(t.throughput.tokens_per_s_per_gpu, 0)]);
    if (r.top.some(t => t.run)) cols.push(["days", t => (t.run ? MP.fmt.num(t.run.days, 1) : "-")]);
    if (r.top.some(t => t.run && t.run.dollars !== undefined)) cols.push(["$M", t => (t.run && t.run.dollars !== undefined ? MP.fmt.num(t.run.dollars / 1e6, 2) : "-")]);
    if (r.objective === "throughput") cols.push(["s/token", t => MP.fmt.sig(t.score, 4)]);
    return cols;
  }
  function stepCell(t) {
    const iv = t.time.step_s_interval;
    return MP.fmt.num(t.time.step_s, 3) + (iv ? ` <span class="s" title="${Math.round(100 * t.time.interval_level)} % prediction interval; overlaps #${t.interval_overlaps.join(", #") || "none"}">(${MP.fmt.num(iv[0], 3)}–${MP.fmt.num(iv[1], 3)})</span>` : "");
  }

  function show(r, partial) {
    const sum = document.getElementById("search-summary");
    const rejected = Object.values(r.rejected).reduce((a, b) => a + b, 0);
    sum.textContent = `${MP.fmt.int(r.evaluated)} plans evaluated, ${MP.fmt.int(r.feasible)} fit, ${MP.fmt.int(rejected)} rejected; ` +
      `${MP.fmt.int(r.simulated)} simulated exactly in ${MP.fmt.num(r.seconds, 2)} s` +
      (r.stack ? `, on the ${r.stack.name} stack.` : ".") + (r.message ? ` ${r.message}` : "");
    const panel = document.getElementById("results-panel");
    panel.hidden = !r.top.length;
    const cols = columns(r);
    const rows = r.top.map((t, i) => `<tr class="click" data-href="${MP.esc(planURL(r.links.top[i]))}">${cols.map(([, cell]) => `<td>${cell(t)}</td>`).join("")}</tr>`);
    const table = document.getElementById("results");
    table.innerHTML = `<tr>${cols.map(([h]) => `<th>${MP.esc(h)}</th>`).join("")}</tr>` + rows.join("");
    table.querySelectorAll("tr.click").forEach(tr => tr.addEventListener("click", () => (location.href = tr.dataset.href)));
    showStopped(r);
    showBaseline(r, partial);
    showRejected(r, rejected);
    requestAnimationFrame(() => setTimeout(() => drawFront(r, partial), 0));  // the table painted first
  }

  function showStopped(r) {
    const el = document.getElementById("search-stopped");
    el.hidden = !r.stopped;
    if (r.stopped) el.textContent = `Stopped early: ${r.stopped.reason}. ${STOPPED_IN[r.stopped.in] || ""}`;
  }

  function showBaseline(r, partial) {
    const el = document.getElementById("search-baseline"), b = r.baseline;
    el.hidden = !b && !partial;
    if (!b) { el.textContent = partial ? "Placing the baseline among the plans…" : ""; return; }
    const p = b.plan, faster = b.faster !== null ? b.faster : b.faster_at_most;
    const link = r.links.baseline ? ` <a href="${MP.esc(planURL(r.links.baseline))}">open it in Plan</a>` : "";
    el.innerHTML = `Baseline ${MP.esc(layout(p))}, ${MP.esc(pipeline(p))}, ${p.micro_batch} × ${p.grad_accum}: step ${MP.fmt.num(b.time.step_s, 3)} s, ` +
      `MFU ${MP.fmt.pct(b.throughput.mfu)}, peak ${MP.fmt.gib(b.memory.peak_bytes)} GiB (${b.fits ? "fits" : "does not fit"}); ` +
      `${b.faster !== null ? "" : "at most "}${MP.fmt.int(faster)} of ${MP.fmt.int(b.feasible)} feasible plans are faster (top ${MP.fmt.pct(b.percentile, 2)}).${link}`;
  }

  function showRejected(r, rejected) {
    document.getElementById("rejected-panel").hidden = !rejected;
    document.getElementById("rejected").innerHTML = `<tr><th>plans</th><th>rule</th></tr>` + Object.entries(r.rejected).sort((a, b) => b[1] - a[1])
      .map(([k, v]) => `<tr><td>${MP.fmt.int(v)}</td><td>${MP.esc(REASONS[k] || k.replace(/_/g, " "))}</td></tr>`).join("");
  }

  // Memory vs the objective, on a log scale: the front (when found) and the top plans.
  function drawFront(r, partial) {
    const pp = document.getElementById("pareto-panel");
    pp.hidden = !r.top.length;
    if (!r.top.length) return;
    const front = r.pareto || [];
    document.getElementById("pareto-title").textContent = partial ? "Memory vs objective (the front follows)" : "Memory vs objective (Pareto front)";
    const traces = [
      { type: "scatter", mode: "lines+markers", name: "front", line: { shape: "hv", color: "#2f6fdb" }, x: front.map(f => f.peak_bytes / MP.GiB), y: front.map(f => f.score),
        text: front.map(f => layout(f)), hovertemplate: "%{text}<br>%{x:.1f} GiB, %{y:.4g}<extra>front</extra>" },
      { type: "scatter", mode: "markers", name: "top plans", marker: { size: 10, color: "#e6864c", symbol: "diamond" }, x: r.top.map(t => t.memory.peak_bytes / MP.GiB),
        y: r.top.map(t => t.score), text: r.top.map(t => `#${t.rank} ${layout(t.plan)}`), hovertemplate: "%{text}<br>%{x:.1f} GiB, %{y:.4g}<extra></extra>" },
    ];
    MP.plot("chart-pareto", traces, { margin: { l: 70, r: 10, t: 28, b: 45 }, xaxis: { title: { text: "peak memory per GPU (GiB)" } },
      yaxis: { title: { text: SCORE[r.objective] || r.objective }, type: "log" }, legend: { orientation: "h", y: -0.2 }, font: { size: 11 } });
  }

  if (state.run === "1") run();
})();
