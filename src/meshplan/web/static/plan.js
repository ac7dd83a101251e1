// The Plan view: inputs -> /api/view/plan -> verdict, memory per rank, step time, throughput,
// pipeline Gantt, explain and assumptions. The URL holds the preset and every value the user set.
"use strict";
(() => {
  const form = document.getElementById("plan-form");
  let state = MP.readState();
  let seq = 0;
  let last = null;
  let selectedRank = null;
  const COLORS = { weights: "#4c8be6", gradients: "#7fb3f0", optimizer: "#2c5aa0", activations: "#e6864c", other: "#a7b0bf" };
  const PARTS = ["weights", "gradients", "optimizer", "activations", "other"];

  function set(name, value) {
    if (name === "preset") { state = value ? { preset: value } : {}; selectedRank = null; }
    else if (value === "" || value === null) delete state[name];
    else state[name] = value;
    MP.writeState(state);
    refresh();
  }
  const refresh = MP.debounce(load, 120);

  form.querySelectorAll("select[data-field], input[type=text][data-field]").forEach(el =>
    el.addEventListener("change", () => set(el.dataset.field, el.value)));
  form.querySelectorAll("input[type=text][data-field]").forEach(el =>
    el.addEventListener("input", () => set(el.dataset.field, el.value.trim())));
  form.querySelectorAll("[data-slider]").forEach(s => MP.pair(form, s.dataset.slider, set));
  form.querySelectorAll("[data-reset]").forEach(b => b.addEventListener("click", () => set(b.dataset.reset, "")));

  function resolved(d) {
    const e = d.estimate, p = e.plan, c = e.cluster;
    const presetValues = d.preset ? d.preset.values : {};
    const pick = k => (state[k] !== undefined ? state[k] : presetValues[k] !== undefined ? presetValues[k] : "");
    return {
      preset: state.preset || "", model: e.model.name, gpu: c.gpu, gpus: c.num_gpus, tp: p.tp, cp: p.cp, pp: p.pp, vpp: p.vpp,
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
    const res = await MP.api("/api/view/plan?" + MP.query(state));
    if (mine !== seq) return; // a newer request is on its way
    MP.clearErrors(form);
    if (!res.ok) {
      MP.showError(res.body, form);
      document.getElementById("plan-out").classList.add("stale");
      fillInputs(last ? resolved(last) : null);
      return;
    }
    document.getElementById("plan-out").classList.remove("stale");
    last = res.body;
    fillInputs(resolved(last));
    draw(last);
  }

  function draw(d) {
    const e = d.estimate;
    drawVerdict(e);
    drawSummary(e);
    drawMemory(e);
    drawTreemap(e, selectedRank ?? e.memory.worst_stage);
    drawTime(e, d.breakdown_labels);
    drawThroughput(e, d.published);
    drawGanttPanel(d);
    document.getElementById("explain").innerHTML = MP.derivationsHTML(d.derivations);
    drawAssumptions(d.assumptions);
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
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
    document.getElementById("kpi-run-sub").textContent = run
      ? (run.days_interval ? `${MP.fmt.num(run.days_interval[0], 1)}–${MP.fmt.num(run.days_interval[1], 1)} days (${level}) · ` : "") +
        `${MP.fmt.int(run.gpu_hours)} GPU-hours` + (run.dollars !== undefined ? ` · $${MP.fmt.num(run.dollars / 1e6, 2)}M` : "")
      : "give tokens to train on";
  }

  function drawSummary(e) {
    const p = e.plan, c = e.cluster;
    const pipe = p.pp > 1 ? `, ${p.schedule}${p.vpp > 1 ? " v" + p.vpp : ""}` : "";
    document.getElementById("summary").innerHTML =
      `<b>${MP.esc(e.model.name)}</b> (${MP.fmt.int(e.model.params_total)} parameters) on <b>${MP.fmt.int(c.num_gpus)} × ${MP.esc(c.gpu)}</b>: ` +
      `TP${p.tp} CP${p.cp} PP${p.pp} DP${p.dp}${pipe}; batch ${MP.fmt.int(p.global_batch)} × ${MP.fmt.int(p.seq_len)} = ${MP.fmt.int(p.global_batch_tokens)} tokens ` +
      `(micro-batch ${p.micro_batch} × ${MP.fmt.int(p.grad_accum)} micro-batches × DP${p.dp}); ZeRO-${p.zero}, recompute ${p.recompute}, ` +
      `${p.precision} with ${p.bytes_per_param} bytes per parameter; layers per virtual stage ${MP.esc(compress(p.layer_split))}; ` +
      `stack <b>${MP.esc(p.stack.name)}</b>` + stackSet(p.stack.overrides);
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

  function drawMemory(e) {
    const st = e.memory.stages, x = st.map(s => String(s.rank));  // short labels: 16+ ranks stay level and whole
    const traces = PARTS.map(k => ({
      type: "bar", name: k, x, y: st.map(s => s[k] / MP.GiB), marker: { color: COLORS[k] },
      hovertemplate: `rank %{x}: ${k} %{y:.2f} GiB<extra></extra>`,
    }));
    const cap = e.memory.capacity_bytes / MP.GiB;
    const top = Math.max(cap, ...st.map(s => s.total / MP.GiB)) * 1.08;
    const layout = {
      barmode: "stack", margin: { l: 50, r: 10, t: 28, b: 40 }, yaxis: { title: { text: "GiB per GPU" }, range: [0, top] },
      xaxis: { type: "category" },  // the panel title names the axis: pipeline rank
      legend: { orientation: "h", y: -0.15 }, font: { size: 11 },
      shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: cap, y1: cap, line: { color: e.memory.fits ? "#1f8a4c" : "#c62828", width: 2, dash: "dash" } }],
      annotations: [{ xref: "paper", x: 1, y: cap, xanchor: "right", yanchor: "bottom", showarrow: false, text: `usable HBM ${cap.toFixed(1)} GiB`, font: { color: "#444" } }],
    };
    const el = document.getElementById("chart-memory");
    Plotly.react(el, traces, layout, MP.plotConfig);
    el.dataset.signature = st.map(s => s.total.toFixed(0)).join(",");
    if (!el.dataset.bound) {
      el.dataset.bound = "1";
      el.on("plotly_click", ev => {
        const r = Number(String(ev.points[0].x).replace("rank ", ""));
        selectedRank = r;
        if (last) drawTreemap(last.estimate, r);
      });
    }
  }

  // The negative activation items are activations not held at the peak's moment
  // (meshplan.cost.compose.at_peak): the working set not yet built at the loss (W = backward
  // working set + its gradients), a layer's stored activations and W freed at its end, the LM
  // head's activations freed. A treemap draws no negative area, so they are taken off the
  // activation items they stand for (W first, then the stored activations; the head's from the
  // stored ones), and the tiles add up to the rank's total.
  function activationsAtPeak(act) {
    const net = {};
    for (const [name, v] of Object.entries(act)) if (v >= 0) net[name] = v;
    for (const [name, v] of Object.entries(act)) {
      if (v >= 0) continue;
      let left = -v;
      const order = name === "head_activations_freed" ? ["stored"] : ["backward_gradients", "backward_working_set", "stored"];
      for (const k of order) {
        const d = Math.min(net[k] || 0, left);
        if (d > 0) { net[k] -= d; left -= d; }
      }
    }
    return net;
  }

  function drawTreemap(e, rank) {
    const s = e.memory.stages[Math.min(rank, e.memory.stages.length - 1)];
    const root = `rank ${s.rank}`;
    const ids = [root], labels = [`rank ${s.rank}: ${MP.fmt.gib(s.total)} GiB`], parents = [""], values = [0];
    for (const k of PARTS) {
      const detail = k === "activations" ? activationsAtPeak(s.activations_detail) : k === "other" ? s.other_detail : null;
      const itemized = detail && Object.keys(detail).length > 0;
      const items = itemized ? Object.entries(detail).filter(([, v]) => v > 0) : [];
      ids.push(k); labels.push(k); parents.push(root); values.push(itemized ? 0 : s[k] / MP.GiB);
      for (const [name, v] of items) { ids.push(`${k}/${name}`); labels.push(name.replace(/_/g, " ")); parents.push(k); values.push(v / MP.GiB); }
    }
    const trace = { type: "treemap", ids, labels, parents, values, branchvalues: "remainder",
      texttemplate: "%{label}<br>%{value:.2f} GiB", hovertemplate: "%{label}: %{value:.3f} GiB<extra></extra>",
      marker: { colors: ids.map(id => COLORS[id.split("/")[0]] || "#dfe4ec") } };
    // with v > 1 virtual stages a rank holds chunks (one micro-batch on one of its stages), up to m·v
    const held = e.plan.vpp > 1 ? "micro-batch chunks" : "micro-batches";
    document.getElementById("treemap-title").textContent = `Rank ${s.rank}: ${s.layers} layers, ${s.peak_inflight_microbatches} ${held} in flight at peak`;
    Plotly.react("chart-treemap", [trace], { margin: { l: 0, r: 0, t: 28, b: 0 }, font: { size: 11 } }, MP.plotConfig);
  }

  function drawTime(e, labels) {
    const tm = e.time, entries = Object.entries(tm.breakdown).filter(([k, v]) => v > 0 || k === "compute");
    const trace = { type: "bar", orientation: "h", y: entries.map(([k]) => labels[k] || k), x: entries.map(([, v]) => v),
      text: entries.map(([, v]) => MP.fmt.pct(v / tm.step_s)), textposition: "auto", marker: { color: "#4c8be6" },
      hovertemplate: "%{y}: %{x:.4f} s<extra></extra>" };
    document.getElementById("time-title").textContent = `Step time on the critical rank (${tm.critical_rank}): ${MP.fmt.num(tm.step_s, 3)} s`;
    Plotly.react("chart-time", [trace], { margin: { l: 210, r: 10, t: 28, b: 40 }, yaxis: { autorange: "reversed" },
      xaxis: { title: { text: "seconds per step" } }, font: { size: 11 } }, MP.plotConfig);
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

  function drawGanttPanel(d) {
    const el = document.getElementById("chart-gantt"), title = document.getElementById("gantt-title");
    const tl = d.timeline;
    if (!tl) {
      Plotly.purge(el);
      el.innerHTML = `<p class="note">This plan's step has too many pipeline actions to draw here; the Pipeline view draws schedules of any shape.</p>`;
      title.textContent = "Pipeline schedule of this plan";
      return;
    }
    if (!el.querySelector(".plot-container")) el.innerHTML = "";
    title.textContent = `Pipeline schedule of this plan: ${tl.schedule}, p = ${tl.pp}, m = ${tl.microbatches}, v = ${tl.vpp}; makespan ${MP.fmt.num(tl.makespan, 3)} s`;
    drawGantt(el, tl, "s");
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

  fillInputs(null);
  load();
})();
