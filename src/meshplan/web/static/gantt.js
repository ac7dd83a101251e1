// Draws a pipeline timeline as `meshplan pipeline --json` gives it: one row per rank, one bar per
// action (F forward, B backward or input gradient, I input gradient, W weight gradient).
"use strict";
const GANTT_COLORS = { F: "#4c8be6", B: "#e6864c", I: "#e6864c", W: "#9b6ad6" };
const GANTT_NAMES = { F: "forward", B: "backward", I: "backward (input grad)", W: "backward (weight grad)" };

// Resolves once drawn (Plotly loads on first use: MP.plot).
function drawGantt(el, pipe, unit) {
  const byKind = {};
  for (const r of pipe.ranks) {
    for (const [act, start, end] of r.timeline) {
      const m = /^(\d+)([A-Z]+)(\d+)$/.exec(act);
      const kind = m ? m[2] : act;
      const t = (byKind[kind] = byKind[kind] || { x: [], base: [], y: [], text: [], custom: [] });
      t.x.push(end - start); t.base.push(start); t.y.push(`rank ${r.rank}`);
      t.text.push(m ? m[3] : ""); t.custom.push(m ? `stage ${m[1]}, micro-batch ${m[3]}` : act);
    }
  }
  const many = pipe.ranks.reduce((n, r) => n + r.timeline.length, 0) > 600;
  const traces = Object.entries(byKind).map(([k, t]) => ({
    type: "bar", orientation: "h", name: GANTT_NAMES[k] || k, x: t.x, base: t.base, y: t.y,
    text: many ? undefined : t.text, textposition: "inside", insidetextanchor: "middle",
    customdata: t.custom, marker: { color: GANTT_COLORS[k] || "#888", line: { color: "#fff", width: many ? 0 : 0.6 } },
    hovertemplate: `%{customdata}<br>%{base:.4g} to %{x:.4g} long ${unit}<extra>${GANTT_NAMES[k] || k}</extra>`,
  }));
  const layout = {
    barmode: "overlay", margin: { l: 60, r: 10, t: 28, b: 40 }, bargap: 0.25,
    yaxis: { autorange: "reversed", type: "category" }, xaxis: { title: { text: `time (${unit})` }, zeroline: false },
    legend: { orientation: "h", y: -0.18 }, font: { size: 11 },
  };
  return MP.plot(el, traces, layout);
}
