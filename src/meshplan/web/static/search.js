// The Search view: the form -> POST /api/search, progress from GET /api/search/{id}, then the top
// plans (click one to open it in Plan), the memory vs objective front and the rejections.
"use strict";
(() => {
  const form = document.getElementById("search-form");
  let state = MP.readState();
  const FIXED = ["tp", "cp", "pp", "dp", "vpp", "schedule", "micro_batch", "recompute", "zero", "sequence_parallel", "dp_shard"];
  const NUMERIC = new Set(["gpus", "seq_len", "tp", "pp", "cp", "max_tp", "max_pp", "max_cp", "max_vpp", "max_micro_batch", "top", "price"]);
  const SCORE = { throughput: "seconds per token (lower is better)", "time-to-train": "days for the token budget", cost: "dollars for the token budget" };

  form.querySelectorAll("[data-field]").forEach(el => {
    if (state[el.dataset.field] !== undefined) el.value = state[el.dataset.field];
    el.addEventListener("change", () => {
      const v = el.value.trim();
      if (v === "") delete state[el.dataset.field]; else state[el.dataset.field] = v;
      delete state.run;
      MP.writeState(state);
    });
  });
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
    MP.clearErrors(form);
    const btn = document.getElementById("run-search");
    btn.disabled = true;
    document.getElementById("progress-panel").hidden = false;
    progress({ phase: "checking", done: 0, total: 0, elapsed_s: 0, simulated: 0 });
    const sum = document.getElementById("search-summary"), before = sum.innerHTML;
    sum.textContent = "Searching: the best plans appear here when the search is done.";
    try {
      const res = await MP.api("/api/search", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body()) });
      if (!res.ok) {
        MP.showError(res.body, form);
        document.getElementById("progress-panel").hidden = true;
        sum.innerHTML = before;
        return;
      }
      let job = res.body;
      while (job.status === "running") {
        progress(job);
        await new Promise(r => setTimeout(r, 250));
        const next = await MP.api(`/api/search/${job.id}`);
        if (!next.ok) { MP.showError(next.body, form); sum.innerHTML = before; return; }
        job = next.body;
      }
      progress(job);
      if (job.status === "error") { MP.showError(job.error, form); sum.innerHTML = before; return; }
      show(job.result);
    } finally { btn.disabled = false; }
  }

  function progress(job) {
    const frac = job.total ? job.done / job.total : 0;
    document.getElementById("progress-bar").style.width = `${Math.round(100 * (job.phase === "screen" ? frac : job.phase === "checking" ? 0 : 1))}%`;
    const what = job.phase === "screen" ? `screening plans: ${MP.fmt.int(job.done)} of ${MP.fmt.int(job.total)}`
      : job.phase === "simulate" ? `simulating contenders exactly: ${MP.fmt.int(job.simulated)}`
      : job.phase === "finished" ? `finished: ${MP.fmt.int(job.total)} plans screened, ${MP.fmt.int(job.simulated)} simulated` : "checking the inputs";
    document.getElementById("progress-text").textContent = `${what} · ${MP.fmt.num(job.elapsed_s, 1)} s`;
  }

  function layout(p) {
    return `TP${p.tp} CP${p.cp} PP${p.pp} DP${p.dp}` + (p.dp_shard && p.dp_shard !== p.dp ? ` shard ${p.dp_shard}` : "");
  }

  function planURL(est) {
    const p = est.plan, c = est.cluster;
    const q = {};
    if (state.preset) q.preset = state.preset;
    Object.assign(q, { model: est.model.name, gpu: c.gpu, gpus: c.num_gpus, tp: p.tp, cp: p.cp, pp: p.pp, vpp: p.vpp, schedule: p.schedule,
      micro_batch: p.micro_batch, global_batch: p.global_batch, seq_len: p.seq_len, recompute: p.recompute, zero: p.zero,
      sequence_parallel: p.sequence_parallel, precision: p.precision, rank_order: p.rank_order.join(",") });
    if (p.dp_shard !== p.dp) q.dp_shard = p.dp_shard;
    if (p.ep > 1) q.ep = p.ep;
    q.stack = p.stack.name;  // the stack the plan was searched on, with what was set over it
    for (const [k, v] of Object.entries(p.stack.overrides || {})) q[k] = String(v);
    for (const k of ["tokens", "price"]) if (state[k]) q[k] = state[k];
    return "/plan?" + MP.query(q);
  }

  function show(r) {
    const sum = document.getElementById("search-summary");
    const rejected = Object.values(r.rejected).reduce((a, b) => a + b, 0);
    sum.textContent = `${MP.fmt.int(r.evaluated)} plans evaluated, ${MP.fmt.int(r.feasible)} fit, ${MP.fmt.int(rejected)} rejected; ` +
      `${MP.fmt.int(r.simulated)} simulated exactly in ${MP.fmt.num(r.seconds, 2)} s` +
      (r.stack ? `, on the ${r.stack.name} stack.` : ".") + (r.message ? ` ${r.message}` : "");
    const panel = document.getElementById("results-panel");
    panel.hidden = !r.top.length;
    const head = ["#", "layout", "pipeline", "b × m", "recompute, ZeRO", "peak GiB", "step (s)", "bubble", "MFU", "tok/s/GPU", r.objective];
    const rows = r.top.map(t => {
      const p = t.plan;
      return `<tr class="click" data-href="${MP.esc(planURL(t))}"><td>${t.rank}</td><td>${layout(p)}</td><td>${p.pp > 1 ? p.schedule + (p.vpp > 1 ? " v" + p.vpp : "") : "-"}</td>
        <td>${p.micro_batch} × ${p.grad_accum}</td><td>${p.recompute}${p.sequence_parallel && p.tp > 1 ? ", SP" : ""}, ZeRO-${p.zero}</td>
        <td>${MP.fmt.gib(t.memory.peak_bytes)}</td><td>${MP.fmt.num(t.time.step_s, 3)}${t.time.step_s_interval ? ` <span class="s" title="${Math.round(100 * t.time.interval_level)} % prediction interval; overlaps #${t.interval_overlaps.join(", #") || "none"}">(${MP.fmt.num(t.time.step_s_interval[0], 3)}–${MP.fmt.num(t.time.step_s_interval[1], 3)})</span>` : ""}</td><td>${MP.fmt.pct(t.time.bubble_fraction)}</td>
        <td>${MP.fmt.pct(t.throughput.mfu)}</td><td>${MP.fmt.num(t.throughput.tokens_per_s_per_gpu, 0)}</td><td>${MP.fmt.sig(t.score, 4)}</td></tr>`;
    });
    const table = document.getElementById("results");
    table.innerHTML = `<tr>${head.map(h => `<th>${MP.esc(h)}</th>`).join("")}</tr>` + rows.join("");
    table.querySelectorAll("tr.click").forEach(tr => tr.addEventListener("click", () => (location.href = tr.dataset.href)));

    const rej = document.getElementById("rejected");
    document.getElementById("rejected-panel").hidden = !rejected;
    rej.innerHTML = `<tr><th>plans</th><th>rule</th></tr>` + Object.entries(r.rejected).sort((a, b) => b[1] - a[1]).map(([k, v]) => `<tr><td>${MP.fmt.int(v)}</td><td>${MP.esc(k.replace(/_/g, " "))}</td></tr>`).join("");

    const pp = document.getElementById("pareto-panel");
    pp.hidden = !r.top.length;
    if (!r.top.length) return;
    const front = r.pareto || [];
    const traces = [
      { type: "scatter", mode: "lines+markers", name: "front", line: { shape: "hv", color: "#2f6fdb" }, x: front.map(f => f.peak_bytes / MP.GiB), y: front.map(f => f.score),
        text: front.map(f => layout(f)), hovertemplate: "%{text}<br>%{x:.1f} GiB, %{y:.4g}<extra>front</extra>" },
      { type: "scatter", mode: "markers", name: "top plans", marker: { size: 10, color: "#e6864c", symbol: "diamond" }, x: r.top.map(t => t.memory.peak_bytes / MP.GiB),
        y: r.top.map(t => t.score), text: r.top.map(t => `#${t.rank} ${layout(t.plan)}`), hovertemplate: "%{text}<br>%{x:.1f} GiB, %{y:.4g}<extra></extra>" },
    ];
    MP.plot("chart-pareto", traces, { margin: { l: 70, r: 10, t: 28, b: 45 }, xaxis: { title: { text: "peak memory per GPU (GiB)" } },
      yaxis: { title: { text: SCORE[r.objective] || r.objective } }, legend: { orientation: "h", y: -0.2 }, font: { size: 11 } });
  }

  if (state.run === "1") run();
})();
