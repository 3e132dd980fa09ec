"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const ST = require("../../tscope_callbacks/render/static/js/steps.js");

const run = {run: "r", open: "train:10", steps: [
  {step: 10, stage: "train", readable: true, details: true},
  {step: 100, stage: "train", readable: true, details: false},
  {step: 150, stage: "train", readable: false, error: "bad", details: false},
  {step: 3, stage: "validation", readable: true, details: false},
]};

test("labels: stage, step, unreadable, estimate; the steps with layer details marked when not all have them", () => {
  assert.equal(ST.stepLabel(run.steps[0]), "step 10");
  assert.equal(ST.stepLabel(run.steps[2]), "step 150 (unreadable)");
  assert.equal(ST.stepLabel(run.steps[3]), "validation step 3");
  assert.equal(ST.stepLabel({step: 0, stage: "train", label: "estimate (no trained step)"}), "estimate (no trained step)");
  assert.equal(ST.optionLabel(run.steps[0], run.steps), "step 10 · layer details");
  assert.equal(ST.optionLabel(run.steps[1], run.steps), "step 100");
  assert.equal(ST.optionLabel(run.steps[0], [run.steps[0]]), "step 10");
});

test("the page opens on the step the index names; a step without layer details points to it", () => {
  assert.equal(ST.openStep(run).step, 10);
  assert.equal(ST.openStep({steps: run.steps, open: null}), null);
  assert.equal(ST.detailsStep(run, run.steps[1]).step, 10);
  assert.equal(ST.detailsStep(run, run.steps[0]), null);  /* itself */
  assert.equal(ST.detailsStep({steps: run.steps, open: "train:100"}, run.steps[3]), null);  /* no details there */
});

test("diff: every other step offered; before -> after, training first, then by step", () => {
  assert.deepEqual(ST.diffCandidates(run.steps, run.steps[0]).map(ST.stepValue), ["train:100", "train:150", "validation:3"]);
  const [a, b] = ST.diffOrder({stage: "train", step: 100}, {stage: "train", step: 10});
  assert.deepEqual([a.step, b.step], [10, 100]);
  assert.deepEqual(ST.diffOrder({stage: "validation", step: 3}, {stage: "train", step: 100}).map(ST.stepValue), ["train:100", "validation:3"]);
});

test("the fingerprint of a run's steps changes with a new step, readability or layer details", () => {
  const k = ST.stepsKey(run);
  assert.notEqual(ST.stepsKey({steps: run.steps.concat([{step: 200, stage: "train"}])}), k);
  assert.notEqual(ST.stepsKey({steps: run.steps.map((x) => Object.assign({}, x, {readable: true}))}), k);
  assert.equal(ST.stepsKey(null), "");
});
