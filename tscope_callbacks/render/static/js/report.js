/* Reading one step report (the StepReport dict) into what the page shows: the cards, the roofs drawn, the time
   split, the memory parts, an opportunity. Pure: data in, plain objects out (the views draw them). */
"use strict";
const {num, sig, F, figText} = require("./fmt.js");

/** the step's ops were timed: the report's own flag (false: an estimate, whose times are expected kernel times) */
const timed = (r) => !!((r || {}).summary || {}).timed;

/** a row's (or an op's) time, analysis/basis.py's time_of: measured when the step was timed (0 for a row nothing was
    timed in), else the expected kernel time */
const timeOf = (x, isTimed) => isTimed ? (num(x.measured_s) ? x.measured_s : 0) : x.expected_s;

/** the step time figure: the measured one, else the expected one ({fig, estimated}) */
function stepFigure(r) {
  const H = r.header || {};
  const measured = H.step_ms && num(H.step_ms.value);
  return {fig: measured ? H.step_ms : H.estimated_step_ms, estimated: !measured};
}

/** The header cards: [{id, label, text, sub, title, cls}]. `details`: the step that has the layer details this
    step lacks (its memory card says where the peak was measured), or null. */
function cards(r, details) {
  const H = r.header || {}, mem = r.memory || {}, sm = r.summary || {};
  const out = [];
  const card = (id, label, fig, sub, cls) => {
    const basis = (fig && fig.basis) || "";
    out.push({id, label, text: typeof fig === "string" ? fig : figText(fig), sub: sub != null ? sub : basis,
      title: basis || sub || "", cls: cls || null});
  };
  const {fig: stepFig, estimated} = stepFigure(r);
  card("step_time", "Step time" + (estimated ? " (expected)" : ""), stepFig,
    estimated ? "no measured step: " + ((stepFig && stepFig.basis) || "") : null);
  /* an estimate has no measured step: its MFU is the one at the expected step time, labelled so */
  for (const [id, label, key] of [["mfu", "MFU", "estimated_mfu"], ["mbu", "MBU", "estimated_mbu"], ["hfu", "HFU", "estimated_hfu"]]) {
    const fig = H[id];
    const est = estimated && !(fig && num(fig.value)) && num(sm[key]) ?
      {value: sm[key], unit: "fraction", basis: "at the expected step time: " + ((fig && fig.basis) || "")} : null;
    card(id, label + (est ? " (expected)" : ""), est || fig);
  }
  const tokens = H.tokens_per_s && num(H.tokens_per_s.value);
  card("tokens_per_s", tokens ? "Tokens/s" : "Samples/s", tokens ? H.tokens_per_s : H.samples_per_s);
  const peak = H.memory_peak_bytes;
  if (peak && num(peak.value)) {
    const fits = mem.fits;
    const verdict = fits === true ? "fits" : fits === false ? "does NOT fit" : (mem.verdict || "device memory unknown");
    card("memory", "Memory peak", peak, verdict + (num(mem.device_bytes) ? " · " + F.pct(mem.share) + " of " + F.bytes(mem.device_bytes) : "") +
      (mem.verdict && !["fits", "does not fit"].includes(mem.verdict) && fits != null ? " · " + mem.verdict : ""),
    fits === false ? "bad" : null);
  } else {
    card("memory", "Memory peak", peak, "not measured in this step" +
      (details != null ? ": step " + details + " has the layer details" : " (needs layer details)"));
  }
  const cov = H.flop_coverage;
  card("flop_coverage", "FLOP coverage", cov, null, cov && num(cov.value) && cov.value < 0.9 ? "bad" : null);
  return out;
}

/** [[precision, peak drawn, device peak]] (highest first) and the bandwidth drawn: the report's roofs (what the ops
    were placed on, widened where an op beat a measured roof); without roofs (no ops), the device's own. Only the
    precisions the step ran in are drawn (a device's fp8 peak is no roof of a bf16 step). */
function roofsDrawn(r) {
  const dev = r.device || {}, used = {};
  let bw = 0;
  for (const x of r.roofs || []) {
    if (num(x.bandwidth) && x.bandwidth > bw) bw = x.bandwidth;
    if (x.matrix && num(x.peak_flops) && x.peak_flops > (used[x.precision] || 0)) used[x.precision] = x.peak_flops;
  }
  const ran = new Set((r.roofs || []).map((x) => x.precision));
  const peaks = Object.entries(dev.peaks || {}).filter(([p, v]) => num(v) && v > 0 && (!ran.size || ran.has(p)))
    .map(([p, v]) => [p, used[p] || v, v]).sort((a, b) => b[1] - a[1]);
  return {peaks, bw: bw || dev.bandwidth};
}

/** the device line of the page's bar: name, measured roof, the bandwidth drawn (and the one it was widened from) */
function deviceLine(r) {
  const dev = r.device || {}, bw = roofsDrawn(r).bw;
  return (dev.name || "device ?") + (dev.measured ? " · measured roof" : "") +
    (num(bw) ? " · " + F.bw(bw) + (num(dev.bandwidth) && Math.abs(dev.bandwidth - bw) > 1e-6 * bw ? " (widened from " + F.bw(dev.bandwidth) + ")" : "") : "");
}

const SPLIT = [["compute_bound_s", "compute-bound", "#1a73e8"], ["memory_bound_s", "memory-bound", "#e8710a"],
  ["communication_s", "communication", "#9334e6"], ["uncounted_s", "uncounted ops", "#d93025"], ["overhead_s", "overhead", "#80868b"],
  ["idle_s", "idle", "#dadce0"]];

/** "Where the step goes": {basis, parts: [[label, seconds, colour]], input: text|null, inputBound} (the parts add up
    to the measured step: the report's time_split; `input`, the step's time fetching its batch, is the text report's
    own sentence, served in the step's page section) */
function splitView(r) {
  const t = r.time_split || {};
  const cuda = /^cuda/.test((r.summary || {}).timing || "");
  const idle = cuda ? "no kernel running (gaps between kernels, waits for the host)" : "outside ops (host: Python, hooks, data)";
  const parts = SPLIT.map(([k, l, c]) => [k === "idle_s" ? idle : l, t[k], c]).filter((p) => num(p[1]) && p[1] > 0);
  /* "+ the rest" only when there is one: ops scaled to (or filling) the step leave nothing beside them */
  const step = num(t.step_s) ? F.time(t.step_s) + " step (median of the unprofiled steps)" : "";
  const basis = (t.basis || "") + (!step ? "" : num(t.idle_s) && t.idle_s > 0 ? " + the rest of the " + step : ", of the " + step);
  return {basis, parts, input: (r.page || {}).input || null, inputBound: !!t.input_bound};
}

const MEM_COLORS = ["#1a73e8", "#e8710a", "#188038", "#9334e6", "#d01884", "#12b5cb", "#80868b", "#f9ab00"];

/** "Memory by category": {basis, parts: [[label, bytes, colour]], device: text|null}: the states, then what the step
    held at its peak (saved activations, and the rest of the tracked peak as temporaries) */
function memoryView(r) {
  const m = r.memory || {}, H = r.header || {};
  const verdict = m.fits === true ? "fits the device" : m.fits === false ? "does NOT fit the device" : (m.verdict || "");
  const why = m.basis || (H.memory_peak_bytes || {}).basis;
  const basis = (num(m.peak_bytes) ? "at the step's peak" : "the model's states (no step peak measured in this step)") +
    (verdict ? " · " + verdict : "") + (why ? " · " + why : "");
  const C = m.categories || {};
  const cats = Object.entries(C).filter(([k, v]) => num(v) && v > 0 && !/peak|created|^temporaries$/.test(k));
  if (num(m.rest_bytes) && num(C.activations_saved)) {
    const other = m.rest_bytes - C.activations_saved;
    if (other > 0) cats.push(["temporaries", other]);
  } else if (num(C.temporaries) && C.temporaries > 0) cats.push(["temporaries", C.temporaries]);
  return {basis, parts: cats.map(([k, v], i) => [k.replace(/_/g, " "), v, MEM_COLORS[i % MEM_COLORS.length]]),
    device: num(m.device_bytes) && num(m.peak_bytes) ? "device memory " + F.bytes(m.device_bytes) + "; peak " + F.bytes(m.peak_bytes) + " = " + F.pct(m.peak_bytes / m.device_bytes) : null};
}

/** one opportunity as listed: {save, where, title, change, cause, how, measured}: `how`, how its saving was
    predicted (the analysis' `predicted_text`: expected kernel time, bytes saved by fusion, elements skipped...);
    `measured`, where the project applied this kind of change (benchmarks/advice_effect.py) and measured the
    saving, the measured / predicted ratio and where it was measured */
/* where a finding without a layer applies: the words of the markdown report's (render/markdown.py _STEP_KINDS) */
const STEP_KINDS = {input: "the input pipeline", loop: "the training loop", launch: "the step", channels_last: "the model"};

function oppView(o) {
  const save = (num(o.saving_s) ? "−" + F.time(o.saving_s) : "–") + (num(o.saving_frac) ? " (" + F.pct(o.saving_frac) + ")" : "");
  const cause = o.cause && o.cause !== o.title ? o.cause : null;
  /* the cause may already end with the change ("... Fix: <change>. Saves ..."): said once */
  const change = o.change && !(o.cause || "").includes(o.change) ? o.change : null;
  const how = typeof o.predicted_text === "string" && o.predicted_text ? o.predicted_text : null;
  /* the closed loop's sentence already names its ratio ("applied in tscope's closed loop on CPU, the measured saving was
     1.21x the predicted one (...)"): said once, as the text report's "Checked:"; the bare ratio where it has none */
  const measured = !num(o.measured_ratio) ? null : o.measured_on ? o.measured_on
    : F.ratio(o.measured_ratio) + " the predicted saving when this kind of change was applied";
  return {save, where: (o.layer || STEP_KINDS[o.kind] || "(root)") + (o.op ? " · " + o.op : ""), title: o.title || o.cause || "", change, cause,
    how, measured, kind: o.predicted_by || null};
}

/** a finding's text as the markdown report writes it, cut into [text, isCode] runs: `code` between backticks
    (`torch.optim.AdamW(params, ..., fused=True)`) is code, shown as such, not with its backticks; an unpaired
    backtick stays text */
function codeSpans(text) {
  const parts = String(text == null ? "" : text).split("`");
  if (parts.length % 2 === 0) return [[parts.join("`"), false]];
  return parts.map((t, i) => [t, i % 2 === 1]).filter(([t]) => t !== "");
}

/** the rows below their roof with no known change (not opportunities: nothing to apply), largest recoverable time
    first: {text, title} of the first `top`, and how many more; null when none */
function belowRoofView(r, top) {
  const rows = (r.below_roof || []).slice().sort((a, b) => (b.recoverable_s || 0) - (a.recoverable_s || 0));
  if (!rows.length) return null;
  top = top || 3;
  const one = (x) => (x.layer || "(root)") + " " + x.phase + " (" + F.pct(x.attained) + " of roof" +
    (num(x.recoverable_s) ? ", " + F.time(x.recoverable_s) + " over expected" : "") + ")";
  return {items: rows.slice(0, top).map((x) => ({text: one(x), title: x.cause || ""})), more: Math.max(0, rows.length - top)};
}

/** a communication or overlap figure by its key's unit */
function fmtKey(k, v) {
  if (!num(v)) return v == null ? "–" : typeof v === "object" ? Object.entries(v).map(([a, n]) => a + " ×" + n).join(", ") : String(v);
  if (/_s$/.test(k)) return F.time(v);
  if (/bytes/.test(k)) return F.bytes(v);
  if (/frac|pct/.test(k)) return F.pct(v);
  if (/^(algbw|busbw|bandwidth)$/.test(k)) return F.bw(v);
  return sig(v);
}

/** an FSDP what-if figure of section `sect` ("memory" | "time") */
function fsdpFmt(sect, k, v) {
  if (typeof v === "string") return v;
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (v == null) return "–";
  if (k === "share" || k === "mfu" || /frac/.test(k)) return F.pct(Math.abs(v) < 1e-9 ? 0 : v);
  if (/_s$/.test(k)) return F.time(v);
  return sect === "memory" ? F.bytes(v) : sig(v);
}

module.exports = {timeOf, stepFigure, cards, roofsDrawn, deviceLine, splitView, memoryView, oppView, belowRoofView, fmtKey, fsdpFmt, timed, codeSpans, SPLIT};
