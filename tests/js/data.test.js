"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const D = require("../../tscope_callbacks/render/static/js/data.js");

test("columnar ops unpack to objects; a list stays a list", () => {
  const ops = D.unpackOps({cols: ["i", "op", "layer"], rows: [[0, "aten.mm", "fc"], [1, "aten.add", "fc.act"]], note: null});
  assert.deepEqual(ops[1], {i: 1, op: "aten.add", layer: "fc.act"});
  assert.deepEqual(D.unpackOps([{i: 0}]), [{i: 0}]);
  assert.deepEqual(D.unpackOps(undefined), []);
});

test("a layer's ops are its own and its sub-modules' (not a sibling sharing its prefix)", () => {
  const ops = [{layer: "fc"}, {layer: "fc.act"}, {layer: "fc2"}, {layer: ""}];
  assert.deepEqual(D.opsOf(ops, "fc").map((o) => o.layer), ["fc", "fc.act"]);
  assert.equal(D.opsOf(ops, "").length, 4);
});

test("the keys of the inline data are the ones the Python page builder writes", () => {
  assert.equal(D.key("tiny/version_0", "train", 200), "tiny/version_0/train/200");
  assert.equal(D.diffKey("tiny/version_0", "train:10", "train:200"), "tiny/version_0|train:10|train:200");
  const py = fs.readFileSync(path.join(__dirname, "../../tscope_callbacks/render/dashboard.py"), "utf8");
  assert.ok(py.includes("f\"{run}/{stage}/{step}\""), "step key");
  assert.ok(py.includes("f\"{r['run']}|{sa}:{na}|{sb}:{nb}\""), "diff key");
});

test("every module but the page's entry loads in node (no DOM needed until it draws)", () => {
  const dir = path.join(__dirname, "../../tscope_callbacks/render/static/js");
  for (const f of fs.readdirSync(dir).filter((f) => f.endsWith(".js") && f !== "main.js")) {
    assert.doesNotThrow(() => require(path.join(dir, f)), f);
  }
});
