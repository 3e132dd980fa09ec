/* The ops panel: a layer's ops in execution order (a click on a roofline point, a double click on a tree row). */
"use strict";
const {sig, F} = require("./fmt.js");
const {h, clear} = require("./dom.js");
const roofline = require("./view_roofline.js");

const COLS = ["#", "op", "phase", "FLOPs", "bytes", "FLOP/B", "ms", "expected ms", "% roof", "bound", "dtype", "input shapes"];
const MAX_ROWS = 2000;

function close(ctx) {
  clear("#ops-panel");
  ctx.S.selLayer = null;
  roofline.select(null);
}

/** list the ops of `layer` (the root's own ops for ""), of `phase` only unless "all phases" is ticked */
async function show(ctx, layer, phase) {
  const S = ctx.S;
  S.selLayer = layer;
  S.selPhase = phase || null;
  roofline.select(layer);
  const res = await ctx.API.ops(S.run, S.step, S.stage, layer);
  const p = clear("#ops-panel");
  /* the root's point is its own ops (an empty layer asks the API for every op) */
  const allOps = (res.ops || []).filter((o) => layer || !o.layer);
  const ops = S.selPhase && !S.allPhases ? allOps.filter((o) => o.phase === S.selPhase) : allOps;
  p.append(h("div", {class: "tools"},
    S.selPhase ? h("label", {}, h("input", {type: "checkbox", id: "ops-all-phases", checked: S.allPhases ? "" : null,
      onchange: (e) => { S.allPhases = e.target.checked; show(ctx, layer, phase); }}), "all phases (" + allOps.length + ")") : null,
    h("button", {onclick: () => close(ctx)}, "close")),
  h("h2", {text: "Ops of " + (layer || "(root)") + (S.selPhase && !S.allPhases ? " · " + S.selPhase : "") + " (" + ops.length + ")"}),
  h("div", {class: "basis", text: "in execution order; time measured per op, expected = shape-aware kernel time" + (res.note ? " · " + res.note : "")}));
  const tb = h("table", {class: "t", id: "ops-table"});
  tb.append(h("tr", {}, COLS.map((c, i) => h("th", {class: i >= 3 && i <= 8 ? "n" : null, text: c}))));
  for (const o of ops.slice(0, MAX_ROWS)) {
    tb.append(h("tr", {}, h("td", {class: "n muted", text: o.i}), h("td", {class: "mono", text: o.op}), h("td", {text: o.phase}),
      h("td", {class: "n", text: F.flops(o.flops)}), h("td", {class: "n", text: F.bytes(o.bytes)}),
      h("td", {class: "n", text: o.bytes ? sig(o.flops / o.bytes) : "–"}), h("td", {class: "n", text: F.ms(o.time_s)}),
      h("td", {class: "n", text: F.ms(o.expected_s)}), h("td", {class: "n", text: F.pct(o.pct_of_roof)}),
      h("td", {text: o.bound}), h("td", {text: o.dtype || ""}), h("td", {class: "mono muted", text: F.shapes(o.input_shapes)})));
  }
  if (!ops.length) tb.append(h("tr", {}, h("td", {colspan: COLS.length, class: "empty", text: "no ops recorded for this layer in this file"})));
  if (ops.length > MAX_ROWS) tb.append(h("tr", {}, h("td", {colspan: COLS.length, class: "muted", text: (ops.length - MAX_ROWS) + " more ops not listed"})));
  p.append(h("div", {class: "scroll"}, tb));
  p.scrollIntoView({block: "nearest"});
}

module.exports = {show, close};
