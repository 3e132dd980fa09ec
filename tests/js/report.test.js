"use strict";
const test = require("node:test");
const assert = require("node:assert/strict");
const R = require("../../tscope_callbacks/render/static/js/report.js");

const fig = (value, unit, basis) => ({value, unit, basis: basis || "the basis"});

function report(over) {
  return Object.assign({
    header: {step_ms: fig(54.38, "ms", "median of 10 unprofiled steps"), estimated_step_ms: fig(34, "ms"), mfu: fig(0.583, "fraction"),
      mbu: fig(0.141, "fraction"), hfu: fig(0.588, "fraction"), tokens_per_s: fig(18832, "tokens/s"), samples_per_s: fig(294.2, "samples/s"),
      memory_peak_bytes: fig(30671492, "bytes"), flop_coverage: fig(1, "fraction")},
    summary: {timed: true}, memory: {fits: true, share: 0.00121, device_bytes: 23.5 * 2 ** 30, verdict: "fits"},
    device: {name: "CPU", peaks: {fp32: 93.2e9, bf16: 40e9, fp8: 1e12}, bandwidth: 25.7e9, measured: true},
    roofs: [{precision: "fp32", matrix: true, peak_flops: 95.1e9, bandwidth: 38e9}, {precision: "fp32", matrix: false, peak_flops: 93.2e9, bandwidth: 38e9}],
  }, over || {});
}

const byId = (cards) => Object.fromEntries(cards.map((c) => [c.id, c]));

test("the cards show the header's figures with their bases", () => {
  const c = byId(R.cards(report()));
  assert.equal(c.step_time.text, "54.4 ms");
  assert.equal(c.step_time.sub, "median of 10 unprofiled steps");
  assert.equal(c.mfu.text, "58.3%");
  assert.equal(c.tokens_per_s.label, "Tokens/s");
  assert.equal(c.tokens_per_s.text, "18,832 tokens/s");
  assert.equal(c.memory.text, "29.3 MiB");
  assert.equal(c.memory.sub, "fits · 0.121% of 23.5 GiB");
  assert.equal(c.flop_coverage.cls, null);
});

test("a step without tokens shows samples/s; a coverage under 90% is flagged", () => {
  const r = report();
  r.header.tokens_per_s = fig(null, "tokens/s");
  r.header.flop_coverage = fig(0.85, "fraction");
  const c = byId(R.cards(r));
  assert.equal(c.tokens_per_s.label, "Samples/s");
  assert.equal(c.tokens_per_s.text, "294 samples/s");
  assert.equal(c.flop_coverage.cls, "bad");
});

test("an unmeasured memory peak says which step has the layer details", () => {
  const r = report();
  r.header.memory_peak_bytes = fig(null, "bytes", "needs layer details");
  assert.equal(byId(R.cards(r, 10)).memory.sub, "not measured in this step: step 10 has the layer details");
  assert.equal(byId(R.cards(r, null)).memory.sub, "not measured in this step (needs layer details)");
  assert.equal(byId(R.cards(r, null)).memory.text, "–");
});

test("an estimate shows its expected step time and the MFU at it, labelled so", () => {
  const r = report({summary: {timed: false, estimated_mfu: 0.31, estimated_mbu: 0.2, estimated_hfu: 0.32}});
  r.header.step_ms = fig(null, "ms");
  r.header.mfu = fig(null, "fraction", "model FLOPs / step time");
  const c = byId(R.cards(r));
  assert.equal(c.step_time.label, "Step time (expected)");
  assert.equal(c.step_time.text, "34 ms");
  assert.equal(c.mfu.label, "MFU (expected)");
  assert.equal(c.mfu.text, "31%");
  assert.match(c.mfu.sub, /^at the expected step time: model FLOPs/);
});

test("the roofs drawn: the step's widened roofs, only its precisions, the device bandwidth kept apart", () => {
  const {peaks, bw} = R.roofsDrawn(report());
  assert.deepEqual(peaks, [["fp32", 95.1e9, 93.2e9]]);  /* bf16 and fp8: no op ran in them */
  assert.equal(bw, 38e9);
  assert.equal(R.deviceLine(report()), "CPU · measured roof · 38 GB/s (widened from 25.7 GB/s)");
  /* no ops: the device's own roofs, every precision */
  const none = R.roofsDrawn(report({roofs: []}));
  assert.deepEqual(none.peaks.map((p) => p[0]), ["fp8", "fp32", "bf16"]);
  assert.equal(none.bw, 25.7e9);
});

test("a row's time: measured in a timed step (0 where nothing was timed), else the expected kernel time", () => {
  assert.equal(R.timeOf({measured_s: 0.002, expected_s: 0.001}, true), 0.002);
  assert.equal(R.timeOf({measured_s: null, expected_s: 0.001}, true), 0);
  assert.equal(R.timeOf({measured_s: 0.002, expected_s: 0.001}, false), 0.001);
  assert.equal(R.timed({summary: {timed: true}}), true);
  assert.equal(R.timed({summary: {timed: false}, rows: {layer_phase: [{measured_s: 1}]}}), false);  /* the flag */
});

test("the time split: parts in order, the rest named by the device, the batch's fetch beside it", () => {
  const v = R.splitView(report({summary: {timing: "cpu"}, time_split: {compute_bound_s: 0.0396, memory_bound_s: 0.0078, communication_s: 0,
    uncounted_s: 0, overhead_s: 0.001, idle_s: 0.006, step_s: 0.0544, basis: "measured op time", input_s: 0.000875, input_bound: true},
  page: {input: "Input: each step spends 0.875 ms fetching its batch"}}));
  assert.deepEqual(v.parts.map((p) => p[0]), ["compute-bound", "memory-bound", "overhead", "outside ops (host: Python, hooks, data)"]);
  assert.equal(v.basis, "measured op time + the rest of the 54.4 ms step (median of the unprofiled steps)");
  assert.equal(v.input, "Input: each step spends 0.875 ms fetching its batch");  /* the text report's sentence */
  assert.equal(v.inputBound, true);
  /* ops scaled to the step: nothing is left beside them, and the basis promises no rest */
  const scaled = R.splitView(report({summary: {timing: "cpu"}, time_split: {compute_bound_s: 0.003, idle_s: 0, step_s: 0.003,
    basis: "measured op time, scaled x0.78 to the unprofiled step"}}));
  assert.equal(scaled.basis, "measured op time, scaled x0.78 to the unprofiled step, of the 3 ms step (median of the unprofiled steps)");
  const cuda = R.splitView(report({summary: {timing: "cuda-kernels"}, time_split: {idle_s: 0.001}}));
  assert.equal(cuda.parts[0][0], "no kernel running (gaps between kernels, waits for the host)");
});

test("memory parts: the states, saved activations, and the rest of the tracked peak as temporaries", () => {
  const v = R.memoryView(report({memory: {peak_bytes: 3e7, rest_bytes: 2.2e7, device_bytes: 2.5e10, fits: true,
    categories: {weights: 2e6, grads: 2e6, activations_saved: 2e7, step_tracked_peak: 2.2e7, temporaries: 5}}}));
  assert.deepEqual(v.parts.map((p) => [p[0], p[1]]), [["weights", 2e6], ["grads", 2e6], ["activations saved", 2e7], ["temporaries", 2e6]]);
  assert.match(v.basis, /^at the step's peak · fits the device/);
  assert.equal(v.device, "device memory 23.3 GiB; peak 28.6 MiB = 0.12%");
});

test("an opportunity: its saving, where, its change once, how it was predicted and what applying it measured", () => {
  const o = {saving_s: 0.0073, saving_frac: 0.12, layer: "features.3", op: "", title: "pool before the activation",
    cause: "ReLU before max-pooling runs on 4x the elements", change: "apply the ReLU after the pooling",
    predicted_by: "elements", predicted_text: "3.1 M elements fewer at 25.7 GB/s: 7.3 ms", measured_ratio: 0.93,
    measured_on: "applied in tscope's closed loop on CPU, the measured saving was 0.930x the predicted one (a CNN)"};
  const v = R.oppView(o);
  assert.equal(v.save, "−7.3 ms (12%)");
  assert.equal(v.where, "features.3");
  assert.equal(v.change, "apply the ReLU after the pooling");
  assert.equal(v.how, "3.1 M elements fewer at 25.7 GB/s: 7.3 ms");
  /* the closed loop's sentence names its ratio: said once (it read "1.210x the predicted saving when ... (applied in
     tscope's closed loop on CPU, the measured saving was 1.210x the predicted one (...))") */
  assert.equal(v.measured, "applied in tscope's closed loop on CPU, the measured saving was 0.930x the predicted one (a CNN)");
  assert.equal(R.oppView(Object.assign({}, o, {measured_on: ""})).measured, "0.930x the predicted saving when this kind of change was applied");
  /* a change the cause already names is said once; no closed-loop figure: nothing claimed */
  const w = R.oppView(Object.assign({}, o, {cause: "x. Fix: apply the ReLU after the pooling.", measured_ratio: null}));
  assert.equal(w.change, null);
  assert.equal(w.measured, null);
  /* a step-wide finding is placed in the markdown report's words ("the model", "the input pipeline"), a layer-less
     one elsewhere at the root: "(root)", the root layer's one name */
  assert.equal(R.oppView(Object.assign({}, o, {layer: "", kind: "channels_last"})).where, "the model");
  assert.equal(R.oppView(Object.assign({}, o, {layer: "", kind: "input"})).where, "the input pipeline");
  assert.equal(R.oppView(Object.assign({}, o, {layer: "", kind: "fuse"})).where, "(root)");
});

test("communication and FSDP figures by their key's unit", () => {
  assert.equal(R.fmtKey("time_s", 0.0012), "1.2 ms");
  assert.equal(R.fmtKey("bytes", 2 ** 20), "1 MiB");
  assert.equal(R.fmtKey("busbw", 1.5e11), "150 GB/s");
  assert.equal(R.fmtKey("exposed_frac", 0.25), "25%");
  assert.equal(R.fmtKey("layers", {"a": 2}), "a ×2");
  assert.equal(R.fsdpFmt("memory", "peak", 2 ** 30), "1 GiB");
  assert.equal(R.fsdpFmt("time", "comm_s", 0.004), "4 ms");
  assert.equal(R.fsdpFmt("time", "fits", true), "yes");
});

test("rows below their roof with no known change: the largest recoverable first, the rest counted", () => {
  const r = {below_roof: [
    {layer: "a", phase: "forward", attained: 0.5, recoverable_s: 0.001, cause: "x"},
    {layer: "", phase: "optimizer", attained: 0.44, recoverable_s: 0.0011, cause: "y"},
    {layer: "b", phase: "backward", attained: 0.3, recoverable_s: 0.0002},
    {layer: "c", phase: "backward", attained: 0.9, recoverable_s: null}]};
  const v = R.belowRoofView(r, 2);
  assert.deepEqual(v.items.map((x) => x.text), ["(root) optimizer (44% of roof, 1.1 ms over expected)", "a forward (50% of roof, 1 ms over expected)"]);
  assert.equal(v.more, 2);
  assert.equal(R.belowRoofView({}), null);
});

test("a finding's `code` is cut out of its text, backticks dropped; an unpaired backtick stays text", () => {
  assert.deepEqual(R.codeSpans("use `torch.optim.AdamW(params, ..., fused=True)` instead"),
    [["use ", false], ["torch.optim.AdamW(params, ..., fused=True)", true], [" instead", false]]);
  assert.deepEqual(R.codeSpans("`a` and `b`"), [["a", true], [" and ", false], ["b", true]]);
  assert.deepEqual(R.codeSpans("no code"), [["no code", false]]);
  assert.deepEqual(R.codeSpans("one ` tick"), [["one ` tick", false]]);
  assert.deepEqual(R.codeSpans(null), []);
});
