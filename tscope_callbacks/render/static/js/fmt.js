/* Numbers as the page shows them: every figure with its unit, one convention per quantity (the same text as the
   report's Python formatter prints: tests/js/format_cases.json holds the shared cases). Pure. */
"use strict";

/** a finite number (not null, NaN or ±Infinity) */
const num = (x) => typeof x === "number" && isFinite(x);

/** `x` to `n` significant digits, trailing zeros dropped; 1000 and above: a rounded integer with thousands commas;
    below 1e-6 in magnitude "0" (float noise, such as a total minus its parts: never an exponent) */
function sig(x, n) {
  n = n || 3;
  if (!num(x)) return "–";
  if (Math.abs(x) < 1e-6) return "0";
  if (Math.abs(x) >= 1000) return Math.round(x).toLocaleString("en-US");
  return String(parseFloat(x.toPrecision(n)));
}

/** `x` in the largest of `units` (each `base` times the last) that keeps it at or above 1 */
function scaled(x, units, base) {
  if (!num(x)) return "–";
  let i = 0, v = x;
  while (Math.abs(v) >= base && i < units.length - 1) { v /= base; i++; }
  return sig(v) + " " + units[i];
}

const F = {
  /** seconds as s / ms / µs / ns */
  time(sec) {
    if (!num(sec)) return "–";
    const a = Math.abs(sec);
    if (a < 1e-12) return "0 ms";  /* 0, or float noise (a total minus its parts): never "0.00694 ns" */
    if (a >= 1) return sig(sec) + " s";
    if (a >= 1e-3) return sig(sec * 1e3) + " ms";
    if (a >= 1e-6) return sig(sec * 1e6) + " µs";
    return sig(sec * 1e9) + " ns";
  },
  /** seconds as a bare number of milliseconds (a table column headed "ms") */
  ms(sec) { return num(sec) ? sig(sec * 1e3) : "–"; },
  /** a fraction as a percentage */
  pct(r) { return !num(r) ? "–" : r !== 0 && Math.abs(r) < 1e-4 ? "<0.01%" : sig(r * 100) + "%"; },
  /** a ratio near 1 keeps its digits (1.005x, 0.996x), where three significant figures would read "1x" */
  ratio(x) { return !num(x) ? "–" : (x >= 0.1 && x < 10 ? x.toFixed(3) : sig(x)) + "x"; },
  /** bytes in binary units (KiB, MiB, GiB: what allocators and nvidia-smi show) */
  bytes(b) { return scaled(b, ["B", "KiB", "MiB", "GiB", "TiB"], 1024); },
  flops(f) { return scaled(f, ["FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"], 1000); },
  rate(f) { return scaled(f, ["FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s"], 1000); },
  /** bandwidth in decimal units (GB/s, as datasheets quote it) */
  bw(b) { return scaled(b, ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"], 1000); },
  /** a count with its unit; a million and above scaled (2.5 M tokens/s) */
  count(x, unit) {
    if (!num(x)) return "–";
    const u = unit ? " " + unit : "";
    if (Math.abs(x) >= 1e6) return scaled(x, ["", "k", "M", "G", "T"], 1000).trim() + u;
    return sig(x) + u;
  },
  intensity(x) { return num(x) ? sig(x) + " FLOP/B" : "–"; },
  /** tensor shapes: [[16, 64], [64]] -> "16×64, 64" (a 0-d tensor: "scalar") */
  shapes(sh) {
    if (!sh || !sh.length) return "";
    if (typeof sh === "string") return sh;
    return sh.map((x) => Array.isArray(x) ? (x.length ? x.join("×") : "scalar") : String(x)).join(", ");
  },
};

/** a header figure ({value, unit, basis}) as the page shows it: value and unit */
function figText(fig) {
  if (!fig || !num(fig.value)) return "–";
  const v = fig.value, u = fig.unit;
  if (u === "ms") return F.time(v / 1e3);
  if (u === "s") return F.time(v);
  if (u === "ratio" || u === "fraction") return F.pct(v);
  if (u === "B" || u === "bytes") return F.bytes(v);
  if (u === "TFLOP/s") return F.rate(v * 1e12);
  if (u === "FLOP/s") return F.rate(v);
  if (u === "B/s") return F.bw(v);
  if (u === "tokens/s" || u === "samples/s") return F.count(v, u);
  return sig(v) + (u ? " " + u : "");
}

/** "5,157 tokens/s" -> ["5,157", " tokens/s"]: the number and its unit apart (a card shows the unit small) */
function splitUnit(txt) {
  const i = txt.indexOf(" ");
  return i < 0 ? [txt, ""] : [txt.slice(0, i), txt.slice(i)];
}

/** text safe inside HTML */
const esc = (t) => String(t).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));

module.exports = {num, sig, scaled, F, figText, splitUnit, esc};
