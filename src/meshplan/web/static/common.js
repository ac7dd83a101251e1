// Shared by the pages: state in the URL, requests to the JSON API, inline errors, number formats,
// and Plotly, loaded after the first paint (a 4.8 MB script: the text of a page never waits for it).
// Pages only draw what the API returns; unit changes for display (bytes -> GiB) are the only arithmetic.
"use strict";
const MP = (() => {
  const GiB = 2 ** 30;

  function readState() {
    const out = {};
    for (const [k, v] of new URLSearchParams(location.search)) out[k] = v;
    return out;
  }
  function writeState(state) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(state)) if (v !== "" && v !== null && v !== undefined) q.set(k, v);
    const url = location.pathname + (q.toString() ? "?" + q.toString() : "");
    history.replaceState(null, "", url);
  }
  function query(state) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(state)) if (v !== "" && v !== null && v !== undefined) q.set(k, v);
    return q.toString();
  }

  // GET or POST the API; resolves {ok, status, body}. A 422 body names the field and the rule.
  async function api(path, opts = {}) {
    const res = await fetch(path, opts);
    let body = null;
    try { body = await res.json(); } catch (e) { body = { detail: res.statusText }; }
    return { ok: res.ok, status: res.status, body };
  }

  function clearErrors(root = document) {
    root.querySelectorAll(".err").forEach(e => (e.textContent = ""));
    root.querySelectorAll(".field.invalid").forEach(f => f.classList.remove("invalid"));
    banner("");
  }
  // Show "field: rule" next to the field's input when the page has one, else in the side panel.
  function showError(body, root = document) {
    const field = body && body.field ? body.field : "input";
    const text = body && body.rule ? body.rule : (body && body.detail) || "request failed";
    const el = root.querySelector(`#err-${CSS.escape(field)}`) || root.querySelector(`[data-err="${CSS.escape(field)}"]`);
    if (el) {
      el.textContent = text;
      const f = el.closest(".field");
      if (f) f.classList.add("invalid");
      const group = el.closest("details");
      if (group) group.open = true;
    } else {
      const other = root.querySelector("#err-other");
      if (other) other.textContent = `${field}: ${text}`;
    }
    banner(`${field}: ${text}`);
  }
  function banner(text, kind) {
    const b = document.getElementById("banner");
    if (!b) return;
    b.textContent = text;
    b.hidden = !text;
    b.className = "banner" + (kind ? " " + kind : "");
  }

  // Open each collapsed group of `root` that holds an input named in `state`.
  function openGroupsOf(root, state) {
    for (const name of Object.keys(state)) {
      const input = root.querySelector(`[data-field="${CSS.escape(name)}"]`);
      const group = input && input.closest("details");
      if (group) group.open = true;
    }
  }

  function debounce(fn, ms) {
    let t = null;
    return (...a) => { clearTimeout(t); t = setTimeout(() => fn(...a), ms); };
  }

  // A slider paired with a number box: "log2" sliders move in powers of two.
  function pair(root, name, onInput) {
    const slider = root.querySelector(`[data-slider="${name}"]`);
    const box = root.querySelector(`[data-field="${name}"]`);
    if (!slider || !box) return;
    const log = slider.dataset.scale === "log2";
    slider.addEventListener("input", () => {
      box.value = log ? String(2 ** Number(slider.value)) : slider.value;
      onInput(name, box.value);
    });
    box.addEventListener("input", () => { syncSlider(slider, box.value); onInput(name, box.value); });
  }
  function syncSlider(slider, value) {
    if (!slider) return;
    const x = Number(value);
    if (!isFinite(x) || value === "") return;
    slider.value = slider.dataset.scale === "log2" ? String(Math.round(Math.log2(Math.max(x, 1)))) : String(x);
  }

  const fmt = {
    gib: b => (b / GiB).toFixed(2),
    pct: (x, d = 1) => (100 * x).toFixed(d) + "%",
    int: x => Math.round(x).toLocaleString("en-US"),
    num: (x, d = 3) => Number(x).toLocaleString("en-US", { maximumFractionDigits: d }),
    sig: (x, d = 4) => (Math.abs(x) > 0 && Math.abs(x) < 1e-3 ? Number(x).toExponential(d - 1) : Number(x).toPrecision(d)),
  };

  function esc(s) {
    return String(s).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }

  function derivationsHTML(list) {
    return list.map(d => `<div class="deriv" data-key="${esc(d.key)}"><div class="t">${esc(d.title)} <span class="note">[${esc(d.key)}]</span></div>
      <div class="f">= ${esc(d.formula)}</div>
      <div class="sym">${d.symbols.map(([s, v]) => `<div><b>${esc(s)}</b> ${esc(v)}</div>`).join("")}</div>
      <div>= <span class="val">${esc(d.value)}</span></div>${d.source ? `<div class="note">source: ${esc(d.source)}</div>` : ""}</div>`).join("");
  }

  document.addEventListener("DOMContentLoaded", () => {
    const b = document.getElementById("copy-link");
    if (b) b.addEventListener("click", async () => {
      b.dataset.href = location.href;
      try { await navigator.clipboard.writeText(location.href); } catch (e) { /* clipboard needs a secure context */ }
      b.textContent = "link copied";
      setTimeout(() => (b.textContent = "copy link"), 1500);
    });
  });

  const plotConfig = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  // Plotly, fetched once, when a chart is first drawn or once the page has painted (preload()).
  let plotlyLoading = null;
  function plotly() {
    if (window.Plotly) return Promise.resolve(window.Plotly);
    if (!plotlyLoading) {
      plotlyLoading = new Promise((resolve, reject) => {
        const s = document.createElement("script");
        s.src = "/vendor/plotly.min.js";
        s.async = true;
        s.onload = () => resolve(window.Plotly);
        s.onerror = () => { plotlyLoading = null; reject(new Error("the chart library did not load")); };
        document.head.appendChild(s);
      });
    }
    return plotlyLoading;
  }
  // Start fetching Plotly once the page has loaded (painted, its own scripts run): for pages that
  // draw a chart on load.
  function preload() {
    const start = () => setTimeout(() => plotly().catch(() => {}), 0);
    if (document.readyState === "complete") start(); else window.addEventListener("load", start, { once: true });
  }
  // Plotly.react once Plotly is there; resolves to the chart's element.
  async function plot(el, traces, layout) {
    const P = await plotly();
    const node = typeof el === "string" ? document.getElementById(el) : el;
    await P.react(node, traces, layout, plotConfig);
    return node;
  }
  // Whether `what` differs from what `key` was last drawn from (and remember it): a part of a page
  // whose data has not changed is not drawn again.
  const drawnFrom = {};
  function changed(key, what) {
    const sig = JSON.stringify(what);
    if (drawnFrom[key] === sig) return false;
    drawnFrom[key] = sig;
    return true;
  }
  // One more answer drawn (the tests wait on it).
  function drawn() {
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  }

  return { GiB, readState, writeState, query, api, clearErrors, showError, banner, openGroupsOf, debounce, pair, syncSlider, fmt, esc, derivationsHTML,
           plotConfig, plotly, preload, plot, drawn, changed };
})();
