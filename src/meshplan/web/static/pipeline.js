// The Pipeline view: schedule, runtime, p, m, v and times -> /api/view/pipeline -> Gantt, per-rank
// table, makespan, bubble fraction and overhead, the runtime and its cost, and the closed-form check.
"use strict";
(() => {
  const form = document.getElementById("pipeline-form");
  let state = MP.readState();
  let seq = 0;

  function set(name, value) {
    if (value === "" || value === null) delete state[name]; else state[name] = value;
    MP.writeState(state);
    refresh();
  }
  const refresh = MP.debounce(load, 120);
  form.querySelectorAll("[data-field]").forEach(el => {
    if (state[el.dataset.field] !== undefined) el.value = state[el.dataset.field];
    MP.syncSlider(form.querySelector(`[data-slider="${el.dataset.field}"]`), el.value || el.placeholder);
    if (el.tagName === "SELECT" || el.type === "text") el.addEventListener("change", () => set(el.dataset.field, el.value.trim()));
  });
  form.querySelectorAll("[data-slider]").forEach(s => MP.pair(form, s.dataset.slider, set));
  if (!state.schedule) form.querySelector('[data-field="schedule"]').value = Number(state.vpp) > 1 ? "interleaved" : "1f1b";

  async function load() {
    const mine = ++seq;
    const res = await MP.api("/api/view/pipeline?" + MP.query(state));
    if (mine !== seq) return;
    MP.clearErrors(form);
    if (!res.ok) { MP.showError(res.body, form); return; }
    const d = res.body, p = d.pipeline;
    document.getElementById("pl-makespan").textContent = MP.fmt.num(p.makespan, 4);
    document.getElementById("pl-fraction").textContent = MP.fmt.pct(p.bubble_fraction);
    document.getElementById("pl-overhead").textContent = MP.fmt.pct(p.bubble_overhead);
    const lockstep = p.pipeline_runtime === "lockstep";
    document.getElementById("pl-title").textContent = `${p.schedule}: p = ${p.pp} ranks, m = ${p.microbatches} micro-batches, v = ${p.vpp}` +
      (lockstep ? ", lockstep runtime" : "");
    // what lockstep adds to the dependency-driven makespan, or why the run is dependency-driven
    const extra = p.makespan - p.dependency_makespan;
    document.getElementById("pl-runtime").textContent = lockstep ? "lockstep" : "dependency";
    const cost = document.getElementById("pl-runtime-cost");
    cost.textContent = lockstep && !(extra > 1e-12 * p.dependency_makespan)
      ? `no longer than dependency-driven (${MP.fmt.num(p.dependency_makespan, 4)})`
      : lockstep
      ? `+${MP.fmt.num(extra, 4)} (+${MP.fmt.pct(extra / p.dependency_makespan)}) over dependency-driven ${MP.fmt.num(p.dependency_makespan, 4)}`
      : p.runtime_note;
    cost.title = p.runtime_note;
    // an empty field runs with its default: its slider shows that value, not the middle of its range
    const defaults = { vpp: p.vpp, wgrad: (Number(state.bwd) || 2) / 2 };
    for (const [name, value] of Object.entries(defaults)) {
      if (state[name] === undefined) MP.syncSlider(form.querySelector(`[data-slider="${name}"]`), String(value));
    }
    const drawing = drawGantt(document.getElementById("chart-pipeline"), p, "units");
    document.getElementById("pl-ranks").innerHTML = `<tr><th>rank</th><th>busy</th><th>idle</th><th>idle % of step</th><th>peak in flight</th></tr>` +
      p.ranks.map(r => `<tr><td>${r.rank}</td><td>${MP.fmt.num(r.busy, 4)}</td><td>${MP.fmt.num(r.idle, 4)}</td><td>${MP.fmt.pct(r.idle / p.makespan)}</td><td>${r.peak_inflight}</td></tr>`).join("");
    document.getElementById("pl-closed").textContent = d.closed_form.join("\n");
    await drawing;
    if (mine === seq) MP.drawn();
  }
  MP.preload();
  load();
})();
