/* Chart geometry: log-log roofline axes, the roof lines, points that land on one spot, linear run charts. Pure. */
"use strict";
const {num} = require("./fmt.js");

/** a log10 axis mapping [10^d0, 10^d1] onto [r0, r1] (pixels; r1 < r0 for a y axis) */
function logScale(d0, d1, r0, r1) {
  return (v) => r0 + (Math.log10(v) - d0) / (d1 - d0) * (r1 - r0);
}

/** a linear axis mapping [d0, d1] onto [r0, r1] */
function linScale(d0, d1, r0, r1) {
  return (v) => r0 + (v - d0) / (d1 - d0) * (r1 - r0);
}

/** The roofline's decades: x (FLOP/B) spans the points and the ridge (from 1/100 to 4x it); y (FLOP/s) spans the
    points and the highest roof with room (x0.5, x1.5); each at least two decades. `pts`: [{ai, perf}]; `peaks`:
    [[precision, peak, ...]] highest first; `bw`: bandwidth drawn. */
function rooflineDomain(pts, peaks, bw) {
  let xs = pts.map((p) => p.ai), ys = pts.map((p) => p.perf);
  if (peaks.length) ys.push(peaks[0][1]);
  if (!xs.length) xs = [0.1, 100];
  if (!ys.length) ys = [1e9, 1e12];
  let x0 = Math.floor(Math.log10(Math.min(...xs))), x1 = Math.ceil(Math.log10(Math.max(...xs)));
  if (num(bw) && bw > 0 && peaks.length) {
    const ridge = peaks[0][1] / bw;
    x1 = Math.max(x1, Math.ceil(Math.log10(ridge * 4)));
    x0 = Math.min(x0, Math.floor(Math.log10(ridge / 100)));
  }
  let y0 = Math.floor(Math.log10(Math.min(...ys) * 0.5)), y1 = Math.ceil(Math.log10(Math.max(...ys) * 1.5));
  if (x1 - x0 < 2) x1 = x0 + 2;
  if (y1 - y0 < 2) y0 = y1 - 2;
  return {x0, x1, y0, y1};
}

/** an x axis label of decade e: plain between 0.01 and 1000, else 1eN */
const decadeLabel = (e) => e >= -2 && e <= 3 ? String(10 ** e) : "1e" + e;

/** the SVG path of a roof: the memory slope from x = 10^x0 (clipped below 10^(y0-3)) up to the ridge, then flat to
    x = 10^x1 (`peak` null: the slope alone, up to `top`) */
function roofPath(X, Y, dom, bw, peak, top) {
  const xa = 10 ** dom.x0, xb = 10 ** dom.x1;
  const start = "M" + X(xa) + "," + Y(Math.max(xa * bw, 10 ** (dom.y0 - 3)));
  if (peak == null) return start + " L" + X(top / bw) + "," + Y(top);
  return start + " L" + X(peak / bw) + "," + Y(peak) + " L" + X(xb) + "," + Y(peak);
}

/** points drawn at the same pixel (identical layers) are spread on a small circle around it, so each can be hovered;
    each gets `dx`, `dy` and `same` (the group's rows). `key(p)`: the pixel of p as [x, y]. */
function spreadCoincident(pts, key, radius) {
  radius = radius == null ? 5 : radius;
  const spots = new Map();
  for (const p of pts) {
    const [x, y] = key(p);
    const k = x.toFixed(0) + "," + y.toFixed(0);
    if (!spots.has(k)) spots.set(k, []);
    spots.get(k).push(p);
  }
  for (const grp of spots.values()) {
    if (grp.length < 2) continue;
    grp.forEach((p, i) => {
      const a = 2 * Math.PI * i / grp.length;
      p.dx = radius * Math.cos(a); p.dy = radius * Math.sin(a); p.same = grp.map((q) => q.row);
    });
  }
  return pts;
}

/** a point's radius: its area grows with its time (the largest `tmax` gets the largest) */
const pointRadius = (t, tmax, min, span) => min + span * Math.sqrt(Math.min(1, t / tmax));

/** round ticks from `lo` (<= 0) over `hi`: a step of 1, 2, 2.5 or 5 x a power of ten giving 2 to 5 intervals, the
    one whose last tick leaves the least room above `hi` (71.3% is drawn under a 75% tick, not as one), then the
    one nearest 3 intervals */
function niceTicks(lo, hi) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [0, 1];
  const span = hi - lo || Math.abs(hi) || 1;
  const p = Math.pow(10, Math.floor(Math.log10(span / 3)));
  let best = null;
  for (const k of [0.1, 1, 10]) {
    for (const m of [1, 2, 2.5, 5]) {
      const st = m * p * k, a = Math.floor(lo / st + 1e-9) * st, b = Math.ceil(hi / st - 1e-9) * st;
      const n = Math.round((b - a) / st);
      if (n < 2 || n > 5) continue;
      const better = !best || b - a < best.b - best.a - 1e-9 * span ||
        (Math.abs(b - a - (best.b - best.a)) <= 1e-9 * span && Math.abs(n - 3) < Math.abs(best.n - 3));
      if (better) best = {a, b, st, n};  /* on a tie, the count of intervals nearest 3 */
    }
  }
  if (!best) return [lo, hi];
  /* rounded to the step's own decimals: 0.1 + 0.2 reads 0.3 */
  const dp = Math.max(0, -Math.floor(Math.log10(best.st)) + 2);
  return Array.from({length: best.n + 1}, (_, i) => Number((best.a + i * best.st).toFixed(dp)));
}

/** a run chart's domain: x the steps, y from 0 (or below, for negative values) to a round tick at or above the
    largest point (its ticks: `niceTicks`) */
function chartDomain(points) {
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  let xa = Math.min(...xs), xb = Math.max(...xs);
  const ticks = niceTicks(Math.min(0, ...ys), Math.max(0, ...ys) || 1);
  if (xa === xb) { xa -= 1; xb += 1; }
  return {xa, xb, ya: ticks[0], yb: ticks[ticks.length - 1], ticks};
}

module.exports = {logScale, linScale, rooflineDomain, decadeLabel, roofPath, spreadCoincident, pointRadius, chartDomain, niceTicks};
