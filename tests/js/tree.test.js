"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const T = require("../../tscope_callbacks/render/static/js/tree.js");

function report() {
  return {
    layers: [
      {path: "", type: "Net", forward_s: 0.01, backward_s: 0.02, self_forward_s: 0.001, self_backward_s: 0.002},
      {path: "blocks.10", type: "Block", forward_s: 0.002, backward_s: 0.004, self_forward_s: 0, self_backward_s: 0},
      {path: "blocks.2", type: "Block", forward_s: 0.003, backward_s: 0.006, self_forward_s: 0, self_backward_s: 0},
      {path: "blocks.2.fc", type: "Linear", forward_s: 0.003, backward_s: 0.006, self_forward_s: 0.003, self_backward_s: 0.006, nonfinite_grad_input: true},
    ],
    rows: {layer_phase: [
      {layer: "blocks.2.fc", phase: "forward", measured_s: 0.003, expected_s: 0.001},
      {layer: "blocks.2.fc", phase: "backward", measured_s: 0.006, expected_s: 0.002},
      {layer: "head", phase: "forward", measured_s: null, expected_s: 0.0005},
    ]},
    summary: {timed: true},
  };
}

test("paths become a tree under their longest known prefix, numbers in numeric order", () => {
  const root = T.buildTree(report());
  assert.deepEqual(root.kids.map((k) => k.path), ["head", "blocks.2", "blocks.10"]);
  assert.deepEqual(root.kids[1].kids.map((k) => k.path), ["blocks.2.fc"]);
  assert.equal(root.kids[0].info, null);  /* a row's layer without a record still gets a node */
});

test("layer times: the hooks' self and total when timed; expected kernel times, summed up the tree, when not", () => {
  const root = T.buildTree(report());
  const fc = root.kids[1].kids[0];
  assert.deepEqual(T.nodeTimes(fc, false), {fs: 0.003, bs: 0.006, ft: 0.003, bt: 0.006});
  const head = root.kids[0];
  assert.deepEqual(T.nodeTimes(head, false), {fs: 0, bs: 0, ft: null, bt: null});  /* timed, nothing timed in it */
  /* an estimate: nothing timed; the rows' expected times, children included (never the hooks' zeros) */
  const est = report();
  est.summary.timed = false;
  for (const x of est.rows.layer_phase) x.measured_s = null;
  const exp = T.nodeTimes(T.buildTree(est), true);
  assert.equal(exp.fs, 0);
  assert.ok(Math.abs(exp.ft - 0.0015) < 1e-12 && Math.abs(exp.bt - 0.002) < 1e-12, JSON.stringify(exp));
});

test("a full bar is the step (or the largest child when more)", () => {
  const root = T.buildTree(report());
  assert.ok(Math.abs(T.treeScale(root, false) - 0.03) < 1e-12);
  assert.deepEqual(T.barTimes(root.kids[1], false), {f: 0.003, b: 0.006});
});

test("the table opens level by level while it stays short", () => {
  const chain = (depth, width) => {
    const mk = (d) => ({kids: d ? Array.from({length: width}, () => mk(d - 1)) : []});
    return mk(depth);
  };
  assert.equal(T.openDepth([chain(4, 2)], 120, 100), 3);  /* 1 + 2 + 4 + 8 rows */
  assert.equal(T.openDepth([chain(4, 10)], 120, 100), 2);  /* 1 + 10 + 100 = 111; the next level is 1,000 */
  assert.equal(T.openDepth([chain(2, 500)], 120, 100), 1);  /* 500 children: the first level opens (100 shown) */
  assert.equal(T.topRows({kids: [{path: "model"}], info: null})[0].path, "model");
});

test("non-finite flags by name", () => {
  assert.deepEqual(T.nanFlags(report().layers[3]), ["grad_input"]);
  assert.deepEqual(T.nanFlags(null), []);
});
