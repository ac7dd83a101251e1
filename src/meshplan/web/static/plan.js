// The Plan view: inputs -> /api/view/plan -> verdict, summary, throughput, the charts
// (plan_charts.js), explain and assumptions; then /api/estimate for the advice, each item a link
// that applies its change. The URL holds the preset and every value the user set.
"use strict";
(() => {
  const form = document.getElementById("plan-form");
  let state = MP.readState();
  let seq = 0;
  let last = null;
  let selectedRank = null;

  function set(name, value) {
    if (name === "preset") { state = value ? { preset: value } : {}; selectedRank = null; }
    else if (value === "" || value === null) delete state[name];
    else if (name === "dp") setDP(value);
    else {
      state[name] = value;
      if (name === "gpus") delete state.dp;  // the GPUs given, dp follows from them
    }
    MP.writeState(state);
    refresh();
  }
  // DP is tp·cp·pp·dp GPUs: set as the GPU count of the plan drawn last (dp itself once none was).
  function setDP(value) {
    const p = last && last.estimate.plan, dp = Number(value);
    if (p && Number.isInteger(dp) && dp > 0) { state.gpus = String(p.tp * p.cp * p.pp * dp); delete state.dp; }
    else { state.dp = value; delete state.gpus; }
  }
  const refresh = MP.debounce(load, 80);
  // The advice (about 20 estimates of other plans) is asked for once a plan has stayed this long:
  // a slider being dragged does not keep the server estimating plans already left behind.
  const ADVICE_AFTER_MS = 300;

  form.querySelectorAll("select[data-field], input[type=text][data-field]").forEach(el =>
    el.addEventListener("change", () => set(el.dataset.field, el.value)));
  form.querySelectorAll("input[type=text][data-field]").forEach(el =>
    el.addEventListener("input", () => set(el.dataset.field, el.value.trim())));
  form.querySelectorAll("[data-slider]").forEach(s => MP.pair(form, s.dataset.slider, set));
  form.querySelectorAll("[data-reset]").forEach(b => b.addEventListener("click", ev => { ev.preventDefault(); set(b.dataset.reset, ""); }));
  document.getElementById("kpi-run-sub").addEventListener("click", ev => {
    if (ev.target.id !== "ask-tokens") return;
    document.getElementById("group-run").open = true;
    document.getElementById("in-tokens").focus();
  });

  function resolved(d) {
    const e = d.estimate, p = e.plan, c = e.cluster;
    const presetValues = d.preset ? d.preset.values : {};
    const pick = k => (state[k] !== undefined ? state[k] : presetValues[k] !== undefined ? presetValues[k] : "");
    return {
      preset: state.preset || "", model: e.model.name, gpu: c.gpu, gpus: c.num_gpus, tp: p.tp, cp: p.cp, pp: p.pp, dp: p.dp, ep: p.ep, vpp: p.vpp,
      micro_batch: p.micro_batch, global_batch: p.global_batch, seq_len: p.seq_len, schedule: p.schedule,
      stack: p.stack.name, pipeline_runtime: p.stack.pipeline_runtime,
      recompute: p.recompute, zero: String(p.zero), precision: p.precision, grad_dtype: p.grad_dtype,
      master_weights: String(p.master_weights), attention: p.attention, sequence_parallel: String(p.sequence_parallel),
      kernels: p.stack.kernels, compile_loss: String(p.stack.compile_loss),
      fsdp_fp8_all_gather: String(p.stack.fsdp_fp8_all_gather), fp8_linears: p.stack.fp8_linears, attention_kernel: p.stack.attention_kernel, tp_comm_overlap: String(p.stack.tp_comm_overlap), tp_overlap_kind: p.stack.tp_overlap_kind,
      gpus_per_node: c.gpus_per_node, nic_gbps: c.scale_out_bandwidth / 1e9, pod_size: c.pod_size ?? "",
      oversubscription: c.oversubscription, tokens: pick("tokens"), price: pick("price"), pue: state.pue ?? 1,
    };
  }

  function fillInputs(values) {
    form.querySelectorAll("[data-field]").forEach(el => {
      const name = el.dataset.field;
      if (document.activeElement === el) return;
      const v = state[name] !== undefined ? state[name] : values ? values[name] : undefined;
      if (v !== undefined) el.value = String(v);
      MP.syncSlider(form.querySelector(`[data-slider="${name}"]`), el.value);
    });
    form.querySelectorAll(".field").forEach(f => {
      const input = f.querySelector("[data-field]");
      if (!input) return;
      const isSet = state[input.dataset.field] !== undefined && input.dataset.field !== "preset";
      f.classList.toggle("set", isSet);
      const r = f.querySelector("[data-reset]");
      if (r) r.hidden = !isSet;
    });
  }

  async function load() {
    const mine = ++seq;
    const query = MP.query(state);
    const res = await MP.api("/api/view/plan?" + query);
    if (mine !== seq) return; // a newer request is on its way
    MP.clearErrors(form);
    const out = document.getElementById("plan-out");
    if (!res.ok) {
      MP.showError(res.body, form);
      out.classList.add("stale");
      fillInputs(last ? resolved(last) : null);
      return;
    }
    out.classList.remove("stale");
    last = res.body;
    fillInputs(resolved(last));
    document.getElementById("advice-panel").classList.add("stale");
    await draw(last);
    if (mine !== seq) return;
    MP.drawn();
    setTimeout(() => { if (mine === seq) loadAdvice(query, mine); }, ADVICE_AFTER_MS);
  }

  // Text and the pipeline's canvas first; the other charts once Plotly is there. What has not
  // changed is not drawn again.
  async function draw(d) {
    const e = d.estimate;
    drawVerdict(e);
    drawSummary(e);
    drawThroughput(e, d.published);
    if (MP.changed("explain", d.derivations)) document.getElementById("explain").innerHTML = MP.derivationsHTML(d.derivations);
    if (MP.changed("assumptions", d.assumptions)) drawAssumptions(d.assumptions);
    PlanCharts.gantt(d);
    const onRank = r => { selectedRank = r; if (last) PlanCharts.treemap(last.estimate, r); };
    await Promise.all([PlanCharts.memory(e, onRank), PlanCharts.treemap(e, selectedRank ?? e.memory.worst_stage),
                       PlanCharts.time(e, d.breakdown_labels)]);
  }

  // ---- advice: /api/estimate's advice, each a link to the plan with its flags applied ------------
  async function loadAdvice(query, mine) {
    const res = await MP.api("/api/estimate?" + query);
    if (mine !== seq || !res.ok) return;
    const items = res.body.advice || [];
    const panel = document.getElementById("advice-panel");
    panel.hidden = !items.length;
    panel.classList.remove("stale");
    document.getElementById("advice").innerHTML = items.map((a, i) =>
      `<li class="${a.fits ? "fits" : "over"}"><a href="/plan?${MP.esc(MP.query(applied(a.flags)))}" data-advice="${i}">${MP.esc(a.why)}</a>` +
      ` <code>${MP.esc(a.flags.join(" "))}</code></li>`).join("");
    document.getElementById("advice").querySelectorAll("a[data-advice]").forEach(link => link.addEventListener("click", ev => {
      if (ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey) return;  // a new tab or window opens the link itself
      ev.preventDefault();
      state = applied(items[Number(link.dataset.advice)].flags);
      MP.writeState(state);
      MP.openGroupsOf(form, state);
      load();
    }));
  }
  // The state with an advice's flags (--name value pairs) applied; dp only where the URL holds it
  // (the change keeps the GPU count, which gives dp).
  function applied(flags) {
    const next = { ...state };
    for (let i = 0; i + 1 < flags.length; i += 2) {
      const name = flags[i].replace(/^--/, "").replace(/-/g, "_");
      if (name === "dp" && next.dp === undefined) continue;
      next[name] = flags[i + 1];
    }
    return next;
  }

  function drawVerdict(e) {
    const m = e.memory, v = document.getElementById("verdict");
    v.classList.toggle("ok", m.fits);
    v.classList.toggle("bad", !m.fits);
    document.getElementById("verdict-text").textContent = m.fits ? "fits" : "does not fit";
    const head = m.headroom_bytes;
    document.getElementById("verdict-sub").textContent =
      `peak ${MP.fmt.gib(m.peak_bytes)} of ${MP.fmt.gib(m.capacity_bytes)} GiB on rank ${m.worst_stage}; ` +
      (m.fits ? `${MP.fmt.gib(head)} GiB headroom (${MP.fmt.pct(head / m.capacity_bytes)})` : `over by ${MP.fmt.gib(-head)} GiB (${MP.fmt.pct(-head / m.capacity_bytes)})`);
    const t = e.throughput, tm = e.time;
    document.getElementById("kpi-mfu").textContent = MP.fmt.pct(t.mfu);
    document.getElementById("kpi-mfu-sub").textContent = `${MP.fmt.num(t.model_tflops_per_gpu, 1)} TFLOP/s per GPU · HFU ${MP.fmt.pct(t.hfu)}`;
    document.getElementById("kpi-step").textContent = `${MP.fmt.num(tm.step_s, 3)} s`;
    const iv = tm.step_s_interval, level = `${Math.round(1000 * tm.interval_level) / 10} %`;
    document.getElementById("kpi-step-sub").textContent = iv
      ? `${MP.fmt.num(iv[0], 3)}–${MP.fmt.num(iv[1], 3)} s (${level} interval) · bubble ${MP.fmt.pct(tm.bubble_fraction)} of the step`
      : `bubble ${MP.fmt.pct(tm.bubble_fraction)} of the step`;
    if (iv) document.getElementById("kpi-step-sub").title =
      `prediction interval of the measured step, split-conformal from ${tm.interval_basis.runs} validated runs of ` +
      `${tm.interval_basis.group}${tm.interval_basis.note ? "; " + tm.interval_basis.note : ""}`;
    document.getElementById("kpi-tps").textContent = MP.fmt.int(t.tokens_per_s);
    document.getElementById("kpi-tps-sub").textContent = `${MP.fmt.num(t.tokens_per_s_per_gpu, 1)} per GPU`;
    const run = e.run;
    document.getElementById("kpi-days").textContent = run ? `${MP.fmt.num(run.days, 1)} days` : "—";
    const runSub = document.getElementById("kpi-run-sub");
    if (run) runSub.textContent = (run.days_interval ? `${MP.fmt.num(run.days_interval[0], 1)}–${MP.fmt.num(run.days_interval[1], 1)} days (${level}) · ` : "") +
        `${MP.fmt.int(run.gpu_hours)} GPU-hours` + (run.dollars !== undefined ? ` · $${MP.fmt.num(run.dollars / 1e6, 2)}M` : "");
    else runSub.innerHTML = `<button type="button" class="linkish" id="ask-tokens">give tokens to train on</button>`;
  }

  function drawSummary(e) {
    const p = e.plan, c = e.cluster;
    const pipe = p.pp > 1 ? `, ${p.schedule}${p.vpp > 1 ? " v" + p.vpp : ""}` : "";
    document.getElementById("summary").innerHTML =
      `<b>${MP.esc(e.model.name)}</b> (${MP.fmt.int(e.model.params_total)} parameters) on <b>${MP.fmt.int(c.num_gpus)} × ${MP.esc(c.gpu)}</b>: ` +
      `${layout(p)}${pipe}; batch ${MP.fmt.int(p.global_batch)} × ${MP.fmt.int(p.seq_len)} = ${MP.fmt.int(p.global_batch_tokens)} tokens ` +
      `(micro-batch ${p.micro_batch} × ${MP.fmt.int(p.grad_accum)} micro-batches × DP${p.dp}); ZeRO-${p.zero}, recompute ${p.recompute}, ` +
      `${p.precision} with ${p.bytes_per_param} bytes per parameter; layers per virtual stage ${MP.esc(compress(p.layer_split))}; ` +
      `stack <b>${MP.esc(p.stack.name)}</b>` + stackSet(p.stack.overrides);
  }
  function layout(p) {
    return `TP${p.tp} CP${p.cp} PP${p.pp} DP${p.dp}` + (p.ep > 1 ? ` EP${p.ep}` : "") +
      (p.dp_shard !== p.dp ? ` (HSDP: model state sharded over groups of ${p.dp_shard} DP ranks)` : "");
  }
  function stackSet(overrides) {
    const keys = Object.keys(overrides || {});
    return keys.length ? ` (set: ${keys.map(k => MP.esc(`${k}=${overrides[k]}`)).join(", ")})` : "";
  }
  function compress(xs) {
    const out = []; let i = 0;
    while (i < xs.length) { let j = i; while (j < xs.length && xs[j] === xs[i]) j++; out.push(j - i > 1 ? `${xs[i]} × ${j - i}` : String(xs[i])); i = j; }
    return out.join(", ");
  }

  function drawThroughput(e, published) {
    const t = e.throughput, f = e.flops, run = e.run, tm = e.time;
    const rows = [
      ["tokens/s (whole job)", MP.fmt.int(t.tokens_per_s)], ["tokens/s per GPU", MP.fmt.num(t.tokens_per_s_per_gpu, 1)],
      ["model TFLOP/s per GPU", MP.fmt.num(t.model_tflops_per_gpu, 1)], ["hardware TFLOP/s per GPU", MP.fmt.num(t.hardware_tflops_per_gpu, 1)],
      ["MFU (model FLOPs / dense peak)", MP.fmt.pct(t.mfu)], ["HFU (with recompute)", MP.fmt.pct(t.hfu)],
      ["bubble fraction (idle share of the step)", MP.fmt.pct(tm.bubble_fraction)], ["bubble overhead (idle / busy)", MP.fmt.pct(tm.bubble_overhead)],
      ["model FLOPs per step", MP.fmt.sig(f.model_per_step)],
    ];
    if (run) {
      rows.push(["optimizer steps", MP.fmt.int(run.steps)], ["wall-clock (days)", MP.fmt.num(run.days, 2)], ["GPU-hours", MP.fmt.int(run.gpu_hours)]);
      if (run.dollars !== undefined) rows.push(["cost ($)", MP.fmt.int(run.dollars)]);
      rows.push(["energy (MWh)", MP.fmt.num(run.energy_mwh, 1)]);
    }
    document.getElementById("table-throughput").innerHTML = rows.map(([k, v]) => `<tr><td>${MP.esc(k)}</td><td>${MP.esc(v)}</td></tr>`).join("");
    const pub = document.getElementById("published");
    if (published && published.rows.length) {
      pub.innerHTML = `<h2 style="margin-top:10px">Estimate vs published</h2><table class="grid"><tr><th>figure</th><th>meshplan</th><th>published</th><th>difference</th></tr>` +
        published.rows.map(r => `<tr>${r.map(c => `<td>${MP.esc(c)}</td>`).join("")}</tr>`).join("") +
        `</table><p class="note">${MP.esc(published.source)}; their FLOP count: ${MP.esc(published.formula)}</p>`;
    } else pub.innerHTML = "";
  }

  function drawAssumptions(a) {
    const b = a.bytes_per_param, g = a.gpu, n = a.network, c = a.calibration;
    const row = (k, v) => `<tr><td>${MP.esc(k)}</td><td>${MP.esc(v)}</td></tr>`;
    document.getElementById("assumptions").innerHTML =
      `<table class="kv">${row("bytes per parameter (weights + gradients + optimizer)", `${b.weights} + ${b.gradients} + ${b.master_weights + b.gradient_fp32_copy + b.optimizer_moments} = ${b.total}`)}
        ${row("  optimizer: master weights, fp32 gradient copy, moments", `${b.master_weights}, ${b.gradient_fp32_copy}, ${b.optimizer_moments}`)}
        ${row("bytes per activation element", b.activation_element)}
        ${row(`${g.name}: dense peak used for MFU (${g.compute_dtype})`, `${MP.fmt.num(g.mfu_peak_tflops, 1)} TFLOP/s`)}
        ${row("HBM per GPU", `${MP.fmt.num(g.hbm_gib, 1)} GiB at ${MP.fmt.num(g.hbm_tbps, 2)} TB/s`)}
        ${row("scale-up: GPUs per node, GB/s per GPU per direction", `${n.gpus_per_node}, ${MP.fmt.num(n.scale_up_gbps, 1)}`)}
        ${row("scale-out: GB/s per GPU per direction", MP.fmt.num(n.scale_out_gbps, 1))}
        ${row("pods, oversubscription above them", `${n.pod_size ?? "whole cluster"}, ${n.oversubscription}:1`)}
        ${Object.entries(c.constants).map(([k, v]) => row(`${c.generation}: ${k.replace(/_/g, " ")}`, MP.fmt.sig(v, 3))).join("")}
      </table><p class="note">${MP.esc(c.rationale)}</p><ul class="note">${a.units.map(u => `<li>${MP.esc(u)}</li>`).join("")}</ul>`;
  }

  MP.openGroupsOf(form, state);
  fillInputs(null);
  MP.preload();
  load();
})();
