/* "Over the run": which charts a run's series make, and their lines. Pure. A series dict (the plugin's `series`
   route, dashboard.logdir.series): {key: [[step, value], ...], "alerts": [[step, text], ...]}. */
"use strict";
const {sig, F} = require("./fmt.js");

const FORMATS = {
  pct: F.pct,
  ms: (v) => F.time(v / 1e3),
  count: (v) => F.count(v, ""),
  joule: (v) => sig(v) + " J",
  watt: (v) => sig(v) + " W",
  clock: (v) => v >= 1000 ? sig(v / 1000) + " GHz" : sig(v) + " MHz",
};

/* the step monitor's device view (on a GPU): its busy time, its idle time, and under DDP its wait in collectives */
const DEVICE = [["step/device_busy_ms", "device busy", "#e8710a"], ["step/idle_ms", "device idle", "#80868b"],
  ["step/device_sync_ms", "device sync", "#d93025"]];
/* the step monitor's parts of a step (means per step over a logging interval; they add up to its step time) */
const PARTS = [["step/fetch_ms", "fetch", "#188038"], ["step/transfer_ms", "transfer", "#12b5cb"],
  ["step/forward_ms", "forward", "#1a73e8"], ["step/backward_ms", "backward", "#e8710a"],
  ["step/optimizer_ms", "optimizer", "#9334e6"], ["step/sync_ms", "sync", "#d93025"], ["step/hooks_ms", "hooks", "#f9ab00"],
  ["step/logging_ms", "logging", "#d01884"], ["step/checkpoint_ms", "checkpoint", "#5f6368"],
  ["step/tscope_ms", "tscope", "#3c4043"], ["step/other_ms", "other", "#80868b"]];
const SMALL_PART = 0.02;  /* a part of the step drawn only where it reaches this share of the largest part's peak */
const RANK_COLORS = ["#1a73e8", "#e8710a", "#188038", "#9334e6", "#d01884", "#12b5cb", "#f9ab00", "#80868b"];
const GPU = [["gpu/energy_j_per_token", "energy per token", "joule", "energy_per_token"],
  ["gpu/power_w", "power", "watt", "power"], ["gpu/sm_clock_mhz", "SM clock", "clock", "sm_clock"]];

/** The charts: [{id, label, fmt (a FORMATS key), lines: [{pts, name, color, key}]}]: MFU, step time and throughput
    always (tokens/s, or samples/s when the run has no tokens); the step monitor's parts of a step, its device view
    (GPU), GPU telemetry and its per-rank view when the run has them. */
function chartSpecs(ser) {
  ser = ser || {};
  const has = (k) => (ser[k] || []).length > 0;
  const thr = !has("tokens_per_s") && has("samples_per_s") ? ["samples_per_s", "samples/s"] : ["tokens_per_s", "tokens/s"];
  const out = [["mfu", "MFU", "pct"], ["step_ms", "step time", "ms"], [thr[0], thr[1], "count"]]
    .map(([k, label, fmt]) => ({id: k, label, fmt, lines: [{pts: ser[k] || []}]}));
  const split = PARTS.filter(([k]) => has(k)).map(([k, name, color]) => ({name, color, pts: ser[k], key: k}));
  if (split.length) {
    /* parts that never reach SMALL_PART of the largest part's peak are named under the chart, not drawn: eight lines
       near zero read as one grey band */
    const peak = (l) => Math.max(...l.pts.map((p) => p[1]));
    const top = Math.max(...split.map(peak));
    const small = top > 0 ? split.filter((l) => peak(l) < SMALL_PART * top) : [];
    const drawn = split.filter((l) => !small.includes(l));
    out.push({id: "step_parts", label: "where each step goes (mean per step, per log interval; the parts add up to the step)", fmt: "ms",
      lines: drawn.length ? drawn : split,
      note: small.length && drawn.length ? "not drawn, under " + (SMALL_PART * 100) + "% of the largest part at every point: " + small.map((l) => l.name).join(", ") : null});
  }
  const device = DEVICE.filter(([k]) => has(k)).map(([k, name, color]) => ({name, color, pts: ser[k], key: k}));
  if (device.length) out.push({id: "step_device", label: "the device per step (mean per log interval)", fmt: "ms", lines: device});
  for (const [k, label, fmt, id] of GPU) if (has(k)) out.push({id, label, fmt, lines: [{pts: ser[k]}]});
  out.push(...rankSpecs(ser.ranks));
  return out;
}

/** per-rank charts (the step monitor under DDP/FSDP: series "ranks"): each rank's step time and sync wait, one line
    per rank, and the late rank's cost at each logging step */
function rankSpecs(ranks) {
  if (!ranks || typeof ranks !== "object") return [];
  const out = [];
  const byRank = (obj) => Object.keys(obj || {}).sort((a, b) => +a - +b)
    .map((r, i) => ({name: "rank " + r, color: RANK_COLORS[i % RANK_COLORS.length], pts: obj[r] || [], key: "rank/" + r}));
  for (const [k, id, label] of [["step_ms", "rank_step_ms", "step time per rank"], ["sync_ms", "rank_sync_ms", "sync wait per rank"]]) {
    const lines = byRank(ranks[k]).filter((l) => l.pts.length);
    if (lines.length) out.push({id, label, fmt: "ms", lines});
  }
  const late = (ranks.late_cost_ms || []).length ? ranks.late_cost_ms : null;
  if (late) {
    const who = new Map((ranks.late_rank || []).map((p) => [p[0], p[1]]));
    out.push({id: "late_rank", label: "the late rank's cost per step", fmt: "ms",
      lines: [{pts: late, names: late.map((p) => who.has(p[0]) ? "rank " + who.get(p[0]) + " late" : "")}]});
  }
  return out;
}

/** a chart's state: "none" (no points), "one" (a single step: nothing to draw over the run) or "ok" */
function chartState(spec) {
  const all = spec.lines.flatMap((l) => l.pts);
  if (!all.length) return "none";
  return new Set(all.map((p) => p[0])).size < 2 ? "one" : "ok";
}

/** the anomaly alerts of the series, as [step, text] */
const alertsOf = (ser) => Array.isArray((ser || {}).alerts) ? ser.alerts : [];

module.exports = {chartSpecs, chartState, alertsOf, rankSpecs, FORMATS};
