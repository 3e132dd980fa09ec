"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const S = require("../../tscope_callbacks/render/static/js/scale.js");

test("log and linear scales map their domain's ends onto the range", () => {
  const X = S.logScale(-2, 2, 84, 618);
  assert.equal(X(0.01), 84);
  assert.equal(X(100), 618);
  assert.equal(X(1), 351);
  const Y = S.logScale(8, 12, 364, 10);  /* y grows upwards: the range runs backwards */
  assert.equal(Y(1e8), 364);
  assert.equal(Y(1e12), 10);
  const L = S.linScale(10, 300, 58, 410);
  assert.equal(L(10), 58);
  assert.equal(L(155), 234);
});

test("the roofline's decades cover the points, the ridge (1/100 to 4x) and the roof with room", () => {
  /* ridge 95.1e9 / 38e9 = 2.5 FLOP/B: x from 10^floor(log10(0.025)) = 0.01 to 10^ceil(log10(10)) = 10 at least, and
     to the points' 46 -> 100; y from 10^floor(log10(6e7 / 2)) to 10^ceil(log10(95.1e9 x 1.5 = 1.4e11)) */
  const d = S.rooflineDomain([{ai: 0.08, perf: 6e7}, {ai: 46, perf: 8e10}], [["fp32", 95.1e9]], 38e9);
  assert.deepEqual(d, {x0: -2, x1: 2, y0: 7, y1: 12});
  /* nothing to draw: two decades at least on each axis */
  assert.deepEqual(S.rooflineDomain([], [], null), {x0: -1, x1: 2, y0: 8, y1: 13});
  const one = S.rooflineDomain([{ai: 5, perf: 1e9}], [], null);
  assert.ok(one.x1 - one.x0 >= 2 && one.y1 - one.y0 >= 2);
});

test("decade labels: plain from 0.01 to 1000, else 1eN", () => {
  assert.deepEqual([-3, -2, 0, 3, 4].map(S.decadeLabel), ["1e-3", "0.01", "1", "1000", "1e4"]);
});

test("a roof: the memory slope to the ridge, then flat; the slope clipped three decades under the axis", () => {
  const X = (v) => Math.log10(v), Y = (v) => Math.log10(v);
  const dom = {x0: -2, x1: 2, y0: 7, y1: 11};
  const d = S.roofPath(X, Y, dom, 1e10, 1e11);
  assert.equal(d, "M-2,8 L1,11 L2,11");  /* 0.01 FLOP/B x 1e10 B/s = 1e8; ridge at 10 FLOP/B */
  assert.equal(S.roofPath(X, Y, dom, 1e5, null, 1e11), "M-2,4 L6,11");  /* 1e3 < 1e4: clipped at 10^(7-3) */
});

test("points at one pixel are spread around it, each naming the group", () => {
  const pts = [{row: "a", x: 10, y: 10}, {row: "b", x: 10.2, y: 9.9}, {row: "c", x: 50, y: 50}];
  S.spreadCoincident(pts, (p) => [p.x, p.y], 5);
  assert.deepEqual(pts[0].same, ["a", "b"]);
  assert.equal(pts[0].dx, 5);
  assert.ok(Math.abs(pts[1].dx + 5) < 1e-9 && Math.abs(pts[1].dy) < 1e-9);
  assert.equal(pts[2].same, undefined);
});

test("a point's area grows with its time", () => {
  assert.equal(S.pointRadius(1, 1, 2.5, 13), 15.5);
  assert.equal(S.pointRadius(0.25, 1, 2.5, 13), 9);
  assert.equal(S.pointRadius(0, 1, 2.5, 13), 2.5);
});

test("a run chart's y axis starts at 0 (or below) and ends at a round tick at or above the highest point", () => {
  assert.deepEqual(S.chartDomain([[10, 40], [20, 50]]), {xa: 10, xb: 20, ya: 0, yb: 50, ticks: [0, 25, 50]});
  assert.deepEqual(S.chartDomain([[5, -1], [5, 2]]), {xa: 4, xb: 6, ya: -1, yb: 2, ticks: [-1, 0, 1, 2]});
});

test("round ticks: 1, 2, 2.5 or 5 x a power of ten, 2 to 5 intervals, the least room above the highest point", () => {
  /* a demo run's MFU, step time and tokens/s charts read 71.3% / 47.5% / 23.8% and 23,528 / 15,686 / 7,843 */
  assert.deepEqual(S.niceTicks(0, 0.66), [0, 0.25, 0.5, 0.75]);
  assert.deepEqual(S.niceTicks(0, 0.577), [0, 0.2, 0.4, 0.6]);
  assert.deepEqual(S.niceTicks(0, 57.7), [0, 20, 40, 60]);
  assert.deepEqual(S.niceTicks(0, 21785), [0, 5000, 10000, 15000, 20000, 25000]);
  assert.deepEqual(S.niceTicks(0, 0.0003), [0, 0.0001, 0.0002, 0.0003]);
  assert.deepEqual(S.niceTicks(0, NaN), [0, 1]);  /* never an axis of NaN labels */
  for (const [lo, hi] of [[0, 0.577], [0, 57.7], [0, 21785], [-3, 7], [0, 0.0003], [0, 1], [0, 9.99e9]]) {
    const t = S.niceTicks(lo, hi), st = t[1] - t[0];
    assert.ok(t[0] <= lo && t[t.length - 1] >= hi && t.length >= 3 && t.length <= 6, JSON.stringify([lo, hi, t]));
    const m = st / Math.pow(10, Math.floor(Math.log10(st) + 1e-9));
    assert.ok([1, 2, 2.5, 5].some((x) => Math.abs(m - x) < 1e-6), JSON.stringify([lo, hi, t]));
  }
});
