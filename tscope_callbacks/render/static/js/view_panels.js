/* The step's panels other than the roofline, the tree, the run charts and the diff: the warnings, the cards, the
   opportunities, the time split, memory, NaN / Inf and gradient spikes, communication, compiled vs eager, FSDP
   what-if, and the what-if device banner. Each draws one report (`r`) into its element of the skeleton. */
"use strict";
const {num, sig, F, figText, splitUnit} = require("./fmt.js");
const {$, h, clear} = require("./dom.js");
const R = require("./report.js");

/* the warnings the text report leads with (how far the times can be trusted), as the Python renderer wrote them
   (render/notes.py: served in the step's "page" section) */
function env(r) {
  const el = clear("#env");
  const w = ((r.page || {}).warnings) || [];
  if (!w.length) return;
  el.append(h("div", {class: "banner warn", id: "env-banner"}, h("b", {text: "How far these times can be trusted"}),
    h("ul", {}, w.map((x) => h("li", {"data-warning": x.kind, text: x.text})))));
}

function cards(r, details) {
  const c = clear("#cards");
  for (const k of R.cards(r, details)) {
    const [v, unit] = splitUnit(k.text);
    c.append(h("div", {class: "card" + (k.cls ? " " + k.cls : ""), "data-card": k.id, title: k.title},
      h("div", {class: "label", text: k.label}), h("div", {class: "value"}, v, unit ? h("span", {class: "unit", text: unit}) : null),
      h("div", {class: "sub", text: k.sub})));
  }
}

function opps(r) {
  const el = clear("#opps");
  const ops = r.opportunities || [];
  const H = r.header || {};
  $("#opps-basis").textContent = "predicted saving per step, re-estimated from the step's own ops; share of the " +
    (H.step_ms && num(H.step_ms.value) ? "measured step (" + H.step_ms.basis + ")" : "expected step");
  const below = R.belowRoofView(r, 3);
  const belowLine = () => below ? h("div", {class: "muted below-roof", id: "below-roof"}, "below their roof, no known change: ",
    below.items.flatMap((x, i) => [i ? "; " : "", h("span", {class: "mono", title: x.title || null, text: x.text})]),
    below.more ? "; " + below.more + " more" : "") : null;
  if (!ops.length) {
    el.append(h("div", {class: "empty", text: "no finding above the measured noise"}));
    if (below) el.append(belowLine());
    return;
  }
  const ol = h("ol", {class: "opps"});
  /* the markdown's `code` as code */
  const rich = (text) => R.codeSpans(text).map(([t, code]) => code ? h("code", {text: t}) : t);
  for (const o of ops.slice(0, 5)) {
    const v = R.oppView(o);
    ol.append(h("li", {class: "opp"},
      h("div", {}, h("span", {class: "save", text: v.save}), " ", h("b", {class: "mono", text: v.where}), " ", h("span", {}, ...rich(v.title))),
      v.change ? h("div", {class: "why"}, "change: ", ...rich(v.change)) : null,
      v.cause ? h("div", {class: "why"}, ...rich(v.cause)) : null,
      v.how ? h("div", {class: "how", "data-evidence": "predicted", text: "predicted from: " + v.how}) : null,
      v.measured ? h("div", {class: "how measured", "data-evidence": "measured", text: "checked: " + v.measured}) : null));
  }
  el.append(ol);
  const nm = ((r.noise || {}).marks || []).length;
  if (ops.length > 5) el.append(h("div", {class: "muted", text: (ops.length - 5) + " more, " + F.time(ops.slice(5).reduce((a, o) => a + (o.saving_s || 0), 0)) + " in all"}));
  if (nm) el.append(h("div", {class: "muted", text: nm + " row(s) marked as noise (no advice given for them)"}));
  if (below) el.append(belowLine());
}

/* a bar of parts and its key: [[label, value, colour]] */
function stacked(el, parts, fmt) {
  const total = parts.reduce((a, p) => a + (p[1] || 0), 0) || 1e-30;
  const bar = h("div", {class: "stack"}), kv = h("div", {class: "kv"});
  for (const [label, v, col] of parts) {
    if (!num(v) || v <= 0) continue;
    bar.append(h("div", {style: "width:" + (v / total * 100).toFixed(2) + "%;background:" + col, title: label + ": " + fmt(v)}));
    kv.append(h("span", {}, h("i", {style: "background:" + col}), label), h("span", {class: "n", text: fmt(v)}), h("span", {class: "n muted", text: F.pct(v / total)}));
  }
  el.append(bar, kv);
}

function split(r) {
  const el = clear("#split");
  const v = R.splitView(r);
  $("#split-basis").textContent = v.basis;
  if (!v.parts.length) { el.append(h("div", {class: "empty", text: "no timed ops in this step"})); return; }
  stacked(el, v.parts, F.time);
  if (v.input) el.append(h("div", {class: "input-wait" + (v.inputBound ? " flag" : ""), id: "split-input"}, v.input));
}

function memory(r) {
  const el = clear("#mem");
  const v = R.memoryView(r);
  $("#mem-basis").textContent = v.basis;
  if (!v.parts.length) { el.append(h("div", {class: "empty", text: "memory not recorded in this step"})); return; }
  stacked(el, v.parts, F.bytes);
  if (v.device) el.append(h("div", {class: "muted", text: v.device}));
}

function nan(r) {
  const el = clear("#nan");
  const ev = r.nonfinite || [];
  $("#nan-basis").textContent = "non-finite outputs or gradients per layer, and the op and source line where known; gradient spikes: the global norm over the median of the checked steps before it";
  spikes(el, r.grad_spikes || []);
  if (!ev.length) { el.prepend(h("div", {class: "empty", text: "no NaN / Inf in this step"})); return; }
  const tb = h("table", {class: "t", id: "nan-table"});
  tb.append(h("tr", {}, ["step", "kind", "layer", "op", "phase", "line"].map((c) => h("th", {text: c}))));
  for (const e of ev) tb.append(h("tr", {}, h("td", {text: e.step != null ? e.step : ""}), h("td", {class: "flag", text: e.kind || ""}),
    h("td", {class: "mono", text: e.layer || ""}), h("td", {class: "mono", text: e.op || ""}), h("td", {text: e.phase || ""}),
    h("td", {class: "mono muted", style: "white-space:normal", text: e.line || ""})));
  el.prepend(h("div", {class: "scroll"}, tb));
}

function spikes(el, sp) {
  if (!sp.length) { el.append(h("div", {class: "empty", text: "no gradient spike up to this step"})); return; }
  const tb = h("table", {class: "t", id: "spike-table"});
  tb.append(h("tr", {}, [["step"], ["layer that grew most"], ["norm / median", 1], ["layer / its median", 1], ["norm", 1], ["median", 1], ["loss", 1]]
    .map(([c, n]) => h("th", {class: n ? "n" : null, text: c}))));
  for (const x of sp) tb.append(h("tr", {class: "spike", "data-step": x.step},
    h("td", {text: x.step != null ? x.step : ""}), h("td", {class: "mono", text: x.layer == null ? "–" : (x.layer || "(root)")}),
    h("td", {class: "n flag", text: num(x.ratio) ? sig(x.ratio) + "x" : "–"}), h("td", {class: "n", text: num(x.layer_ratio) ? sig(x.layer_ratio) + "x" : "–"}),
    h("td", {class: "n", text: sig(x.norm)}), h("td", {class: "n", text: sig(x.median)}), h("td", {class: "n", text: sig(x.loss)})));
  el.append(h("h2", {text: "Gradient spikes (" + sp.length + ")", style: "margin-top:8px"}), h("div", {class: "scroll", style: "max-height:200px"}, tb));
}

function compiled(r) {
  const p = $("#cve-panel"), el = clear("#cve");
  const rows = r.compiled_vs_eager || [];
  p.style.display = rows.length ? "" : "none";
  if (!rows.length) return;
  const tb = h("table", {class: "t", id: "cve-table"});
  tb.append(h("tr", {}, ["layer", "compiled ms", "eager ms", "speedup", "% of roof", "ops compiled / eager"].map((c, i) => h("th", {class: i ? "n" : null, text: c}))));
  for (const x of rows.slice(0, 40)) tb.append(h("tr", {"data-layer": x.layer, class: x.layer === "(total)" ? "total" : null},
    h("td", {class: "mono", text: x.layer}), h("td", {class: "n", text: num(x.compiled_ms) ? sig(x.compiled_ms) : "–"}),
    h("td", {class: "n", text: num(x.eager_ms) ? sig(x.eager_ms) : "–"}),
    h("td", {class: "n " + (num(x.speedup) ? (x.speedup >= 1 ? "chg-good" : "chg-bad") : ""), text: num(x.speedup) ? sig(x.speedup) + "x" : "–"}),
    h("td", {class: "n", text: F.pct(x.compiled_pct_of_roof)}), h("td", {class: "n muted", text: (x.compiled_ops != null ? x.compiled_ops : "–") + " / " + (x.eager_ops != null ? x.eager_ops : "–")})));
  if (rows.length > 40) tb.append(h("tr", {}, h("td", {colspan: 6, class: "muted", text: (rows.length - 40) + " more layers"})));
  el.append(h("div", {class: "scroll", style: "max-height:320px"}, tb));
}

function fsdp(r) {
  const p = $("#fsdp-panel"), el = clear("#fsdp");
  const w = r.fsdp_whatif;
  p.style.display = w ? "" : "none";
  if (!w) return;
  $("#fsdp-basis").textContent = "this step's per-GPU memory, collectives and step time, modelled under FSDP2 over " + w.n + " GPUs" +
    (w.shard_size && w.shard_size !== w.n ? " (HSDP: shard groups of " + w.shard_size + ")" : "") +
    (w.link ? " on " + w.link + (num(w.link_bandwidth) ? " (" + F.bw(w.link_bandwidth) + ")" : "") : "") + "; an estimate, not a measurement";
  const wrap = h("div", {class: "grid3"});
  el.append(wrap);
  for (const [sect, title, id] of [["memory", "memory per GPU", "fsdp-memory"], ["time", "step time per GPU", "fsdp-time"]]) {
    const obj = w[sect];
    if (!obj || typeof obj !== "object") continue;
    const box = h("div", {class: "kv", id, style: "grid-template-columns:auto auto"});
    for (const [k, v] of Object.entries(obj)) if (k !== "basis" && (v == null || typeof v !== "object"))
      box.append(h("span", {text: k.replace(/_s$/, "").replace(/_/g, " ")}), h("span", {class: "n", "data-key": k, text: R.fsdpFmt(sect, k, v)}));
    wrap.append(h("div", {}, h("h2", {text: title, style: "margin-top:6px"}), box, obj.basis ? h("div", {class: "muted", text: obj.basis}) : null));
  }
  const tb = h("table", {class: "t", id: "fsdp-comm"});
  tb.append(h("tr", {}, ["collective", "calls", "bytes"].map((c, i) => h("th", {class: i ? "n" : null, text: c}))));
  for (const [k, v] of Object.entries(w.comm || {})) if (v && typeof v === "object")
    tb.append(h("tr", {}, h("td", {text: k.replace(/_/g, " ")}), h("td", {class: "n", text: sig(v.calls)}), h("td", {class: "n", text: F.bytes(v.bytes)})));
  wrap.append(h("div", {}, h("h2", {text: "collectives per step", style: "margin-top:6px"}), tb));
}

function whatIf(r) {
  const el = clear("#whatif");
  const w = r.what_if, est = (r.header || {}).estimated_step_ms;
  if (!w) return;
  el.append(h("div", {class: "banner hint", id: "whatif-banner", "data-measured-on": w.measured_on, "data-roofs-of": w.roofs_of,
    text: "What-if: the times were measured on " + w.measured_on + " and are placed on the roofs of " + w.roofs_of +
      ". MFU and % of roof read the step as if it had run on " + w.roofs_of + " at the measured speed; the expected times are " + w.roofs_of + "'s" +
      (est && num(est.value) ? " (expected step there: " + figText(est) + ", " + est.basis + ")" : "") + "."}));
}

function comm(r) {
  const p = $("#comm-panel"), el = clear("#comm");
  const c = r.communication;
  p.style.display = c ? "" : "none";
  if (!c) return;
  const rows = c.rows || [];
  if (rows.length) {
    const cols = [["collective", "collective"], ["group", "group"], ["group_size", "ranks"], ["calls", "calls"], ["bytes", "bytes"],
      ["time_s", "time"], ["roof_s", "at link roof"], ["algbw", "algbw"], ["busbw", "busbw"], ["pct_of_link", "% of link"], ["layers", "launched from"]];
    const tb = h("table", {class: "t", id: "comm-table"});
    tb.append(h("tr", {}, cols.map(([, l], i) => h("th", {class: i >= 2 && i <= 9 ? "n" : null, text: l}))));
    for (const row of rows.slice(0, 50)) tb.append(h("tr", {}, cols.map(([k], i) => h("td", {class: i >= 2 && i <= 9 ? "n" : k === "layers" ? "mono muted" : null, text: R.fmtKey(k, row[k])}))));
    el.append(h("div", {class: "basis", text: "per collective and process group; algbw = bytes / time, busbw = bytes on each rank's link / time (nccl-tests)"}), tb);
  }
  for (const [name, obj] of [["overlap with compute (device timeline)", c.overlap], ["rank skew", c.skew]]) {
    if (!obj || typeof obj !== "object") continue;
    const kv = h("div", {class: "kv", style: "grid-template-columns:auto auto;max-width:420px;margin-top:6px"});
    for (const [k, v] of Object.entries(obj)) if (v == null || typeof v !== "object")
      kv.append(h("span", {text: k.replace(/_s$/, "").replace(/_frac$/, " share").replace(/_/g, " ")}), h("span", {class: "n", text: R.fmtKey(k, v)}));
    el.append(h("h2", {text: name, style: "margin-top:8px"}), kv);
  }
}

module.exports = {env, cards, opps, split, memory, nan, compiled, fsdp, whatIf, comm, stacked};
