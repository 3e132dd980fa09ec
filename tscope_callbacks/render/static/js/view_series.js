/* "Over the run": line charts of the run's series (profiled steps, automatic windows, the step monitor) with the
   anomaly alerts marked. */
"use strict";
const {h, s, clear} = require("./dom.js");
const {linScale, chartDomain} = require("./scale.js");
const {chartSpecs, chartState, alertsOf, FORMATS} = require("./series.js");

async function draw(ctx) {
  const S = ctx.S;
  const ser = await ctx.API.series(S.run) || {};
  S.series = ser;
  const el = clear("#charts");
  const alerts = alertsOf(ser);
  const specs = chartSpecs(ser);
  for (const spec of specs) el.append(lineChart(spec, alerts));
  const states = specs.map(chartState);
  if (states.length && states.every((x) => x !== "ok")) {
    clear(el).append(h("div", {class: "empty", id: "series-few", text: (states.includes("one") ? "one profiled step in this run" : "no points in this run") + ": the charts over the run need 2 or more steps"}));
  }
  const box = clear("#alerts");
  if (alerts.length) {
    const ul = h("ul", {class: "alerts"});
    for (const [st, text] of alerts) ul.append(h("li", {class: "alert", "data-step": st}, h("b", {text: "step " + st + ": "}), h("span", {text})));
    box.append(h("h2", {text: "Anomaly alerts (" + alerts.length + ")", style: "margin-top:8px"}), ul);
  }
}

function lineChart(spec, alerts) {
  const fmt = FORMATS[spec.fmt];
  const W = 420, Hh = 150, m = {l: 58, r: 10, t: 8, b: 22};
  const box = h("div", {class: "chart", "data-series": spec.id});
  const all = spec.lines.flatMap((l) => l.pts);
  /* the last point and its step: the MFU chart's last point is the automatic window's, beside a card of the
     profiled step's MFU */
  const end = all.length ? all[all.length - 1] : null;
  const last = spec.lines.length === 1 && end ? " · last " + fmt(end[1]) + " (step " + end[0] + ")" : "";
  box.append(h("h3", {text: spec.label + last}));
  const state = chartState(spec);
  if (state === "none") { box.append(h("div", {class: "empty", text: "no points in this run"})); return box; }
  if (state === "one") {
    box.setAttribute("data-few", "1");
    box.append(h("div", {class: "empty", text: "one point (step " + all[0][0] + "): a chart over the run needs 2 or more steps"}));
    return box;
  }
  const d = chartDomain(all);
  const X = linScale(d.xa, d.xb, m.l, W - m.r), Y = linScale(d.ya, d.yb, Hh - m.b, m.t);
  const svg = s("svg", {width: "100%", viewBox: "0 0 " + W + " " + Hh, preserveAspectRatio: "none", style: "max-height:170px"});
  const g = s("g", {class: "grid"}), ax = s("g", {class: "axis"});
  for (const v of d.ticks) {
    g.append(s("line", {x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v)}));
    ax.append(s("text", {x: m.l - 5, y: Y(v) + 4, "text-anchor": "end"}, fmt(v)));
  }
  ax.append(s("text", {x: m.l, y: Hh - 5}, "step " + d.xa), s("text", {x: W - m.r, y: Hh - 5, "text-anchor": "end"}, "step " + d.xb));
  svg.append(g, ax);
  for (const [st, text] of alerts || []) {
    if (st < d.xa || st > d.xb) continue;
    const ln = s("line", {class: "alert-mark", "data-step": st, x1: X(st), x2: X(st), y1: m.t, y2: Hh - m.b});
    ln.append(s("title", {}, "step " + st + ": " + text));
    svg.append(ln);
  }
  for (const l of spec.lines) {
    const col = l.color || "#1a73e8";
    svg.append(s("path", {d: l.pts.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(""), fill: "none", stroke: col, "stroke-width": 1.5, "data-line": l.key || null}));
    l.pts.forEach((p, i) => {
      const c = s("circle", {cx: X(p[0]), cy: Y(p[1]), r: 2.5, fill: col});
      const note = l.names && l.names[i] ? " (" + l.names[i] + ")" : "";
      c.append(s("title", {}, (l.name ? l.name + ", " : "") + "step " + p[0] + ": " + fmt(p[1]) + note));
      svg.append(c);
    });
  }
  box.append(svg);
  if (spec.lines.length > 1) box.append(h("div", {class: "legend"}, spec.lines.map((l) => h("span", {}, h("i", {style: "background:" + l.color}), l.name))));
  if (spec.note) box.append(h("div", {class: "muted chart-note", text: spec.note}));
  return box;
}

module.exports = {draw};
