// Draws a pipeline timeline as `meshplan pipeline --json` gives it: one row per rank, one bar per
// action (F forward, B backward or input gradient, I input gradient, W weight gradient). The
// Pipeline view draws it with Plotly (zoom, hover); the Plan view on a canvas, where the
// thousands of actions of a large plan draw in milliseconds.
"use strict";
const GANTT_COLORS = { F: "#4c8be6", B: "#e6864c", I: "#e6864c", W: "#9b6ad6" };
const GANTT_NAMES = { F: "forward", B: "backward", I: "backward (input grad)", W: "backward (weight grad)" };

// Every action of the timeline: its rank, kind, micro-batch, times and words for a tooltip.
function ganttActions(pipe) {
  const out = [];
  for (const r of pipe.ranks) {
    for (const [act, start, end] of r.timeline) {
      const m = /^(\d+)([A-Z]+)(\d+)$/.exec(act);
      out.push({ rank: r.rank, kind: m ? m[2] : act, mb: m ? m[3] : "", start, end,
                 what: m ? `stage ${m[1]}, micro-batch ${m[3]}` : act });
    }
  }
  return out;
}

// With Plotly; resolves once drawn (Plotly loads on first use: MP.plot).
function drawGantt(el, pipe, unit) {
  const byKind = {};
  const acts = ganttActions(pipe);
  for (const a of acts) {
    const t = (byKind[a.kind] = byKind[a.kind] || { x: [], base: [], y: [], text: [], custom: [] });
    t.x.push(a.end - a.start); t.base.push(a.start); t.y.push(`rank ${a.rank}`); t.text.push(a.mb); t.custom.push(a.what);
  }
  const many = acts.length > 600;
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

// On a canvas filling `el`: rows of bars, a time axis with 1-2-5 ticks, a legend, and the action
// under the pointer as the canvas's tooltip.
function drawGanttCanvas(el, pipe, unit) {
  let canvas = el.querySelector("canvas.gantt");
  if (!canvas) { el.innerHTML = ""; canvas = document.createElement("canvas"); canvas.className = "gantt"; el.appendChild(canvas); }
  const acts = ganttActions(pipe), rows = pipe.ranks.length, span = pipe.makespan || 1;
  const W = el.clientWidth, H = el.clientHeight, ratio = window.devicePixelRatio || 1;
  const left = 56, right = 10, top = 8, bottom = 52, plotW = Math.max(10, W - left - right);
  const rowH = (H - top - bottom) / rows, barH = Math.max(1, rowH * 0.75), scale = plotW / span;
  canvas.width = Math.round(W * ratio); canvas.height = Math.round(H * ratio);
  canvas.style.width = `${W}px`; canvas.style.height = `${H}px`;
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, W, H);
  g.font = "11px system-ui, sans-serif"; g.fillStyle = "#444"; g.textAlign = "right"; g.textBaseline = "middle";
  const every = Math.ceil(12 / Math.max(rowH, 1));  // a label every few rows when rows are thin
  for (let r = 0; r < rows; r += every) g.fillText(`rank ${pipe.ranks[r].rank}`, left - 6, top + (r + 0.5) * rowH);
  for (const a of acts) {
    g.fillStyle = GANTT_COLORS[a.kind] || "#888";
    g.fillRect(left + a.start * scale, top + a.rank * rowH + (rowH - barH) / 2, Math.max(0.5, (a.end - a.start) * scale), barH);
  }
  ganttAxis(g, left, top + rows * rowH, plotW, span, unit);
  ganttLegend(g, left, H - 10, [...new Set(acts.map(a => a.kind))]);
  canvas.onmousemove = ev => {
    const box = canvas.getBoundingClientRect(), x = (ev.clientX - box.left - left) / scale, r = Math.floor((ev.clientY - box.top - top) / rowH);
    const a = acts.find(b => b.rank === pipe.ranks[r]?.rank && b.start <= x && x <= b.end);
    canvas.title = a ? `rank ${a.rank}: ${GANTT_NAMES[a.kind] || a.kind}, ${a.what}, ${MP.fmt.sig(a.start, 4)} to ${MP.fmt.sig(a.end, 4)} ${unit}` : "";
  };
}

function ganttAxis(g, x0, y0, width, span, unit) {
  const raw = span / 8, mag = 10 ** Math.floor(Math.log10(raw)), step = [1, 2, 5, 10].map(k => k * mag).find(s => s >= raw);
  g.strokeStyle = "#999"; g.fillStyle = "#444"; g.textAlign = "center"; g.textBaseline = "top";
  g.beginPath(); g.moveTo(x0, y0); g.lineTo(x0 + width, y0); g.stroke();
  for (let t = 0; t <= span + 1e-9 * span; t += step) {
    const x = x0 + (t / span) * width;
    g.beginPath(); g.moveTo(x, y0); g.lineTo(x, y0 + 4); g.stroke();
    g.fillText(MP.fmt.num(t, 3), x, y0 + 6);
  }
  g.fillText(`time (${unit})`, x0 + width / 2, y0 + 20);
}

function ganttLegend(g, x, y, kinds) {
  g.textAlign = "left"; g.textBaseline = "middle";
  for (const k of kinds) {
    g.fillStyle = GANTT_COLORS[k] || "#888"; g.fillRect(x, y - 5, 10, 10);
    g.fillStyle = "#444"; const name = GANTT_NAMES[k] || k; g.fillText(name, x + 14, y);
    x += 24 + g.measureText(name).width;
  }
}
