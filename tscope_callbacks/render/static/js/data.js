/* The data layer: the same five queries in both modes.
   - TensorBoard (the TSCOPE tab): the plugin's routes, relative to the page (or window.TSCOPE_BASE):
     runs, step?run=&step=&stage=, ops?run=&step=&stage=&layer=, series?run=, diff?run=&a=&b=
   - standalone (one HTML file): the data inline, in JSON script elements of the page, each parsed when
     first needed (render/dashboard.py writes them: its docstring has the layout). */
"use strict";

const key = (run, stage, step) => run + "/" + stage + "/" + step;
const diffKey = (run, a, b) => run + "|" + a + "|" + b;

/** the ops of a step from their columnar form ({cols, rows, note}) or a plain list */
function unpackOps(o) {
  if (!o) return [];
  if (Array.isArray(o)) return o;
  const cols = o.cols;
  return o.rows.map((r) => { const x = {}; for (let i = 0; i < cols.length; i++) x[cols[i]] = r[i]; return x; });
}

/** the ops of `layer` and its sub-modules (all of them for an empty layer) */
const opsOf = (ops, layer) => layer == null || layer === "" ? ops :
  ops.filter((r) => r.layer === layer || (r.layer || "").startsWith(layer + "."));

function inlineJSON(doc, sel) {
  const el = doc.querySelector(sel);
  return el ? JSON.parse(el.textContent) : undefined;
}

/** the API over the data inline in `doc` (its #tscope-data element) */
function standaloneAPI(doc, INLINE) {
  const opsCache = {};
  const byAttr = (attr, k) => inlineJSON(doc, "script[" + attr + '="' + CSS.escape(k) + '"]');
  return {
    mode: "standalone",
    async runs() { return {runs: INLINE.runs || [], hint: INLINE.hint || null}; },
    async step(run, step, stage) {
      const k = key(run, stage, step);
      let d = (INLINE.steps || {})[k];
      if (d === undefined) d = byAttr("data-tscope-step", k);
      return d === undefined ? {error: "no step " + k + " in this file"} : d;
    },
    async ops(run, step, stage, layer) {
      const k = key(run, stage, step);
      if (!(k in opsCache)) {
        let o = (INLINE.ops || {})[k];
        if (o === undefined) o = byAttr("data-tscope-ops", k);
        opsCache[k] = {ops: unpackOps(o), note: o && o.note};
      }
      const all = opsCache[k];
      return {ops: opsOf(all.ops, layer), note: all.note};
    },
    async series(run) { return (INLINE.series || {})[run] || {}; },
    async diff(run, a, b) {
      const k = diffKey(run, a, b);
      let d = (INLINE.diffs || {})[k];
      if (d === undefined) d = byAttr("data-tscope-diff", k);
      return d === undefined ? {error: "this file holds no diff of " + a + " and " + b + " (`tscope diff A.json B.json` compares any two step files)"} : d;
    },
  };
}

/** the API over the TensorBoard plugin's routes */
function pluginAPI(base) {
  return {
    mode: "tensorboard",
    base: base || "",
    async get(path, params) {
      const q = params ? "?" + new URLSearchParams(params).toString() : "";
      const r = await fetch(this.base + path + q, {credentials: "same-origin"});
      if (!r.ok) return {error: "HTTP " + r.status + " from " + path};
      return r.json();
    },
    runs() { return this.get("runs"); },
    step(run, step, stage) { return this.get("step", {run, step, stage}); },
    ops(run, step, stage, layer) { return this.get("ops", {run, step, stage, layer: layer || ""}); },
    series(run) { return this.get("series", {run}); },
    diff(run, a, b) { return this.get("diff", {run, a, b}); },
  };
}

/** the page's API: standalone when the document carries its data, else the plugin's routes */
function makeAPI(doc, win) {
  const INLINE = inlineJSON(doc, "#tscope-data");
  return INLINE ? standaloneAPI(doc, INLINE) : pluginAPI(win.TSCOPE_BASE);
}

module.exports = {makeAPI, unpackOps, opsOf, key, diffKey};
