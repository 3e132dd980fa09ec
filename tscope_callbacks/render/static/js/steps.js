/* A run's profiled steps: their labels, the one the page opens on, what the "diff with" list offers. Pure.
   A step entry (the runs index): {step, stage, readable, error, details, label}; `details`: the step has layer
   details (per-layer memory and shapes, from LayerProfilerCallback). */
"use strict";

const stepValue = (st) => st.stage + ":" + st.step;

/** the entry of `v` ("stage:step") in `steps` */
const findStep = (steps, v) => steps.find((x) => stepValue(x) === v) || null;

function stepLabel(st) {
  if (st.label) return st.label;
  return (st.stage === "train" ? "" : st.stage + " ") + "step " + st.step + (st.readable === false ? " (unreadable)" : "");
}

/** the label in the step selector: with "· layer details" on the steps that have them, when not all do */
function optionLabel(st, steps) {
  const ok = steps.filter((x) => x.readable !== false);
  const some = ok.some((x) => x.details) && !ok.every((x) => x.details);
  return stepLabel(st) + (some && st.details ? " · layer details" : "");
}

/** the entry of the step a run opens on: the runs index's `open` ("<stage>:<step>", chosen in Python: the latest
    training step with layer details, else the latest step; render/dashboard.py open_step), or null */
const openStep = (run) => run && run.open ? findStep(run.steps, run.open) : null;

/** the step with layer details a step without them points to: the one the run opens on, when it has them */
function detailsStep(run, cur) {
  const o = openStep(run);
  return o && o.details && stepValue(o) !== stepValue(cur) ? o : null;
}

/** the steps "diff with" offers beside `cur`: every other step (unreadable ones listed, disabled) */
const diffCandidates = (steps, cur) => steps.filter((x) => stepValue(x) !== stepValue(cur));

/** before -> after: the earlier step first (by stage order of the index, then step) */
function diffOrder(a, b) {
  if (a.stage === b.stage) return a.step <= b.step ? [a, b] : [b, a];
  return a.stage === "train" ? [a, b] : b.stage === "train" ? [b, a] : a.stage < b.stage ? [a, b] : [b, a];
}

/** a fingerprint of a run's steps (what changed between two polls of the runs index) */
const stepsKey = (run) => run ? run.steps.map((x) => stepValue(x) + ":" + (x.readable !== false) + ":" + !!x.details).join(",") : "";

module.exports = {stepValue, stepLabel, optionLabel, openStep, detailsStep, findStep, diffCandidates, diffOrder, stepsKey};
