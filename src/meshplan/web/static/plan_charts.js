// The Plan view's charts: memory per GPU by pipeline rank, one rank's treemap, the step time on
// the critical rank (Plotly: each draw resolves once drawn, Plotly loading on first use) and the
// plan's pipeline (a canvas). Each is skipped when what it draws has not changed since it was
// last drawn.
"use strict";
const PlanCharts = (() => {
  const COLORS = { weights: "#4c8be6", gradients: "#7fb3f0", optimizer: "#2c5aa0", activations: "#e6864c", other: "#a7b0bf" };
  const PARTS = ["weights", "gradients", "optimizer", "activations", "other"];

  async function memory(e, onRank) {
    const st = e.memory.stages, x = st.map(s => String(s.rank));  // short labels: 16+ ranks stay level and whole
    if (!MP.changed("memory", [st, e.memory.capacity_bytes, e.memory.fits])) return;
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
    const el = await MP.plot("chart-memory", traces, layout);
    el.dataset.signature = st.map(s => s.total.toFixed(0)).join(",");
    if (!el.dataset.bound) {
      el.dataset.bound = "1";
      el.on("plotly_click", ev => onRank(Number(String(ev.points[0].x).replace("rank ", ""))));
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

  async function treemap(e, rank) {
    const s = e.memory.stages[Math.min(rank, e.memory.stages.length - 1)];
    // with v > 1 virtual stages a rank holds chunks (one micro-batch on one of its stages), up to m·v
    const held = e.plan.vpp > 1 ? "micro-batch chunks" : "micro-batches";
    document.getElementById("treemap-title").textContent = `Rank ${s.rank}: ${s.layers} layers, ${s.peak_inflight_microbatches} ${held} in flight at peak`;
    if (!MP.changed("treemap", s)) return;
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
    await MP.plot("chart-treemap", [trace], { margin: { l: 0, r: 0, t: 28, b: 0 }, font: { size: 11 } });
  }

  async function time(e, labels) {
    const tm = e.time, entries = Object.entries(tm.breakdown).filter(([k, v]) => v > 0 || k === "compute");
    document.getElementById("time-title").textContent = `Step time on the critical rank (${tm.critical_rank}): ${MP.fmt.num(tm.step_s, 3)} s`;
    if (!MP.changed("time", entries)) return;
    const trace = { type: "bar", orientation: "h", y: entries.map(([k]) => labels[k] || k), x: entries.map(([, v]) => v),
      text: entries.map(([, v]) => MP.fmt.pct(v / tm.step_s)), textposition: "auto", marker: { color: "#4c8be6" },
      hovertemplate: "%{y}: %{x:.4f} s<extra></extra>" };
    const narrow = document.documentElement.clientWidth < 700;  // the labels take less room on a phone
    await MP.plot("chart-time", [trace], { margin: { l: narrow ? 130 : 210, r: 10, t: 28, b: 40 }, yaxis: { autorange: "reversed" },
      xaxis: { title: { text: "seconds per step" } }, font: { size: narrow ? 10 : 11 } });
  }

  // On a canvas (gantt.js): a large plan's thousands of actions in milliseconds.
  let shownTimeline = null;
  function gantt(d) {
    const el = document.getElementById("chart-gantt"), title = document.getElementById("gantt-title");
    const tl = d.timeline;
    if (!tl) {
      shownTimeline = null;
      MP.changed("gantt", null);
      el.innerHTML = `<p class="note">This plan's step has too many pipeline actions to draw here; the Pipeline view draws schedules of any shape.</p>`;
      title.textContent = "Pipeline schedule of this plan";
      return;
    }
    title.textContent = `Pipeline schedule of this plan: ${tl.schedule}, p = ${tl.pp}, m = ${tl.microbatches}, v = ${tl.vpp}; makespan ${MP.fmt.num(tl.makespan, 3)} s`;
    if (!MP.changed("gantt", tl)) return;
    shownTimeline = tl;
    drawGanttCanvas(el, tl, "s");
  }
  window.addEventListener("resize", MP.debounce(() => { if (shownTimeline) drawGanttCanvas(document.getElementById("chart-gantt"), shownTimeline, "s"); }, 150));

  return { memory, treemap, time, gantt };
})();
