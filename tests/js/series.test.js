"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const SE = require("../../tscope_callbacks/render/static/js/series.js");

test("MFU, step time and tokens/s always; samples/s when the run has no tokens", () => {
  assert.deepEqual(SE.chartSpecs({}).map((c) => c.id), ["mfu", "step_ms", "tokens_per_s"]);
  const s = SE.chartSpecs({samples_per_s: [[10, 200]]});
  assert.deepEqual(s.map((c) => c.label), ["MFU", "step time", "samples/s"]);
});

test("the device view on a GPU: busy, idle and sync, each a line", () => {
  const pts = [[10, 5], [20, 6]];
  const c = SE.chartSpecs({"step/device_busy_ms": pts, "step/idle_ms": pts, "step/device_sync_ms": pts}).find((x) => x.id === "step_device");
  assert.deepEqual(c.lines.map((l) => l.name), ["device busy", "device idle", "device sync"]);
  assert.equal(SE.chartSpecs({}).find((x) => x.id === "step_device"), undefined);  /* a CPU run has none */
});

test("GPU telemetry charts when the run has them, each with its unit", () => {
  const c = SE.chartSpecs({"gpu/power_w": [[1, 300], [2, 310]], "gpu/sm_clock_mhz": [[1, 1980]]});
  assert.deepEqual(c.slice(3).map((x) => x.id), ["power", "sm_clock"]);
  assert.equal(SE.FORMATS.clock(1980), "1.98 GHz");
  assert.equal(SE.FORMATS.watt(310), "310 W");
  assert.equal(SE.FORMATS.ms(54.38), "54.4 ms");
});

test("a chart of no point, of one step, or over the run", () => {
  assert.equal(SE.chartState({lines: [{pts: []}]}), "none");
  assert.equal(SE.chartState({lines: [{pts: [[10, 1]]}, {pts: [[10, 2]]}]}), "one");
  assert.equal(SE.chartState({lines: [{pts: [[10, 1], [20, 2]]}]}), "ok");
  assert.deepEqual(SE.alertsOf({alerts: [[5, "spike"]]}), [[5, "spike"]]);
  assert.deepEqual(SE.alertsOf({}), []);
});

test("the step monitor's parts of a step: one line each, in the order a step runs", () => {
  const pts = (v) => [[10, v], [20, v + 1]];
  const c = SE.chartSpecs({"step/other_ms": pts(1), "step/fetch_ms": pts(2), "step/forward_ms": pts(20), "step/backward_ms": pts(40)})
    .find((x) => x.id === "step_parts");
  assert.deepEqual(c.lines.map((l) => l.name), ["fetch", "forward", "backward", "other"]);
  assert.equal(c.lines[1].key, "step/forward_ms");
});

test("parts that stay under 2% of the largest part are named under the chart, not drawn", () => {
  const pts = (v) => [[10, v], [20, v]];
  const c = SE.chartSpecs({"step/fetch_ms": pts(0.3), "step/forward_ms": pts(15), "step/backward_ms": [[10, 29], [20, 31]],
    "step/hooks_ms": [[10, 0.1], [20, 0.7]], "step/other_ms": pts(0.61)}).find((x) => x.id === "step_parts");
  /* 2% of backward's 31 ms peak: 0.62 ms; hooks reach 0.7 ms once: drawn */
  assert.deepEqual(c.lines.map((l) => l.name), ["forward", "backward", "hooks"]);
  assert.equal(c.note, "not drawn, under 2% of the largest part at every point: fetch, other");
  const all = SE.chartSpecs({"step/fetch_ms": pts(0), "step/other_ms": pts(0)}).find((x) => x.id === "step_parts");
  assert.deepEqual(all.lines.map((l) => l.name), ["fetch", "other"]);
  assert.equal(all.note, null);
});

test("per-rank charts: a line per rank (in rank order), and the late rank named at each point", () => {
  const ranks = {step_ms: {"10": [[5, 60]], "2": [[5, 50]], "0": [[5, 40]]}, sync_ms: {"0": [[5, 9]]},
    late_rank: [[5, 10]], late_cost_ms: [[5, 12]]};
  const c = SE.rankSpecs(ranks);
  assert.deepEqual(c.map((x) => x.id), ["rank_step_ms", "rank_sync_ms", "late_rank"]);
  assert.deepEqual(c[0].lines.map((l) => l.name), ["rank 0", "rank 2", "rank 10"]);
  assert.deepEqual(c[2].lines[0].names, ["rank 10 late"]);
  assert.deepEqual(SE.rankSpecs(undefined), []);
  assert.equal(SE.chartSpecs({ranks}).filter((x) => x.id.startsWith("rank")).length, 2);
});
