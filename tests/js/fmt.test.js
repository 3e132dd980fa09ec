"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const path = require("node:path");
const {sig, F, figText, splitUnit, esc} = require("../../tscope_callbacks/render/static/js/fmt.js");

const CASES = require(path.join(__dirname, "format_cases.json")).cases;
const FN = {
  sig: (x) => sig(x), time: F.time, ms: F.ms, pct: F.pct, ratio: F.ratio, bytes: F.bytes, flops: F.flops, rate: F.rate,
  bw: F.bw, count: F.count, figure: (value, unit) => figText({value, unit}),
};

test("the shared format cases (the Python formatter passes the same)", () => {
  for (const [fn, args, want] of CASES) assert.equal(FN[fn](...args), want, fn + "(" + JSON.stringify(args) + ")");
});

test("no figure is ever printed with an exponent or as NaN", () => {
  for (const x of [1e-20, 6.939e-15, 1.5e-7, 1e21, 123456789012, -3e-9, NaN, Infinity, undefined]) {
    for (const f of [sig, F.ms, F.time, F.pct, F.bytes, F.flops, F.rate, F.bw, (v) => F.count(v, "x")]) {
      const t = f(x);
      assert.doesNotMatch(t, /e[+-]?\d|NaN|Infinity|undefined/, f.name + "(" + x + ") = " + t);
    }
  }
});

test("a figure without a value reads as a dash, whatever its unit", () => {
  for (const u of ["ms", "fraction", "bytes", "tokens/s", "W", ""]) {
    assert.equal(figText({value: null, unit: u}), "–");
    assert.equal(figText({unit: u}), "–");
  }
  assert.equal(figText(null), "–");
});

test("a card's value and unit split at the first space", () => {
  assert.deepEqual(splitUnit("18,832 tokens/s"), ["18,832", " tokens/s"]);
  assert.deepEqual(splitUnit("2.5 M tokens/s"), ["2.5", " M tokens/s"]);
  assert.deepEqual(splitUnit("58.3%"), ["58.3%", ""]);
});

test("shapes join dimensions with × and name a 0-d tensor", () => {
  assert.equal(F.shapes([[16, 64, 512], [512]]), "16×64×512, 512");
  assert.equal(F.shapes([[]]), "scalar");
  assert.equal(F.shapes([]), "");
  assert.equal(F.shapes("given"), "given");
});

test("text is escaped for HTML", () => {
  assert.equal(esc('<a href="x">&</a>'), "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;");
});
