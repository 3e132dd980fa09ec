"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const SE = require("../../tscope_callbacks/render/static/js/series.js");

test("MFU, step time and tokens/s always; samples/s when the run has no tokens", () => {
  assert.deepEqual(SE.chartSpecs({}).map((c) => c.id), ["mfu", "step_ms", "tokens_per_s"]);
  const s = SE.chartSpecs({samples_per_s: [[10, 200]]});
  assert.deepEqual(s.map((c) => c.label), ["MFU", "step time", "samples/s"]);
});

test("on a CPU the device-busy and idle lines equal host and data wait: drawn once, named for both", () => {
  const pts = [[10, 50], [20, 60]], wait = [[10, 1], [20, 2]];
  const c = SE.chartSpecs({"step/host_ms": pts, "step/device_busy_ms": pts, "step/data_wait_ms": wait, "step/idle_ms": wait})
    .find((x) => x.id === "step_breakdown");
  assert.deepEqual(c.lines.map((l) => l.name), ["data wait = idle", "host = device busy"]);
  /* on a GPU they differ: four lines */
  const g = SE.chartSpecs({"step/host_ms": pts, "step/device_busy_ms": [[10, 40], [20, 45]], "step/data_wait_ms": wait, "step/idle_ms": [[10, 9], [20, 8]]})
    .find((x) => x.id === "step_breakdown");
  assert.equal(g.lines.length, 4);
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
