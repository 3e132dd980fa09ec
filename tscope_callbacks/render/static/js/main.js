/* tscope dashboard: one page, two data sources (the TensorBoard plugin's routes, or the data inline in the file:
   data.js). It renders the StepReport dict (schema "tscope.step_report") and what the Python side computed for the
   page (the step's "page" section, the diff); no network beyond the plugin's own relative routes; no library.
   The page's state lives here; each panel is a view module drawing one report. */
"use strict";
const {F, figText, esc} = require("./fmt.js");
const {$, h, clear} = require("./dom.js");
const {makeAPI} = require("./data.js");
const R = require("./report.js");
const ST = require("./steps.js");
const panels = require("./view_panels.js");
const roofline = require("./view_roofline.js");
const treeView = require("./view_tree.js");
const opsView = require("./view_ops.js");
const seriesView = require("./view_series.js");
const diffView = require("./view_diff.js");

const API = makeAPI(document, window);
const S = {runs: [], run: null, stage: "train", step: null, rep: null, cmp: null, showOps: false, selLayer: null};
const ctx = {S, API, showLayerOps: (layer, phase) => opsView.show(ctx, layer, phase)};
const NO_DIFF = "choose a step to compare in “diff with”";

function skeleton() {
  clear("#app").append(
    h("header", {class: "bar"},
      h("span", {class: "brand", html: "<b>tscope</b> dashboard"}),
      h("label", {}, "run", h("select", {id: "run-select", onchange: (e) => selectRun(e.target.value)})),
      h("label", {}, "step", h("select", {id: "step-select", onchange: (e) => selectStep(e.target.value)})),
      h("label", {}, "diff with", h("select", {id: "diff-select", onchange: (e) => selectDiff(e.target.value)})),
      h("span", {id: "device"})),
    h("div", {id: "banner"}), h("div", {id: "details-hint"}), h("div", {id: "env"}), h("div", {id: "whatif"}),
    h("section", {id: "cards"}),
    h("div", {class: "grid2"},
      h("div", {class: "panel", id: "roof-panel"},
        h("div", {class: "tools"},
          h("label", {}, h("input", {type: "checkbox", id: "show-ops", onchange: (e) => { S.showOps = e.target.checked; roofline.draw(ctx); }}), "ops")),
        h("h2", {text: "Roofline"}), h("div", {class: "basis", id: "roof-basis"}),
        h("div", {id: "roof-holder"}), h("div", {class: "legend", id: "roof-legend"})),
      h("div", {},
        h("div", {class: "panel", id: "opps-panel"}, h("h2", {text: "Top opportunities"}),
          h("div", {class: "basis", id: "opps-basis"}), h("div", {id: "opps"})),
        h("div", {class: "panel", id: "split-panel"}, h("h2", {text: "Where the step goes"}), h("div", {class: "basis", id: "split-basis"}), h("div", {id: "split"})))),
    h("div", {class: "panel", id: "ops-panel"}),
    h("div", {class: "panel", id: "tree-panel"},
      h("div", {class: "tools"}, h("button", {id: "tree-expand", onclick: () => treeView.all(ctx, true)}, "expand all"),
        h("button", {id: "tree-collapse", onclick: () => treeView.all(ctx, false)}, "collapse")),
      h("h2", {text: "Layers"}), h("div", {class: "basis", id: "tree-basis"}),
      h("div", {class: "scroll", id: "tree"})),
    h("div", {class: "grid2 even"},
      h("div", {class: "panel", id: "mem-panel"}, h("h2", {text: "Memory by category"}), h("div", {class: "basis", id: "mem-basis"}), h("div", {id: "mem"})),
      h("div", {class: "panel", id: "nan-panel"}, h("h2", {text: "NaN / Inf and gradient spikes"}), h("div", {class: "basis", id: "nan-basis"}), h("div", {id: "nan"}))),
    h("div", {class: "panel", id: "comm-panel", style: "display:none"}, h("h2", {text: "Communication"}), h("div", {id: "comm"})),
    h("div", {class: "panel", id: "cve-panel", style: "display:none"}, h("h2", {text: "Compiled vs eager"}),
      h("div", {class: "basis", text: "per layer: op time of the compiled step and of its eager reference; speedup = eager / compiled; % of roof of the compiled layer"}), h("div", {id: "cve"})),
    h("div", {class: "panel", id: "fsdp-panel", style: "display:none"}, h("h2", {text: "FSDP what-if"}), h("div", {class: "basis", id: "fsdp-basis"}), h("div", {id: "fsdp"})),
    h("div", {class: "panel", id: "series-panel"}, h("h2", {text: "Over the run"}),
      h("div", {class: "basis", text: "profiled steps and the callbacks' automatic windows; the step monitor's parts of a step, its device and per-rank views and GPU telemetry at its logging steps, when the run has them; red lines: anomaly alerts"}),
      h("div", {class: "charts", id: "charts"}), h("div", {id: "alerts"})),
    h("div", {class: "panel", id: "diff-panel"}, h("h2", {text: "Step diff"}), h("div", {id: "diff"}, h("div", {class: "empty", text: NO_DIFF}))),
    h("div", {id: "tooltip"}));
}

function banner(kind, html) {
  const b = clear("#banner");
  if (html) b.append(h("div", {class: "banner " + kind, html}));
}

const runOf = () => S.runs.find((r) => r.run === S.run) || {steps: []};
const cur = () => ({stage: S.stage, step: S.step});

/* ---------- selectors ---------- */
function fillSelectors() {
  const rs = clear("#run-select");
  for (const r of S.runs) rs.append(h("option", {value: r.run, text: r.run || "(logdir)"}));
  rs.value = S.run;
  const steps = runOf().steps, ss = clear("#step-select");
  for (const st of steps) ss.append(h("option", {value: ST.stepValue(st), text: ST.optionLabel(st, steps), disabled: st.readable === false ? "" : null}));
  ss.value = ST.stepValue(cur());
  fillDiff();
}

/* "diff with": the run's other steps (never the one shown); no diff at all for a run of one readable step */
function fillDiff() {
  const ds = clear("#diff-select"), now = ST.stepValue(cur());
  ds.append(h("option", {value: "", text: "—"}));
  const others = ST.diffCandidates(runOf().steps, cur());
  for (const st of others) ds.append(h("option", {value: ST.stepValue(st), text: ST.stepLabel(st), disabled: st.readable === false ? "" : null}));
  const one = !others.some((st) => st.readable !== false);
  ds.parentElement.style.display = one ? "none" : "";
  $("#diff-panel").style.display = one ? "none" : "";
  if (S.cmp && ST.stepValue(S.cmp) === now) S.cmp = null;
  ds.value = S.cmp ? ST.stepValue(S.cmp) : "";
}

async function selectRun(run) {
  S.run = run; S.cmp = null;
  diffView.empty(NO_DIFF);  /* the other run's diff is not this run's */
  const first = ST.openStep(runOf());
  if (first) { S.stage = first.stage; S.step = first.step; }
  fillSelectors();
  seriesView.draw(ctx);
  if (first) await loadStep();
}

async function selectStep(v) {
  const [stage, step] = v.split(":");
  S.stage = stage; S.step = +step;
  fillDiff();
  if (!S.cmp) selectDiff("");
  await loadStep();
}

async function selectDiff(v) {
  if (!v) { S.cmp = null; diffView.empty(NO_DIFF); return; }
  const [stage, step] = v.split(":");
  S.cmp = {stage, step: +step};
  /* before -> after: the earlier step first */
  const [a, b] = ST.diffOrder(cur(), S.cmp);
  const d = await API.diff(S.run, ST.stepValue(a), ST.stepValue(b));
  if (S.cmp && ST.stepValue(S.cmp) === v) diffView.draw(d);
}

async function loadStep() {
  performance.mark("tscope:load");
  S.opRows = null;
  const rep = await API.step(S.run, S.step, S.stage);
  S.selLayer = null;
  clear("#ops-panel");
  if (!rep || rep.error) {
    banner("err", esc((rep && rep.error) || "no data"));
    S.rep = null;
    return;
  }
  banner("", "");
  S.rep = rep;
  render();
}

/* a step without layer details says which step has them, with a button to show it */
function detailsHint() {
  const el = clear("#details-hint");
  const me = ST.findStep(runOf().steps, ST.stepValue(cur()));
  if (!me || me.details !== false) return null;
  const other = ST.detailsStep(runOf(), me);
  if (!other) return null;
  el.append(h("div", {class: "banner hint", id: "details-banner"},
    ST.stepLabel(me) + " has no layer details (per-layer memory, shapes, the step's memory peak); " + ST.stepLabel(other) + " has them. ",
    h("button", {id: "details-goto", onclick: () => { $("#step-select").value = ST.stepValue(other); selectStep(ST.stepValue(other)); }}, "show " + ST.stepLabel(other))));
  return other.step;
}

/* ---------- one step ---------- */
function render() {
  const r = S.rep;
  $("#device").textContent = R.deviceLine(r);
  $("#device").title = (r.device || {}).source || "";
  const mark = (n) => performance.mark("tscope:" + n);
  mark("render");
  const details = detailsHint();
  panels.env(r);
  panels.cards(r, details);
  roofline.draw(ctx);
  mark("roofline");
  panels.opps(r);
  treeView.draw(r, ctx);
  mark("tree");
  panels.split(r);
  panels.memory(r);
  panels.nan(r);
  panels.comm(r);
  panels.compiled(r);
  panels.fsdp(r);
  panels.whatIf(r);
  if (S.cmp) selectDiff(ST.stepValue(S.cmp));
  requestAnimationFrame(() => { window.tscopePainted = performance.now(); document.body.setAttribute("data-ready", "1"); });
}

/* ---------- start ---------- */
const HINT = "No tscope data here. Add the callback to your Trainer: <code>Trainer(callbacks=[tscope_callbacks.RooflineCallback()])</code>; each profiled step is written to <code>&lt;log_dir&gt;/tscope/step_&lt;N&gt;.json</code>.";

/* the run to open: the first with a readable step */
const firstRun = (runs) => runs.find((r) => r.steps.some((x) => x.readable !== false)) || runs[0];

async function start() {
  skeleton();
  startPolling();
  let idx;
  try { idx = await API.runs(); } catch (e) { banner("err", "cannot read the run list: " + esc(e)); return; }
  S.runs = (idx && idx.runs) || [];
  if (!S.runs.length) { banner("hint", idx && idx.hint ? esc(idx.hint) : HINT); return; }
  const bad = S.runs.flatMap((r) => r.steps.filter((x) => x.readable === false).map((x) => r.run + " " + ST.stepLabel(x) + ": " + (x.error || "unreadable")));
  await selectRun(firstRun(S.runs).run);
  if (bad.length && !$("#banner").textContent) banner("err", "Unreadable step files (the rest is shown):<br>" + bad.map(esc).join("<br>"));
}

/* ---------- TensorBoard mode: new steps of a run still training appear on their own ---------- */
const POLL_MS = 10000;
async function poll() {
  let idx;
  try { idx = await API.runs(); } catch (e) { return false; }
  const runs = (idx && idx.runs) || [];
  if (!runs.length) return false;
  if (!S.runs.length || S.rep == null && !S.run) { S.runs = runs; clear("#banner"); await selectRun(firstRun(runs).run); return true; }
  const before = S.runs.find((r) => r.run === S.run), after = runs.find((r) => r.run === S.run);
  const changed = ST.stepsKey(before) !== ST.stepsKey(after) || runs.map((r) => r.run).join("\n") !== S.runs.map((r) => r.run).join("\n");
  S.runs = runs;
  if (!changed) return false;
  /* the selectors gain the new steps; the user's run, step and diff stay selected */
  fillSelectors();
  if (ST.stepsKey(before) !== ST.stepsKey(after)) seriesView.draw(ctx);
  if (S.step == null && after) {
    const first = ST.openStep(after);
    if (first) { S.stage = first.stage; S.step = first.step; fillSelectors(); await loadStep(); }
  } else if (S.rep) detailsHint();
  return true;
}
function startPolling() {
  if (API.mode !== "tensorboard" || S.pollTimer) return;
  S.pollMs = POLL_MS;
  S.pollTimer = setInterval(() => { if (document.visibilityState === "visible") poll(); }, POLL_MS);
  document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible") poll(); });
}

window.tscopeDashboard = {API, F, figText, state: S, poll};
if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
