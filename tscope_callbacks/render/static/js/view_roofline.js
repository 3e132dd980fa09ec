/* The roofline panel: one point per layer x phase (and, with "ops", per op), the roofs drawn, their key, the
   tooltip; a click on a point lists its ops. */
"use strict";
const {num, F, esc} = require("./fmt.js");
const {$, h, s, clear} = require("./dom.js");
const {timeOf, timed: isTimed, roofsDrawn} = require("./report.js");
const {logScale, rooflineDomain, decadeLabel, roofPath, spreadCoincident, pointRadius} = require("./scale.js");

const PHASE_ORDER = ["forward", "backward", "recompute", "optimizer"];
const PHASE_COLOR = {forward: "var(--fwd)", backward: "var(--bwd)", optimizer: "var(--opt)", recompute: "var(--rec)"};
const phaseColor = (p) => PHASE_COLOR[p] || "var(--oth)";
const ROOF_COLORS = ["#3c4043", "#1a73e8", "#9334e6", "#e8710a", "#188038", "#d01884", "#80868b"];
const MEMORY_COLOR = "#3c4043", DEVICE_COLOR = "#80868b";

/** the points of rows with FLOPs, bytes and a time; {pts, skipped} */
function layerPoints(rows, timed) {
  const pts = [];
  let skipped = 0;
  for (const x of rows) {
    const t = timeOf(x, timed);
    if (!(x.flops > 0) || !(x.bytes > 0) || !(t > 0)) { skipped++; continue; }
    pts.push({row: x, ai: x.flops / x.bytes, perf: x.flops / t, t});
  }
  return {pts, skipped};
}

function opPoints(ops, timed) {
  const out = [];
  for (const o of ops || []) {
    const t = timeOf({measured_s: o.time_s, expected_s: o.expected_s}, timed);
    if (o.flops > 0 && o.bytes > 0 && t > 0) out.push({op: o, ai: o.flops / o.bytes, perf: o.flops / t, t});
  }
  return out;
}

function draw(ctx) {
  const S = ctx.S, r = S.rep;
  if (!r) return;
  const holder = clear("#roof-holder");
  const rows = (r.rows || {}).layer_phase || [];
  const {pts, skipped} = layerPoints(rows, isTimed(r));
  if (S.showOps && !S.opRows) {
    ctx.API.ops(S.run, S.step, S.stage, "").then((res) => { S.opRows = res.ops || []; S.opNote = res.note || null; draw(ctx); });
  }
  const opPts = S.showOps ? opPoints(S.opRows, isTimed(r)) : [];
  const dev = r.device || {};
  /* the roofs the ops were placed on are the ones drawn (so the drawn roof is the one "% of roof" uses); the
     device's own figures, where they differ, are drawn dashed */
  const {peaks, bw} = roofsDrawn(r), devBw = dev.bandwidth;
  const widened = num(devBw) && devBw > 0 && num(bw) && Math.abs(devBw - bw) > 1e-6 * bw;
  const W = Math.max(420, holder.clientWidth || 640), Hh = 400, m = {l: 84, r: 22, t: 10, b: 36};
  const dom = rooflineDomain(pts.concat(opPts), peaks, bw);
  const X = logScale(dom.x0, dom.x1, m.l, W - m.r), Y = logScale(dom.y0, dom.y1, Hh - m.b, m.t);
  const svg = s("svg", {id: "roofline", width: W, height: Hh, viewBox: "0 0 " + W + " " + Hh,
    "data-axes": JSON.stringify({x0: dom.x0, x1: dom.x1, y0: dom.y0, y1: dom.y1, left: m.l, right: W - m.r, top: m.t, bottom: Hh - m.b})});
  const grid = s("g", {class: "grid"}), axis = s("g", {class: "axis"});
  for (let e = dom.x0; e <= dom.x1; e++) {
    const px = X(10 ** e);
    grid.append(s("line", {x1: px, x2: px, y1: m.t, y2: Hh - m.b}));
    axis.append(s("text", {x: px, y: Hh - m.b + 14, "text-anchor": "middle"}, decadeLabel(e)));
  }
  for (let e = dom.y0; e <= dom.y1; e++) {
    const py = Y(10 ** e);
    grid.append(s("line", {x1: m.l, x2: W - m.r, y1: py, y2: py}));
    axis.append(s("text", {x: m.l - 6, y: py + 4, "text-anchor": "end"}, F.rate(10 ** e).replace(" ", "\u2009")));
  }
  axis.append(s("line", {x1: m.l, x2: W - m.r, y1: Hh - m.b, y2: Hh - m.b}), s("line", {x1: m.l, x2: m.l, y1: m.t, y2: Hh - m.b}));
  axis.append(s("text", {x: (m.l + W - m.r) / 2, y: Hh - 4, "text-anchor": "middle"}, "arithmetic intensity (FLOP / byte)"));
  svg.append(grid, axis);
  svg.append(s("defs", {}, s("clipPath", {id: "roof-clip"}, s("rect", {x: m.l, y: m.t, width: W - m.l - m.r, height: Hh - m.t - m.b}))));
  const roofs = s("g", {"clip-path": "url(#roof-clip)"});
  /* the roofs' names go into a key under the chart (on the chart they sat under the points) */
  const stale = $("#roof-keys");
  if (stale) stale.remove();
  const keys = h("div", {class: "legend roof-keys", id: "roof-keys"});
  const keyLine = (col, dash, txt, attrs) => h("span", Object.assign({}, attrs || {}),
    h("b", {class: "swatch", style: "border-top:2px " + (dash ? "dashed " : "solid ") + col}), txt);
  if (num(bw)) {
    peaks.forEach(([prec, pk, devPk], i) => {
      const col = ROOF_COLORS[1 + i % (ROOF_COLORS.length - 1)];  /* [0]: the memory roof's */
      roofs.append(s("path", {class: "roof", d: roofPath(X, Y, dom, bw, pk), stroke: col, "data-precision": prec, "data-peak": pk, "data-bandwidth": bw}));
      let txt = prec + " " + F.rate(pk);
      if (num(devPk) && devPk !== pk) {
        roofs.append(s("path", {class: "roof-device", d: "M" + X(devPk / bw) + "," + Y(devPk) + " L" + X(10 ** dom.x1) + "," + Y(devPk),
          stroke: col, "stroke-dasharray": "5 3", "data-precision": prec, "data-peak": devPk}));
        txt += " (widened from " + F.rate(devPk) + ", dashed)";
      }
      keys.append(keyLine(col, false, txt, {"data-precision": prec}));
    });
    if (widened) {
      const top = peaks.length ? peaks[0][1] : 10 ** dom.x1 * devBw;
      roofs.append(s("path", {class: "roof-device", "data-bandwidth": devBw, stroke: DEVICE_COLOR, "stroke-dasharray": "5 3", d: roofPath(X, Y, dom, devBw, null, top)}));
    }
    if (peaks.length) {  /* the shared memory slope, drawn over the roofs' own in the key's colour */
      roofs.append(s("path", {class: "roof-memory", stroke: MEMORY_COLOR, "data-bandwidth": bw, d: roofPath(X, Y, dom, bw, null, Math.max(...peaks.map((p) => p[1])))}));
    }
    keys.prepend(keyLine(MEMORY_COLOR, false, "memory " + F.bw(bw), {id: "roof-key-memory", "data-bandwidth": bw}));
    if (widened) keys.append(keyLine(DEVICE_COLOR, true, (dev.measured ? "measured " : "datasheet ") + F.bw(devBw) + " (not used: an op beat it)", {id: "roof-key-device", "data-bandwidth": devBw}));
  }
  svg.append(roofs);
  const g = s("g", {"clip-path": "url(#roof-clip)"});
  const tmax = Math.max(1e-30, ...pts.map((p) => p.t));
  pts.sort((a, b) => b.t - a.t);
  spreadCoincident(pts, (p) => [X(p.ai), Y(p.perf)]);
  for (const p of pts) {
    const c = s("circle", {class: "pt", cx: (X(p.ai) + (p.dx || 0)).toFixed(1), cy: (Y(p.perf) + (p.dy || 0)).toFixed(1),
      r: pointRadius(p.t, tmax, 2.5, 13).toFixed(1), fill: phaseColor(p.row.phase), "data-layer": p.row.layer, "data-phase": p.row.phase,
      "data-same": p.same ? p.same.length : null});
    c.__row = p.row;
    c.__same = p.same || null;
    if (S.selLayer != null && p.row.layer === S.selLayer) c.classList.add("sel");
    g.append(c);
  }
  svg.append(g);
  svg.addEventListener("mousemove", (e) => { const t = e.target; if (t.__row) showTip(e, t.__row, false, t.__same); else if (t.__op) showTip(e, t.__op, true); else hideTip(); });
  svg.addEventListener("mouseleave", hideTip);
  svg.addEventListener("click", (e) => { const t = e.target; if (t.__row) ctx.showLayerOps(t.__row.layer, t.__row.phase); });
  holder.append(svg);
  const legend = clear("#roof-legend");
  const present = new Set(pts.map((p) => p.row.phase));
  const phases = PHASE_ORDER.filter((ph) => present.has(ph)).concat([...present].filter((ph) => !PHASE_ORDER.includes(ph)).sort());
  for (const ph of phases) legend.append(h("span", {class: "phase-key", "data-phase": ph}, h("i", {style: "background:" + phaseColor(ph)}), ph));
  legend.append(h("span", {class: "muted", text: "size: time · " + pts.length + " layer×phase points" + (skipped ? " (" + skipped + " rows without FLOPs or bytes not drawn)" : "")}));
  $("#roof-basis").textContent = "y: FLOPs / " + (isTimed(r) ? "measured time" : "expected kernel time (untimed step)") +
    "; roofs: " + (dev.measured ? "measured on this machine" : "datasheet peaks") + " per precision, bandwidth " + F.bw(bw) +
    (widened ? " (widened from the " + (dev.measured ? "measured " : "datasheet ") + F.bw(devBw) + ": see the note above)" : "") +
    "; % of roof is against these roofs. Click a point for its ops.";
  legend.before(keys);
  if (opPts.length) {
    const frag = document.createDocumentFragment();
    for (const p of opPts) {
      const c = s("circle", {class: "op-pt", cx: X(p.ai).toFixed(1), cy: Y(p.perf).toFixed(1), r: pointRadius(p.t, tmax, 1.5, 6).toFixed(1), fill: phaseColor(p.op.phase)});
      c.__op = p.op;
      frag.append(c);
    }
    g.insertBefore(frag, g.firstChild);
    legend.append(h("span", {class: "muted", text: "· " + opPts.length + " op points" + (S.opNote ? " (" + S.opNote + ")" : "")}));
  }
}

function tipRows(pairs) {
  return "<table>" + pairs.filter((p) => p[1] != null && p[1] !== "").map((p) => "<tr><td>" + esc(p[0]) + "</td><td>" + esc(p[1]) + "</td></tr>").join("") + "</table>";
}

function showTip(e, x, isOp, same) {
  const tip = $("#tooltip");
  const t = isOp ? x.time_s : x.measured_s;
  const name = isOp ? x.op : (x.layer || "(root)");
  tip.innerHTML = "<div class='t'>" + esc(name) + "</div>" + tipRows([
    ["type", isOp ? x.category : x.type], ["layer", isOp ? x.layer : null], ["phase", x.phase],
    ["FLOPs", F.flops(x.flops)], ["bytes", F.bytes(x.bytes)],
    ["intensity", F.intensity(x.bytes ? x.flops / x.bytes : null)],
    ["measured", num(t) ? F.ms(t) + " ms" : "untimed"], ["expected", F.ms(x.expected_s) + " ms"],
    ["% of roof", F.pct(x.pct_of_roof)], ["bound", x.bound], ["precision", x.precision],
    ["shapes", isOp ? F.shapes(x.input_shapes) : null]]) +
    (same && same.length > 1 ? "<div class='same'>" + same.length + " layers here: " + same.map((q) => esc((q.layer || "(root)") + " " + q.phase)).join(", ") + "</div>" : "");
  tip.style.display = "block";
  const w = tip.offsetWidth, hh = tip.offsetHeight;
  let lx = e.clientX + 14, ly = e.clientY + 12;
  if (lx + w > window.innerWidth - 4) lx = e.clientX - w - 14;
  if (ly + hh > window.innerHeight - 4) ly = e.clientY - hh - 12;
  tip.style.left = lx + "px"; tip.style.top = ly + "px";
}

function hideTip() { $("#tooltip").style.display = "none"; }

/** mark the points of `layer` as selected (null: none) */
function select(layer) {
  document.querySelectorAll("svg#roofline circle.pt").forEach((c) => c.classList.toggle("sel", layer != null && !!c.__row && c.__row.layer === layer));
}

module.exports = {draw, select, hideTip, phaseColor};
