/* tscope dashboard: one page, two data sources (TensorBoard plugin routes, or data inline in the file).
   Renders only the StepReport dict (schema "tscope.step_report", version 2). No network beyond the plugin's own
   relative routes; no library. */
(function () {
  "use strict";
  const $ = (s, el) => (el || document).querySelector(s);
  const h = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      const v = attrs[k];
      if (v == null || v === false) continue;
      if (k === "class") e.className = v; else if (k === "text") e.textContent = v;
      else if (k === "html") e.innerHTML = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const c of kids.flat()) if (c != null && c !== false) e.append(c.nodeType ? c : String(c));
    return e;
  };
  const SVGNS = "http://www.w3.org/2000/svg";
  const s = (tag, attrs, ...kids) => {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs || {}) if (attrs[k] != null) e.setAttribute(k, attrs[k]);
    for (const c of kids.flat()) if (c != null) e.append(c.nodeType ? c : String(c));
    return e;
  };
  const esc = (t) => String(t).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]));

  /* ---------- formatting: every number with its unit (page.py mirrors these for the tests) ---------- */
  const num = (x) => typeof x === "number" && isFinite(x);
  function sig(x, n) {
    n = n || 3;
    if (!num(x)) return "–";
    if (x === 0) return "0";
    if (Math.abs(x) >= 1000) return Math.round(x).toLocaleString("en-US");
    return String(parseFloat(x.toPrecision(n)));
  }
  function scaled(x, units, base) {
    if (!num(x)) return "–";
    let i = 0, v = x;
    while (Math.abs(v) >= base && i < units.length - 1) { v /= base; i++; }
    return sig(v) + " " + units[i];
  }
  const F = {
    time(sec) {
      if (!num(sec)) return "–";
      const a = Math.abs(sec);
      if (a === 0) return "0 ms";
      if (a >= 1) return sig(sec) + " s";
      if (a >= 1e-3) return sig(sec * 1e3) + " ms";
      if (a >= 1e-6) return sig(sec * 1e6) + " µs";
      return sig(sec * 1e9) + " ns";
    },
    ms(sec) { return num(sec) ? sig(sec * 1e3) : "–"; },
    pct(r) { return !num(r) ? "–" : r !== 0 && Math.abs(r) < 1e-4 ? "<0.01%" : sig(r * 100) + "%"; },
    /* a ratio near 1 keeps its digits (1.005x, 0.996x), where three significant figures would read "1x" */
    ratio(x) { return !num(x) ? "–" : (x >= 0.1 && x < 10 ? x.toFixed(3) : sig(x)) + "x"; },
    bytes(b) { return scaled(b, ["B", "KiB", "MiB", "GiB", "TiB"], 1024); },
    flops(f) { return scaled(f, ["FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"], 1000); },
    rate(f) { return scaled(f, ["FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s"], 1000); },
    bw(b) { return scaled(b, ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"], 1000); },
    count(x, unit) {
      if (!num(x)) return "–";
      if (Math.abs(x) >= 1e6) return scaled(x, ["", "k", "M", "G", "T"], 1000).replace(" ", " ").trim() + " " + unit;
      return sig(x) + " " + unit;
    },
    intensity(x) { return num(x) ? sig(x) + " FLOP/B" : "–"; },
    shapes(sh) {
      if (!sh || !sh.length) return "";
      if (typeof sh === "string") return sh;
      return sh.map((x) => Array.isArray(x) ? (x.length ? x.join("×") : "scalar") : String(x)).join(", ");
    },
  };
  /* a header figure as the page shows it (value + unit); page.py's fmt_figure is the same rule */
  function figText(fig) {
    if (!fig || !num(fig.value)) return "–";
    const v = fig.value, u = fig.unit;
    if (u === "ms") return F.time(v / 1e3);
    if (u === "s") return F.time(v);
    if (u === "ratio" || u === "fraction") return F.pct(v);
    if (u === "B" || u === "bytes") return F.bytes(v);
    if (u === "TFLOP/s") return F.rate(v * 1e12);
    if (u === "tokens/s" || u === "samples/s") return F.count(v, u);
    return sig(v) + (u ? " " + u : "");
  }

  /* ---------- the data layer: the same four queries in both modes ---------- */
  function inlineJSON(sel) {
    const el = document.querySelector(sel);
    return el ? JSON.parse(el.textContent) : undefined;
  }
  const INLINE = inlineJSON("#tscope-data");
  const opsCache = {};
  function unpackOps(o) {
    if (!o) return [];
    if (Array.isArray(o)) return o;
    const cols = o.cols;
    return o.rows.map((r) => { const x = {}; for (let i = 0; i < cols.length; i++) x[cols[i]] = r[i]; return x; });
  }
  const key = (run, stage, step) => run + "/" + stage + "/" + step;
  const API = INLINE ? {
    mode: "standalone",
    async runs() { return {runs: INLINE.runs || [], hint: INLINE.hint || null}; },
    async step(run, step, stage) {
      const k = key(run, stage, step);
      let d = (INLINE.steps || {})[k];
      if (d === undefined) d = inlineJSON('script[data-tscope-step="' + CSS.escape(k) + '"]');
      return d === undefined ? {error: "no step " + k + " in this file"} : d;
    },
    async ops(run, step, stage, layer) {
      const k = key(run, stage, step);
      if (!(k in opsCache)) {
        let o = (INLINE.ops || {})[k];
        if (o === undefined) o = inlineJSON('script[data-tscope-ops="' + CSS.escape(k) + '"]');
        opsCache[k] = {ops: unpackOps(o), note: o && o.note};
      }
      const all = opsCache[k];
      return {ops: layer == null || layer === "" ? all.ops : all.ops.filter((r) => r.layer === layer || (r.layer || "").startsWith(layer + ".")), note: all.note};
    },
    async series(run) { return (INLINE.series || {})[run] || {}; },
  } : {
    mode: "tensorboard",
    base: window.TSCOPE_BASE || "",
    async get(path, params) {
      const q = params ? "?" + new URLSearchParams(params).toString() : "";
      const r = await fetch(this.base + path + q, {credentials: "same-origin"});
      if (!r.ok) return {error: "HTTP " + r.status + " from " + path};
      return r.json();
    },
    runs() { return this.get("runs"); },
    step(run, step, stage) { return this.get("step", {run, step, stage}); },
    ops(run, step, stage, layer) { return this.get("ops", {run, step, stage, layer: layer || ""}); },
    series(run) { return this.get("series", {run}); },
  };

  /* ---------- state ---------- */
  const S = {runs: [], run: null, stage: "train", step: null, rep: null, cmp: null, showOps: false, selLayer: null};
  const PHASE_COLOR = {forward: "var(--fwd)", backward: "var(--bwd)", optimizer: "var(--opt)", recompute: "var(--rec)"};
  const phaseColor = (p) => PHASE_COLOR[p] || "var(--oth)";
  const timeOf = (r) => num(r.measured_s) && r.measured_s > 0 ? r.measured_s : r.expected_s;

  /* ---------- page skeleton ---------- */
  function skeleton() {
    const app = $("#app");
    app.innerHTML = "";
    app.append(
      h("header", {class: "bar"},
        h("span", {class: "brand", html: "<b>tscope</b> dashboard"}),
        h("label", {}, "run", h("select", {id: "run-select", onchange: (e) => selectRun(e.target.value)})),
        h("label", {}, "step", h("select", {id: "step-select", onchange: (e) => selectStep(e.target.value)})),
        h("label", {}, "diff with", h("select", {id: "diff-select", onchange: (e) => selectDiff(e.target.value)})),
        h("span", {id: "device"})),
      h("div", {id: "banner"}), h("div", {id: "env"}), h("div", {id: "whatif"}),
      h("section", {id: "cards"}),
      h("div", {class: "grid2"},
        h("div", {class: "panel", id: "roof-panel"},
          h("div", {class: "tools"},
            h("label", {}, h("input", {type: "checkbox", id: "show-ops", onchange: (e) => { S.showOps = e.target.checked; drawRoofline(); }}), "ops")),
          h("h2", {text: "Roofline"}), h("div", {class: "basis", id: "roof-basis"}),
          h("div", {id: "roof-holder"}), h("div", {class: "legend", id: "roof-legend"})),
        h("div", {},
          h("div", {class: "panel", id: "opps-panel"}, h("h2", {text: "Top opportunities"}),
            h("div", {class: "basis", id: "opps-basis"}), h("div", {id: "opps"})),
          h("div", {class: "panel", id: "split-panel"}, h("h2", {text: "Where the step goes"}), h("div", {class: "basis", id: "split-basis"}), h("div", {id: "split"})))),
      h("div", {class: "panel", id: "ops-panel"}),
      h("div", {class: "panel", id: "tree-panel"},
        h("div", {class: "tools"}, h("button", {id: "tree-expand", onclick: () => treeAll(true)}, "expand all"),
          h("button", {id: "tree-collapse", onclick: () => treeAll(false)}, "collapse")),
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
        h("div", {class: "basis", text: "profiled steps and the callbacks' automatic windows; the step monitor's breakdown and GPU telemetry at its logging steps, when the run has them; red lines: anomaly alerts"}), h("div", {class: "charts", id: "charts"}), h("div", {id: "alerts"})),
      h("div", {class: "panel", id: "diff-panel"}, h("h2", {text: "Step diff"}), h("div", {id: "diff"},
        h("div", {class: "empty", text: "choose a step to compare in “diff with”"}))),
      h("div", {id: "tooltip"}));
  }

  function banner(kind, html) {
    const b = $("#banner");
    b.innerHTML = "";
    if (html) b.append(h("div", {class: "banner " + kind, html}));
  }

  /* ---------- selectors ---------- */
  function stepLabel(st) { return st.label || (st.stage === "train" ? "" : st.stage + " ") + "step " + st.step + (st.readable === false ? " (unreadable)" : ""); }
  function fillSelectors() {
    const rs = $("#run-select");
    rs.innerHTML = "";
    for (const r of S.runs) rs.append(h("option", {value: r.run, text: r.run || "(logdir)"}));
    rs.value = S.run;
    const run = S.runs.find((r) => r.run === S.run) || {steps: []};
    const ss = $("#step-select"), ds = $("#diff-select");
    ss.innerHTML = "";
    for (const st of run.steps) {
      const v = st.stage + ":" + st.step;
      ss.append(h("option", {value: v, text: stepLabel(st), disabled: st.readable === false ? "" : null}));
    }
    ss.value = S.stage + ":" + S.step;
    fillDiff();
  }
  /* "diff with": the run's other steps (never the one shown); no diff at all for a run of one readable step */
  function fillDiff() {
    const run = S.runs.find((r) => r.run === S.run) || {steps: []};
    const ds = $("#diff-select"), cur = S.stage + ":" + S.step;
    ds.innerHTML = "";
    ds.append(h("option", {value: "", text: "—"}));
    const others = run.steps.filter((st) => st.stage + ":" + st.step !== cur);
    for (const st of others) ds.append(h("option", {value: st.stage + ":" + st.step, text: stepLabel(st), disabled: st.readable === false ? "" : null}));
    const one = !others.some((st) => st.readable !== false);
    ds.parentElement.style.display = one ? "none" : "";
    $("#diff-panel").style.display = one ? "none" : "";
    if (S.cmp && S.cmp.stage + ":" + S.cmp.step === cur) S.cmp = null;
    ds.value = S.cmp ? S.cmp.stage + ":" + S.cmp.step : "";
  }
  async function selectRun(run) {
    S.run = run; S.cmp = null;
    const r = S.runs.find((x) => x.run === run);
    const ok = r ? r.steps.filter((x) => x.readable !== false) : [];
    const last = ok[ok.length - 1];
    if (last) { S.stage = last.stage; S.step = last.step; }
    fillSelectors();
    drawSeries();
    if (last) await loadStep();
  }
  async function selectStep(v) {
    const [stage, step] = v.split(":");
    S.stage = stage; S.step = +step;
    fillDiff();
    if (!S.cmp) selectDiff("");
    await loadStep();
  }
  async function selectDiff(v) {
    if (!v) { S.cmp = null; $("#diff").innerHTML = ""; $("#diff").append(h("div", {class: "empty", text: "choose a step to compare in “diff with”"})); return; }
    const [stage, step] = v.split(":");
    S.cmp = {stage, step: +step};
    const b = await API.step(S.run, +step, stage);
    if (b.error) { $("#diff").innerHTML = ""; $("#diff").append(h("div", {class: "banner err", text: b.error})); return; }
    /* before -> after: the earlier step first */
    const cur = {rep: S.rep, label: stepLabel({stage: S.stage, step: S.step}), step: S.step};
    const oth = {rep: b, label: stepLabel({stage, step}), step: +step};
    const [x, y] = oth.step < cur.step ? [oth, cur] : [cur, oth];
    drawDiff(x.rep, y.rep, x.label, y.label);
  }

  async function loadStep() {
    performance.mark("tscope:load");
    S.opRows = null;
    const rep = await API.step(S.run, S.step, S.stage);
    S.selLayer = null;
    $("#ops-panel").innerHTML = "";
    if (!rep || rep.error) {
      banner("err", esc((rep && rep.error) || "no data"));
      S.rep = null;
      return;
    }
    banner("", "");
    S.rep = rep;
    render();
  }

  /* ---------- render one step ---------- */
  function render() {
    const r = S.rep;
    const dev = r.device || {};
    const drawnBw = roofsDrawn(r).bw;
    $("#device").textContent = (dev.name || "device ?") + (dev.measured ? " · measured roof" : "") +
      (num(drawnBw) ? " · " + F.bw(drawnBw) + (num(dev.bandwidth) && Math.abs(dev.bandwidth - drawnBw) > 1e-6 * drawnBw ? " (widened from " + F.bw(dev.bandwidth) + ")" : "") : "");
    $("#device").title = dev.source || "";
    const mark = (n) => performance.mark("tscope:" + n);
    mark("render");
    drawEnv(r);
    drawCards(r);
    drawRoofline();
    mark("roofline");
    drawOpps(r);
    drawTree(r);
    mark("tree");
    drawSplit(r);
    drawMemory(r);
    drawNaN(r);
    drawComm(r);
    drawCompiled(r);
    drawFsdp(r);
    drawWhatIf(r);
    if (S.cmp) selectDiff(S.cmp.stage + ":" + S.cmp.step);
    requestAnimationFrame(() => { window.tscopePainted = performance.now(); document.body.setAttribute("data-ready", "1"); });
  }

  /* the warnings the text report leads with, from the report's typed fields: the machine (other processes' load,
     torch's threads against the CPUs: render/notes.py environment_lines), a roof measured under load, the roof
     notes (a widened or beaten roof), the rows marked noise */
  const BUSY_LOAD_PER_CPU = 0.25;  /* devices.calibrate.BUSY_LOAD_PER_CPU */
  function envWarnings(r) {
    const c = r.context || {}, dev = r.device || {}, out = [];
    const load = c.host_others_load_per_cpu;
    if (c.host_cpus != null && c.host_busy && num(load))
      out.push(["busy", "Busy machine: other processes kept " + load.toFixed(2) + " of each of the " + c.host_cpus + " CPUs busy during the timed steps, so times are inflated and noisy (compare runs on an idle machine)."]);
    if (c.host_cpus != null && c.host_oversubscribed) {
      const cpus = c.host_cpus, threads = c.torch_threads || 0, busy = (num(load) ? load : 0) * cpus;
      const fewer = Math.max(1, Math.floor(cpus - busy));
      out.push(["oversubscribed", "Oversubscribed: torch's " + threads + " thread(s)" + (busy ? " plus " + busy.toFixed(1) + " busy cores" : "") +
        " exceed the " + cpus + " CPUs (threads wait for each other; " + (fewer < threads ? "torch.set_num_threads(" + fewer + ")" : "fewer threads cannot help: a quieter machine or time does") + ")."]);
    }
    if (num(dev.load_per_cpu) && dev.load_per_cpu >= BUSY_LOAD_PER_CPU)
      out.push(["roof-load", "Roof measured under load: other processes kept " + dev.load_per_cpu.toFixed(2) + " of each CPU busy while the CPU roof was measured: roofs are low and % of roof high (tscope calibrate --no-cache on an idle machine)."]);
    for (const n of c.roof_notes || []) out.push(["roof-note", "Roof note: " + String(n).replace(/`/g, "")]);
    const nm = ((r.noise || {}).marks || []).length;
    if (nm) out.push(["noise", nm + " layer×phase row(s) marked as noise: their times disagree across steps or with identical blocks; no advice for them."]);
    return out;
  }
  function drawEnv(r) {
    const el = $("#env");
    el.innerHTML = "";
    const w = envWarnings(r);
    if (!w.length) return;
    el.append(h("div", {class: "banner warn", id: "env-banner"}, h("b", {text: "How far these times can be trusted"}),
      h("ul", {}, w.map(([k, t]) => h("li", {"data-warning": k, text: t})))));
  }

  /* "5,157 tokens/s" -> the number large, the unit small (the text stays "5,157 tokens/s") */
  function cardValue(txt) {
    const i = txt.indexOf(" ");
    if (i < 0) return [txt];
    return [txt.slice(0, i), h("span", {class: "unit", text: txt.slice(i)})];
  }
  function card(id, label, fig, sub, cls) {
    const txt = typeof fig === "string" ? fig : figText(fig);
    const basis = sub != null ? sub : (fig && fig.basis) || "";
    return h("div", {class: "card" + (cls ? " " + cls : ""), "data-card": id, title: (fig && fig.basis) || basis},
      h("div", {class: "label", text: label}), h("div", {class: "value"}, cardValue(txt)), h("div", {class: "sub", text: basis}));
  }
  function drawCards(r) {
    const H = r.header || {}, mem = r.memory || {};
    const c = $("#cards");
    c.innerHTML = "";
    const stepFig = H.step_ms && num(H.step_ms.value) ? H.step_ms : H.estimated_step_ms;
    const estimated = !(H.step_ms && num(H.step_ms.value));
    c.append(card("step_time", "Step time" + (estimated ? " (expected)" : ""), stepFig,
      estimated ? "no measured step: " + ((stepFig && stepFig.basis) || "") : null));
    /* an estimate has no measured step: its MFU is the one at the expected step time (the report's "MFU at the
       estimate"), labelled so */
    const sm = r.summary || {};
    const atEstimate = (fig, key) => estimated && !(fig && num(fig.value)) && num(sm[key]) ?
      {value: sm[key], unit: "fraction", basis: "at the expected step time: " + ((fig && fig.basis) || "")} : null;
    for (const [id, label, key] of [["mfu", "MFU", "estimated_mfu"], ["mbu", "MBU", "estimated_mbu"], ["hfu", "HFU", "estimated_hfu"]]) {
      const est = atEstimate(H[id], key);
      c.append(card(id, label + (est ? " (expected)" : ""), est || H[id]));
    }
    const thr = H.tokens_per_s && num(H.tokens_per_s.value) ? H.tokens_per_s : H.samples_per_s;
    c.append(card("tokens_per_s", thr === H.tokens_per_s ? "Tokens/s" : "Samples/s", thr));
    const fits = mem.fits;
    const share = num(mem.share) ? mem.share : (num(mem.peak_bytes) && num(mem.device_bytes) && mem.device_bytes ? mem.peak_bytes / mem.device_bytes : null);
    const fitTxt = fits === true ? "fits" : fits === false ? "does NOT fit" : (mem.verdict || "device memory unknown");
    const peakKnown = H.memory_peak_bytes && num(H.memory_peak_bytes.value);
    c.append(card("memory", "Memory peak", H.memory_peak_bytes, !peakKnown ? "not measured in this step" :
      fitTxt + (num(mem.device_bytes) ? " · " + F.pct(share) + " of " + F.bytes(mem.device_bytes) : "") +
      (mem.verdict && !["fits", "does not fit"].includes(mem.verdict) && fits != null ? " · " + mem.verdict : ""),
      fits === false ? "bad" : null));
    const cov = H.flop_coverage;
    c.append(card("flop_coverage", "FLOP coverage", cov, null, cov && num(cov.value) && cov.value < 0.9 ? "bad" : null));
  }

  /* ---------- roofline ---------- */
  const PHASE_ORDER = ["forward", "backward", "recompute", "optimizer"];
  /* [[precision, peak drawn, device peak]] (highest first) and the bandwidth drawn: the report's roofs (what the
     ops were placed on, widened where an op beat a measured roof), the device's peaks for precisions no op used */
  function roofsDrawn(r) {
    const dev = r.device || {}, used = {};
    let bw = 0;
    for (const x of r.roofs || []) {
      if (num(x.bandwidth) && x.bandwidth > bw) bw = x.bandwidth;
      if (x.matrix && num(x.peak_flops) && x.peak_flops > (used[x.precision] || 0)) used[x.precision] = x.peak_flops;
    }
    /* the precisions the step ran in (its roofs), as the text report's "Roofs used" and the PNG: a device's other
       peaks (fp8, int8 on a bf16 step) are not drawn; without roofs (no ops), the device's */
    const ran = new Set((r.roofs || []).map((x) => x.precision));
    const peaks = Object.entries(dev.peaks || {}).filter(([p, v]) => num(v) && v > 0 && (!ran.size || ran.has(p)))
      .map(([p, v]) => [p, used[p] || v, v]).sort((a, b) => b[1] - a[1]);
    return {peaks, bw: bw || dev.bandwidth};
  }
  const ROOF_COLORS = ["#3c4043", "#1a73e8", "#9334e6", "#e8710a", "#188038", "#d01884", "#80868b"];
  function drawRoofline() {
    const r = S.rep;
    if (!r) return;
    const holder = $("#roof-holder");
    holder.innerHTML = "";
    const rows = ((r.rows || {}).layer_phase || []);
    const pts = [];
    let skipped = 0;
    for (const x of rows) {
      const t = timeOf(x);
      if (!(x.flops > 0) || !(x.bytes > 0) || !(t > 0)) { skipped++; continue; }
      pts.push({row: x, ai: x.flops / x.bytes, perf: x.flops / t, t});
    }
    const opPts = [];
    if (S.showOps) {
      if (!S.opRows) { API.ops(S.run, S.step, S.stage, "").then((res) => { S.opRows = res.ops || []; S.opNote = res.note || null; drawRoofline(); }); }
      for (const o of S.opRows || []) {
        const t = num(o.time_s) && o.time_s > 0 ? o.time_s : o.expected_s;
        if (o.flops > 0 && o.bytes > 0 && t > 0) opPts.push({op: o, ai: o.flops / o.bytes, perf: o.flops / t, t});
      }
    }
    const dev = r.device || {};
    /* the roofs the ops were placed on (r.roofs: a measured roof an op beat is widened, analysis.roofs.widen) are
       the ones drawn, so the drawn roof is the one "% of roof" uses; the device's own figures, where they differ,
       are drawn dashed */
    const used = roofsDrawn(r);
    const peaks = used.peaks, bw = used.bw, devBw = dev.bandwidth;
    const W = Math.max(420, holder.clientWidth || 640), Hh = 400, m = {l: 84, r: 22, t: 10, b: 36};  /* r: room for the last x label */
    let xs = pts.concat(opPts).map((p) => p.ai), ys = pts.concat(opPts).map((p) => p.perf);
    if (peaks.length) ys.push(peaks[0][1]);
    if (!xs.length) xs = [0.1, 100];
    if (!ys.length) ys = [1e9, 1e12];
    let x0 = Math.floor(Math.log10(Math.min(...xs))) , x1 = Math.ceil(Math.log10(Math.max(...xs)));
    if (num(bw) && peaks.length) { const ridge = peaks[0][1] / bw; x1 = Math.max(x1, Math.ceil(Math.log10(ridge * 4))); x0 = Math.min(x0, Math.floor(Math.log10(ridge / 100))); }
    let y0 = Math.floor(Math.log10(Math.min(...ys) * 0.5)), y1 = Math.ceil(Math.log10(Math.max(...ys) * 1.5));
    if (x1 - x0 < 2) x1 = x0 + 2;
    if (y1 - y0 < 2) y0 = y1 - 2;
    const X = (v) => m.l + (Math.log10(v) - x0) / (x1 - x0) * (W - m.l - m.r);
    const Y = (v) => Hh - m.b - (Math.log10(v) - y0) / (y1 - y0) * (Hh - m.t - m.b);
    const svg = s("svg", {id: "roofline", width: W, height: Hh, viewBox: "0 0 " + W + " " + Hh,
      "data-axes": JSON.stringify({x0, x1, y0, y1, left: m.l, right: W - m.r, top: m.t, bottom: Hh - m.b})});
    const grid = s("g", {class: "grid"}), axis = s("g", {class: "axis"});
    for (let e = x0; e <= x1; e++) {
      const px = X(10 ** e);
      grid.append(s("line", {x1: px, x2: px, y1: m.t, y2: Hh - m.b}));
      axis.append(s("text", {x: px, y: Hh - m.b + 14, "text-anchor": "middle"}, e >= -2 && e <= 3 ? String(10 ** e) : "1e" + e));
    }
    for (let e = y0; e <= y1; e++) {
      const py = Y(10 ** e);
      grid.append(s("line", {x1: m.l, x2: W - m.r, y1: py, y2: py}));
      axis.append(s("text", {x: m.l - 6, y: py + 4, "text-anchor": "end"}, F.rate(10 ** e).replace(" ", "\u2009")));
    }
    axis.append(s("line", {x1: m.l, x2: W - m.r, y1: Hh - m.b, y2: Hh - m.b}), s("line", {x1: m.l, x2: m.l, y1: m.t, y2: Hh - m.b}));
    axis.append(s("text", {x: (m.l + W - m.r) / 2, y: Hh - 4, "text-anchor": "middle"}, "arithmetic intensity (FLOP / byte)"));
    svg.append(grid, axis);
    const clip = s("clipPath", {id: "roof-clip"}, s("rect", {x: m.l, y: m.t, width: W - m.l - m.r, height: Hh - m.t - m.b}));
    svg.append(s("defs", {}, clip));
    const roofs = s("g", {"clip-path": "url(#roof-clip)"});
    const legend = $("#roof-legend");
    legend.innerHTML = "";
    /* roof labels go into a key under the chart (on the chart they sat under the points) */
    const stale = $("#roof-keys");  /* a re-render (another step) replaces the key, never adds one */
    if (stale) stale.remove();
    const keys = h("div", {class: "legend roof-keys", id: "roof-keys"});
    const keyLine = (col, dash, txt, attrs) => h("span", Object.assign({}, attrs || {}),
      h("b", {class: "swatch", style: "border-top:2px " + (dash ? "dashed " : "solid ") + col}), txt);
    if (num(bw)) {
      const xa = 10 ** x0, xb = 10 ** x1;
      peaks.forEach(([prec, pk, devPk], i) => {
        const col = ROOF_COLORS[1 + i % (ROOF_COLORS.length - 1)], ridge = pk / bw;  /* [0]: the memory roof's */
        const d = "M" + X(xa) + "," + Y(Math.max(xa * bw, 10 ** (y0 - 3))) + " L" + X(ridge) + "," + Y(pk) + " L" + X(xb) + "," + Y(pk);
        roofs.append(s("path", {class: "roof", d, stroke: col, "data-precision": prec, "data-peak": pk, "data-bandwidth": bw}));
        let txt = prec + " " + F.rate(pk);
        if (num(devPk) && devPk !== pk) {
          roofs.append(s("path", {class: "roof-device", d: "M" + X(devPk / bw) + "," + Y(devPk) + " L" + X(xb) + "," + Y(devPk), stroke: col, "stroke-dasharray": "5 3", "data-precision": prec, "data-peak": devPk}));
          txt += " (widened from " + F.rate(devPk) + ", dashed)";
        }
        keys.append(keyLine(col, false, txt, {"data-precision": prec}));
      });
      if (num(devBw) && devBw > 0 && Math.abs(devBw - bw) > 1e-6 * bw) {
        const top = peaks.length ? peaks[0][1] : xb * devBw;
        roofs.append(s("path", {class: "roof-device", "data-bandwidth": devBw, stroke: "#80868b", "stroke-dasharray": "5 3",
          d: "M" + X(xa) + "," + Y(Math.max(xa * devBw, 10 ** (y0 - 3))) + " L" + X(top / devBw) + "," + Y(top)}));
      }
      if (peaks.length) {  /* the shared memory slope, drawn over the roofs' own in the key's colour */
        const top = Math.max(...peaks.map((p) => p[1]));
        roofs.append(s("path", {class: "roof-memory", stroke: "#3c4043", "data-bandwidth": bw,
          d: "M" + X(xa) + "," + Y(Math.max(xa * bw, 10 ** (y0 - 3))) + " L" + X(top / bw) + "," + Y(top)}));
      }
      keys.prepend(keyLine("#3c4043", false, "memory " + F.bw(bw), {id: "roof-key-memory", "data-bandwidth": bw}));
      if (num(devBw) && Math.abs(devBw - bw) > 1e-6 * bw)
        keys.append(keyLine("#80868b", true, (dev.measured ? "measured " : "datasheet ") + F.bw(devBw) + " (not used: an op beat it)", {id: "roof-key-device", "data-bandwidth": devBw}));
    }
    svg.append(roofs);
    const g = s("g", {"clip-path": "url(#roof-clip)"});
    const tmax = Math.max(1e-30, ...pts.map((p) => p.t));
    pts.sort((a, b) => b.t - a.t);
    /* points at the same spot (identical layers): spread around it so each can be hovered and clicked, and each
       one's tooltip names the others there */
    const spots = new Map();
    for (const p of pts) { const k = X(p.ai).toFixed(0) + "," + Y(p.perf).toFixed(0); if (!spots.has(k)) spots.set(k, []); spots.get(k).push(p); }
    for (const grp of spots.values()) {
      if (grp.length < 2) continue;
      grp.forEach((p, i) => { const a = 2 * Math.PI * i / grp.length; p.dx = 5 * Math.cos(a); p.dy = 5 * Math.sin(a); p.same = grp.map((q) => q.row); });
    }
    for (const p of pts) {
      const rad = 2.5 + 13 * Math.sqrt(p.t / tmax);
      const c = s("circle", {class: "pt", cx: (X(p.ai) + (p.dx || 0)).toFixed(1), cy: (Y(p.perf) + (p.dy || 0)).toFixed(1), r: rad.toFixed(1),
        fill: phaseColor(p.row.phase), "data-layer": p.row.layer, "data-phase": p.row.phase, "data-same": p.same ? p.same.length : null});
      c.__row = p.row;
      c.__same = p.same || null;
      if (S.selLayer != null && p.row.layer === S.selLayer) c.classList.add("sel");
      g.append(c);
    }
    svg.append(g);
    svg.addEventListener("mousemove", (e) => { const t = e.target; if (t.__row) showTip(e, t.__row, false, t.__same); else if (t.__op) showTip(e, t.__op, true); else hideTip(); });
    svg.addEventListener("mouseleave", hideTip);
    svg.addEventListener("click", (e) => { const t = e.target; if (t.__row) showLayerOps(t.__row.layer, t.__row.phase); });
    holder.append(svg);
    const present = new Set(pts.map((p) => p.row.phase));
    const phases = PHASE_ORDER.filter((ph) => present.has(ph)).concat([...present].filter((ph) => !PHASE_ORDER.includes(ph)).sort());
    for (const ph of phases) legend.append(h("span", {class: "phase-key", "data-phase": ph}, h("i", {style: "background:" + phaseColor(ph)}), ph));
    legend.append(h("span", {class: "muted", text: "size: time · " + pts.length + " layer×phase points" + (skipped ? " (" + skipped + " rows without FLOPs or bytes not drawn)" : "")}));
    const timed = rows.some((x) => num(x.measured_s) && x.measured_s > 0);
    $("#roof-basis").textContent = "y: FLOPs / " + (timed ? "measured time" : "expected kernel time (untimed step)") +
      "; roofs: " + (dev.measured ? "measured on this machine" : "datasheet peaks") + " per precision, bandwidth " + F.bw(bw) +
      (num(devBw) && Math.abs(devBw - bw) > 1e-6 * bw ? " (widened from the " + (dev.measured ? "measured " : "datasheet ") + F.bw(devBw) + ": see the note above)" : "") +
      "; % of roof is against these roofs. Click a point for its ops.";
    legend.before(keys);
    if (opPts.length) {
      const frag = document.createDocumentFragment();
      for (const p of opPts) {
        const c = s("circle", {class: "op-pt", cx: X(p.ai).toFixed(1), cy: Y(p.perf).toFixed(1),
          r: (1.5 + 6 * Math.sqrt(Math.min(1, p.t / tmax))).toFixed(1), fill: phaseColor(p.op.phase)});
        c.__op = p.op;
        frag.append(c);
      }
      g.insertBefore(frag, g.firstChild);
      legend.append(h("span", {class: "muted", text: "· " + opPts.length + " op points" + (S.opNote ? " (" + S.opNote + ")" : "")}));
    }
  }
  function tipRows(pairs) {
    return "<table>" + pairs.filter((p) => p[1] != null && p[1] !== "").map((p) => "<tr><td>" + esc(p[0]) + "</td><td>" + esc(p[1]) + "</td></tr>").join("") + "</table>";
  }
  function showTip(e, x, isOp, same) {
    const tip = $("#tooltip");
    const t = isOp ? x.time_s : x.measured_s;
    const name = isOp ? x.op : (x.layer || "(root)");
    tip.innerHTML = "<div class='t'>" + esc(name) + "</div>" + tipRows([
      ["type", isOp ? x.category : x.type], ["layer", isOp ? x.layer : null], ["phase", x.phase],
      ["FLOPs", F.flops(x.flops)], ["bytes", F.bytes(x.bytes)],
      ["intensity", F.intensity(x.bytes ? x.flops / x.bytes : null)],
      ["measured", num(t) ? F.ms(t) + " ms" : "untimed"], ["expected", F.ms(x.expected_s) + " ms"],
      ["% of roof", F.pct(x.pct_of_roof)], ["bound", x.bound], ["precision", x.precision],
      ["shapes", isOp ? F.shapes(x.input_shapes) : null]]) +
      (same && same.length > 1 ? "<div class='same'>" + same.length + " layers here: " + same.map((q) => esc((q.layer || "(root)") + " " + q.phase)).join(", ") + "</div>" : "");
    tip.style.display = "block";
    const w = tip.offsetWidth, hh = tip.offsetHeight;
    let lx = e.clientX + 14, ly = e.clientY + 12;
    if (lx + w > window.innerWidth - 4) lx = e.clientX - w - 14;
    if (ly + hh > window.innerHeight - 4) ly = e.clientY - hh - 12;
    tip.style.left = lx + "px"; tip.style.top = ly + "px";
  }
  function hideTip() { $("#tooltip").style.display = "none"; }

  async function showLayerOps(layer, phase) {
    S.selLayer = layer;
    S.selPhase = phase || null;
    document.querySelectorAll("svg#roofline circle.pt").forEach((c) => c.classList.toggle("sel", c.__row && c.__row.layer === layer));
    const p = $("#ops-panel");
    const res = await API.ops(S.run, S.step, S.stage, layer);
    p.innerHTML = "";
    /* the root's point is its own ops (an empty layer asks the API for every op) */
    const allOps = (res.ops || []).filter((o) => layer || !o.layer);
    const ops = S.selPhase && !S.allPhases ? allOps.filter((o) => o.phase === S.selPhase) : allOps;
    p.append(h("div", {class: "tools"},
      S.selPhase ? h("label", {}, h("input", {type: "checkbox", id: "ops-all-phases", checked: S.allPhases ? "" : null,
        onchange: (e) => { S.allPhases = e.target.checked; showLayerOps(layer, phase); }}), "all phases (" + allOps.length + ")") : null,
      h("button", {onclick: () => { p.innerHTML = ""; S.selLayer = null; document.querySelectorAll("svg#roofline circle.sel").forEach((c) => c.classList.remove("sel")); }}, "close")),
      h("h2", {text: "Ops of " + (layer || "(root)") + (S.selPhase && !S.allPhases ? " · " + S.selPhase : "") + " (" + ops.length + ")"}),
      h("div", {class: "basis", text: "in execution order; time measured per op, expected = shape-aware kernel time" + (res.note ? " · " + res.note : "")}));
    const tb = h("table", {class: "t", id: "ops-table"});
    tb.append(h("tr", {}, ["#", "op", "phase", "FLOPs", "bytes", "FLOP/B", "ms", "expected ms", "% roof", "bound", "dtype", "input shapes"].map((c, i) => h("th", {class: i >= 3 && i <= 8 ? "n" : null, text: c}))));
    for (const o of ops.slice(0, 2000)) {
      tb.append(h("tr", {}, h("td", {class: "n muted", text: o.i}), h("td", {class: "mono", text: o.op}), h("td", {text: o.phase}),
        h("td", {class: "n", text: F.flops(o.flops)}), h("td", {class: "n", text: F.bytes(o.bytes)}),
        h("td", {class: "n", text: o.bytes ? sig(o.flops / o.bytes) : "–"}), h("td", {class: "n", text: F.ms(o.time_s)}),
        h("td", {class: "n", text: F.ms(o.expected_s)}), h("td", {class: "n", text: F.pct(o.pct_of_roof)}),
        h("td", {text: o.bound}), h("td", {text: o.dtype || ""}), h("td", {class: "mono muted", text: F.shapes(o.input_shapes)})));
    }
    if (!ops.length) tb.append(h("tr", {}, h("td", {colspan: 12, class: "empty", text: "no ops recorded for this layer in this file"})));
    p.append(h("div", {class: "scroll"}, tb));
    p.scrollIntoView({block: "nearest"});
  }

  /* ---------- opportunities ---------- */
  function drawOpps(r) {
    const el = $("#opps");
    el.innerHTML = "";
    const ops = r.opportunities || [];
    const H = r.header || {};
    $("#opps-basis").textContent = "predicted saving per step, re-estimated from the step's own ops; share of the " +
      (H.step_ms && num(H.step_ms.value) ? "measured step (" + H.step_ms.basis + ")" : "expected step");
    if (!ops.length) { el.append(h("div", {class: "empty", text: "no finding above the measured noise"})); return; }
    const ol = h("ol", {class: "opps"});
    for (const o of ops.slice(0, 5)) {
      ol.append(h("li", {class: "opp"},
        h("div", {}, h("span", {class: "save", text: (num(o.saving_s) ? "−" + F.time(o.saving_s) : "–") + (num(o.saving_frac) ? " (" + F.pct(o.saving_frac) + ")" : "")}), " ",
          h("b", {class: "mono", text: (o.layer || "(root)") + (o.op ? " · " + o.op : "")}), " ", h("span", {text: o.title || o.cause || ""})),
        /* the cause may already end with the fix ("... Fix: <change>. Saves ..."): said once */
        o.change && !(o.cause || "").includes(o.change) ? h("div", {class: "why", text: "change: " + o.change}) : null,
        o.cause && o.cause !== o.title ? h("div", {class: "why", text: o.cause}) : null));
    }
    el.append(ol);
    const nm = ((r.noise || {}).marks || []).length;
    if (ops.length > 5) el.append(h("div", {class: "muted", text: (ops.length - 5) + " more, " + F.time(ops.slice(5).reduce((a, o) => a + (o.saving_s || 0), 0)) + " in all"}));
    if (nm) el.append(h("div", {class: "muted", text: nm + " row(s) marked as noise (no advice given for them)"}));
  }

  /* ---------- layer tree ---------- */
  let TREE = null;
  function buildTree(r) {
    const nodes = new Map();
    const get = (path) => {
      if (!nodes.has(path)) nodes.set(path, {path, info: null, kids: [], self: {}, incl: {}, row: null});
      return nodes.get(path);
    };
    for (const L of r.layers || []) get(L.path).info = L;
    for (const x of (r.rows || {}).layer_phase || []) { const n = get(x.layer); n.self[x.phase] = (n.self[x.phase] || 0) + (timeOf(x) || 0); }
    for (const x of (r.rows || {}).layer || []) get(x.layer).row = x;
    for (const x of (r.rows || {}).inclusive || []) { const n = get(x.layer); n.inclRow = x; }
    get("");
    const paths = [...nodes.keys()].sort((a, b) => a.split(".").length - b.split(".").length || a.localeCompare(b, undefined, {numeric: true}));
    for (const p of paths) {
      if (p === "") continue;
      let q = p;
      let parent = null;
      while (q.includes(".")) { q = q.slice(0, q.lastIndexOf(".")); if (nodes.has(q)) { parent = nodes.get(q); break; } }
      if (!parent) parent = nodes.get("");
      parent.kids.push(nodes.get(p));
    }
    const order = (n) => { n.kids.sort((a, b) => (a.info && b.info && a.info.index != null) ? 0 : 0); n.kids.forEach(order); };
    order(nodes.get(""));
    return nodes.get("");
  }
  const untimed = () => !!(S.rep && (S.rep.summary || {}).timed === false);
  /* an untimed step (an estimate): each layer's expected kernel time, self from its own ops' rows, total with its
     children's (the hooks timed nothing: their zeros are not measurements) */
  function expectedTimes(n) {
    if (n._exp) return n._exp;
    let ft = n.self.forward || 0, bt = n.self.backward || 0;
    for (const k of n.kids) { const e = expectedTimes(k); ft += e.ft; bt += e.bt; }
    n._exp = {fs: n.self.forward || 0, bs: n.self.backward || 0, ft, bt};
    return n._exp;
  }
  function nodeTimes(n) {
    if (untimed()) return expectedTimes(n);
    const L = n.info || {};
    const fs = num(L.self_forward_s) ? L.self_forward_s : (n.self.forward || 0);
    const bs = num(L.self_backward_s) ? L.self_backward_s : (n.self.backward || 0);
    const ft = num(L.forward_s) ? L.forward_s : null, bt = num(L.backward_s) ? L.backward_s : null;
    return {fs, bs, ft, bt};
  }
  function drawTree(r) {
    TREE = buildTree(r);
    const el = $("#tree");
    el.innerHTML = "";
    const root = TREE.info || {};
    const stepT = (root.forward_s || 0) + (root.backward_s || 0) || 1e-30;
    TREE.scale = Math.max(stepT, ...TREE.kids.map((k) => { const t = nodeTimes(k); return (t.ft || t.fs) + (t.bt || t.bs); }), 1e-30);
    $("#tree-basis").textContent = (untimed() ? "expected kernel time per layer, forward / backward, self and total (total includes children): an estimate, nothing was timed; bar = total expected time (blue fwd, orange bwd)" : "forward / backward time self and total (total includes children) from the layer hooks; bar = total time (blue fwd, orange bwd)") + "; memory = the bytes the layer's forward / backward added (allocator readings on CUDA, tracked live storages on CPU)" +
      ((r.layers || []).some((L) => !num(L.memory_fwd_bytes)) ? " (not measured in this step: –)" : "");
    const tb = h("table", {class: "t", id: "tree-table"});
    const tc = (c) => untimed() ? c.replace(" ms", " ms, expected") : c;  /* an estimate says so in its headers */
    tb.append(h("tr", {}, ["layer", "", tc("fwd self ms"), tc("fwd total ms"), tc("bwd self ms"), tc("bwd total ms"), "FLOPs", "bytes", "mem fwd", "mem bwd", "params", "in shapes", "out shapes", "grad shapes", "NaN/Inf"].map((c, i) => h("th", {class: i >= 2 && i <= 10 ? "n" : null, text: c,
      title: {"in shapes": "input shapes", "out shapes": "output shapes", "grad shapes": "gradient output shapes (hover a cell: input gradients)", "NaN/Inf": "non-finite outputs or gradients"}[c] || null}))));
    el.append(tb);
    const rows = TREE.kids.length === 1 && !TREE.info ? [TREE.kids[0]] : [TREE];
    /* open level by level while the table stays short (a 1000-layer model opens fast) */
    let openDepth = 1, count = 1, level = rows;
    for (let dpt = 1; dpt <= 3; dpt++) {
      const next = level.flatMap((n) => n.kids);
      if (!next.length || count + Math.min(next.length, KIDS_SHOWN * level.length) > 120) break;
      count += next.length; level = next; openDepth = dpt;
    }
    for (const n of rows) insertNode(tb, null, n, 0, openDepth);
  }
  const KIDS_SHOWN = 100;
  /* layer times: in an untimed step, the expected kernel time, marked as such (never the hooks' unmeasured zeros) */
  function timeCell(v) {
    if (untimed()) return h("td", {class: "n muted est", "data-expected": "1", title: "expected kernel time (untimed step: layer times not measured)", text: F.ms(v)});
    return h("td", {class: "n", text: F.ms(v)});
  }
  const NOT_MEASURED = "not measured in this step: per-layer memory needs a profile with layer details";
  /* a memory figure: "–" with the reason when it was not measured (null), never a 0 that was not measured */
  function memCell(v, peak) {
    if (!num(v)) return h("td", {class: "n muted", "data-unmeasured": "1", title: NOT_MEASURED, text: "–"});
    return h("td", {class: "n", title: num(peak) ? "peak above the start: " + F.bytes(peak) : null, text: F.bytes(v)});
  }
  function treeRow(n, depth) {
    const L = n.info || {}, t = nodeTimes(n);
    const tot = (t.ft != null ? t.ft : t.fs) + (t.bt != null ? t.bt : t.bs);
    const sc = TREE.scale;
    const fw = (t.ft != null ? t.ft : t.fs) / sc * 100, bw = (t.bt != null ? t.bt : t.bs) / sc * 100;
    const flops = num(L.flops_fwd) ? L.flops_fwd + (L.flops_bwd || 0) : (n.row ? n.row.flops : null);
    const bytes = num(L.bytes_fwd) ? L.bytes_fwd + (L.bytes_bwd || 0) : (n.row ? n.row.bytes : null);
    const nan = ["nonfinite_output", "nonfinite_grad_input", "nonfinite_grad_output"].filter((k) => L[k]).map((k) => k.replace("nonfinite_", ""));
    const name = n.path === "" ? "(model)" : n.path.slice(n.path.lastIndexOf(".") + 1);
    const tr = h("tr", {class: "tree-row", "data-path": n.path, "data-depth": depth, title: n.path || "(root)"},
      h("td", {}, h("div", {class: "nm", style: "padding-left:" + depth * 14 + "px"},
        h("span", {class: "tg", text: n.kids.length ? "▸" : ""}), h("span", {class: "p", text: name}), h("span", {class: "ty", text: L.type || (n.row && n.row.type) || ""}))),
      h("td", {}, h("span", {class: "tbar", title: F.time(tot)}, h("span", {class: "f", style: "left:0;width:" + Math.min(100, fw).toFixed(1) + "%"}),
        h("span", {class: "b", style: "left:" + Math.min(100, fw).toFixed(1) + "%;width:" + Math.min(100 - Math.min(100, fw), bw).toFixed(1) + "%"}))),
      timeCell(t.fs), timeCell(t.ft), timeCell(t.bs), timeCell(t.bt),
      h("td", {class: "n", text: F.flops(flops)}), h("td", {class: "n", text: F.bytes(bytes)}),
      memCell(L.memory_fwd_bytes, L.peak_fwd_bytes), memCell(L.memory_bwd_bytes, L.peak_bwd_bytes),
      h("td", {class: "n", text: num(L.num_parameters) ? F.count(L.num_parameters, "").trim() : "–"}),
      h("td", {class: "mono muted", text: F.shapes(L.input_shapes), title: F.shapes(L.input_shapes) || null}), h("td", {class: "mono muted", text: F.shapes(L.output_shapes), title: F.shapes(L.output_shapes) || null}),
      h("td", {class: "mono muted", text: F.shapes(L.grad_output_shapes), title: L.grad_input_shapes && L.grad_input_shapes.length ? "grad input: " + F.shapes(L.grad_input_shapes) : null}),
      h("td", {class: nan.length ? "flag" : "muted", text: nan.length ? "✖ " + nan.join(", ") : ""}));
    tr.__node = n;
    tr.__open = false;
    if (n.kids.length) tr.firstChild.addEventListener("click", () => toggle(tr));
    tr.addEventListener("dblclick", () => showLayerOps(n.path));
    return tr;
  }
  function insertNode(tb, after, n, depth, openDepth) {
    const tr = treeRow(n, depth);
    if (after) after.after(tr); else tb.append(tr);
    let last = tr;
    if (depth < openDepth && n.kids.length) last = expand(tr, openDepth);
    return last;
  }
  function expand(tr, openDepth) {
    const n = tr.__node, depth = +tr.getAttribute("data-depth");
    tr.__open = true;
    tr.querySelector(".tg").textContent = "▾";
    tr.classList.add("open");
    let last = tr;
    const show = (from) => {
      const upto = Math.min(n.kids.length, from + KIDS_SHOWN);
      for (let i = from; i < upto; i++) last = insertNode(null, last, n.kids[i], depth + 1, openDepth || 0);
      if (upto < n.kids.length) {
        const more = h("tr", {class: "tree-more", "data-depth": depth + 1},
          h("td", {colspan: 15}, h("div", {class: "nm", style: "padding-left:" + (depth + 1) * 14 + "px"},
            h("button", {onclick: () => { last = more.previousElementSibling; more.remove(); show(upto); }}, "show " + (n.kids.length - upto) + " more of " + n.kids.length))));
        last.after(more);
        last = more;
      }
    };
    show(0);
    return last;
  }
  function collapse(tr) {
    const depth = +tr.getAttribute("data-depth");
    let nx = tr.nextElementSibling;
    while (nx && +nx.getAttribute("data-depth") > depth) { const d = nx; nx = nx.nextElementSibling; d.remove(); }
    tr.__open = false;
    tr.classList.remove("open");
    tr.querySelector(".tg").textContent = "▸";
  }
  function toggle(tr) { if (tr.__open) collapse(tr); else expand(tr, 0); }
  function treeAll(open) {
    const first = $("#tree-table .tree-row");
    if (!first) return;
    collapse(first);
    if (open) expand(first, 99);
  }

  /* ---------- time split, memory, NaN, communication ---------- */
  const SPLIT = [["compute_bound_s", "compute-bound", "#1a73e8"], ["memory_bound_s", "memory-bound", "#e8710a"],
    ["communication_s", "communication", "#9334e6"], ["uncounted_s", "uncounted ops", "#d93025"], ["overhead_s", "overhead", "#80868b"],
    ["idle_s", "idle", "#dadce0"]];
  function stacked(el, parts, fmt) {
    const total = parts.reduce((a, p) => a + (p[1] || 0), 0) || 1e-30;
    const bar = h("div", {class: "stack"});
    const kv = h("div", {class: "kv"});
    for (const [label, v, col] of parts) {
      if (!num(v) || v <= 0) continue;
      bar.append(h("div", {style: "width:" + (v / total * 100).toFixed(2) + "%;background:" + col, title: label + ": " + fmt(v)}));
      kv.append(h("span", {}, h("i", {style: "background:" + col}), label), h("span", {class: "n", text: fmt(v)}), h("span", {class: "n muted", text: F.pct(v / total)}));
    }
    el.append(bar, kv);
  }
  function drawSplit(r) {
    const el = $("#split");
    el.innerHTML = "";
    let t = r.time_split || {};
    const cuda = /^cuda/.test((r.summary || {}).timing || "");
    const hs = (r.header || {}).step_ms || {};
    if (!num(t.step_s) && /^measured/.test(t.basis || "") && num(hs.value)) {
      /* a step file written before the split carried its step: the rest of the header's measured step */
      const ops = SPLIT.filter(([k]) => k !== "idle_s").reduce((a, [k]) => a + (num(t[k]) ? t[k] : 0), 0);
      t = Object.assign({}, t, {step_s: hs.value / 1e3, idle_s: Math.max(0, hs.value / 1e3 - ops)});
    }
    /* the parts add up to the measured step: op time by bound, and the rest of the step ("idle") */
    $("#split-basis").textContent = (t.basis || "") + (num(t.step_s) ? " + the rest of the " + F.time(t.step_s) + " step (median of the unprofiled steps)" : "");
    const idle = cuda ? "no kernel running (gaps between kernels, waits for the host)" : "outside ops (host: Python, hooks, data)";
    const parts = SPLIT.map(([k, l, c]) => [k === "idle_s" ? idle : l, t[k], c]);
    if (!parts.some((p) => num(p[1]) && p[1] > 0)) { el.append(h("div", {class: "empty", text: "no timed ops in this step"})); return; }
    stacked(el, parts, F.time);
    if (num(t.input_s)) {  /* the host's wait for each batch: beside the split, not a part of it */
      const how = (num(t.input_share) ? F.pct(t.input_share) + " of the step, " : "") + (t.input_steps ? "median of the last " + t.input_steps + " steps" : "median of the recent steps");
      el.append(h("div", {class: "input-wait" + (t.input_bound ? " flag" : ""), id: "split-input"},
        "data wait: each step waits " + F.time(t.input_s) + " for its batch (" + how + ")" +
        (t.input_bound ? " -- input-bound" + ((t.input_fixes || []).length ? ": " + t.input_fixes.join("; ") : "") : "")));
    }
  }
  const MEM_COLORS = ["#1a73e8", "#e8710a", "#188038", "#9334e6", "#d01884", "#12b5cb", "#80868b", "#f9ab00"];
  function drawMemory(r) {
    const el = $("#mem");
    el.innerHTML = "";
    const m = r.memory || {};
    const H = r.header || {};
    const verdict = m.fits === true ? "fits the device" : m.fits === false ? "does NOT fit the device" : (m.verdict || "");
    $("#mem-basis").textContent = (num(m.peak_bytes) ? "at the step's peak" : "the model's states (no step peak measured in this step)") + (verdict ? " · " + verdict : "") + (m.basis || (H.memory_peak_bytes || {}).basis ? " · " + (m.basis || H.memory_peak_bytes.basis) : "");
    /* the parts of the peak: the states, then what the step held at its peak (saved activations + the rest) */
    const C = m.categories || {};
    const cats = Object.entries(C).filter(([k, v]) => num(v) && v > 0 && !/peak|created|^temporaries$/.test(k));
    if (num(m.rest_bytes) && num(C.activations_saved)) {
      const other = m.rest_bytes - C.activations_saved;
      if (other > 0) cats.push(["temporaries", other]);
    } else if (num(C.temporaries) && C.temporaries > 0) cats.push(["temporaries", C.temporaries]);
    if (!cats.length) { el.append(h("div", {class: "empty", text: "memory not recorded in this step"})); return; }
    stacked(el, cats.map(([k, v], i) => [k.replace(/_/g, " "), v, MEM_COLORS[i % MEM_COLORS.length]]), F.bytes);
    if (num(m.device_bytes)) el.append(h("div", {class: "muted", text: "device memory " + F.bytes(m.device_bytes) + "; peak " + F.bytes(m.peak_bytes) + " = " + F.pct(m.peak_bytes / m.device_bytes)}));
  }
  function drawNaN(r) {
    const el = $("#nan");
    el.innerHTML = "";
    const ev = r.nonfinite || [];
    $("#nan-basis").textContent = "non-finite outputs or gradients per layer, and the op and source line where known; gradient spikes: the global norm over the median of the checked steps before it";
    drawSpikes(el, r.grad_spikes || []);
    if (!ev.length) { el.prepend(h("div", {class: "empty", text: "no NaN / Inf in this step"})); return; }
    const tb = h("table", {class: "t", id: "nan-table"});
    tb.append(h("tr", {}, ["step", "kind", "layer", "op", "phase", "line"].map((c) => h("th", {text: c}))));
    for (const e of ev) tb.append(h("tr", {}, h("td", {text: e.step != null ? e.step : ""}), h("td", {class: "flag", text: e.kind || ""}),
      h("td", {class: "mono", text: e.layer || ""}), h("td", {class: "mono", text: e.op || ""}), h("td", {text: e.phase || ""}), h("td", {class: "mono muted", style: "white-space:normal", text: e.line || ""})));
    el.prepend(h("div", {class: "scroll"}, tb));
  }
  function drawSpikes(el, sp) {
    if (!sp.length) { el.append(h("div", {class: "empty", text: "no gradient spike up to this step"})); return; }
    const tb = h("table", {class: "t", id: "spike-table"});
    tb.append(h("tr", {}, [["step"], ["layer that grew most"], ["norm / median", 1], ["layer / its median", 1], ["norm", 1], ["median", 1], ["loss", 1]].map(([c, n]) => h("th", {class: n ? "n" : null, text: c}))));
    for (const x of sp) tb.append(h("tr", {class: "spike", "data-step": x.step},
      h("td", {text: x.step != null ? x.step : ""}), h("td", {class: "mono", text: x.layer == null ? "–" : (x.layer || "(root)")}),
      h("td", {class: "n flag", text: num(x.ratio) ? sig(x.ratio) + "x" : "–"}), h("td", {class: "n", text: num(x.layer_ratio) ? sig(x.layer_ratio) + "x" : "–"}),
      h("td", {class: "n", text: sig(x.norm)}), h("td", {class: "n", text: sig(x.median)}), h("td", {class: "n", text: sig(x.loss)})));
    el.append(h("h2", {text: "Gradient spikes (" + sp.length + ")", style: "margin-top:8px"}), h("div", {class: "scroll", style: "max-height:200px"}, tb));
  }
  /* ---------- compiled vs eager, FSDP what-if, what-if ---------- */
  function drawCompiled(r) {
    const p = $("#cve-panel"), el = $("#cve");
    el.innerHTML = "";
    const rows = r.compiled_vs_eager || [];
    p.style.display = rows.length ? "" : "none";
    if (!rows.length) return;
    const tb = h("table", {class: "t", id: "cve-table"});
    tb.append(h("tr", {}, ["layer", "compiled ms", "eager ms", "speedup", "% of roof", "ops compiled / eager"].map((c, i) => h("th", {class: i ? "n" : null, text: c}))));
    for (const x of rows.slice(0, 40)) tb.append(h("tr", {"data-layer": x.layer, class: x.layer === "(total)" ? "total" : null},
      h("td", {class: "mono", text: x.layer}), h("td", {class: "n", text: num(x.compiled_ms) ? sig(x.compiled_ms) : "–"}),
      h("td", {class: "n", text: num(x.eager_ms) ? sig(x.eager_ms) : "–"}),
      h("td", {class: "n " + (num(x.speedup) ? (x.speedup >= 1 ? "chg-good" : "chg-bad") : ""), text: num(x.speedup) ? sig(x.speedup) + "x" : "–"}),
      h("td", {class: "n", text: F.pct(x.compiled_pct_of_roof)}), h("td", {class: "n muted", text: (x.compiled_ops != null ? x.compiled_ops : "–") + " / " + (x.eager_ops != null ? x.eager_ops : "–")})));
    if (rows.length > 40) tb.append(h("tr", {}, h("td", {colspan: 6, class: "muted", text: (rows.length - 40) + " more layers"})));
    el.append(h("div", {class: "scroll", style: "max-height:320px"}, tb));
  }
  function drawFsdp(r) {
    const p = $("#fsdp-panel"), el = $("#fsdp");
    el.innerHTML = "";
    const w = r.fsdp_whatif;
    p.style.display = w ? "" : "none";
    if (!w) return;
    $("#fsdp-basis").textContent = "this step's per-GPU memory, collectives and step time, modelled under FSDP2 over " + w.n + " GPUs" +
      (w.shard_size && w.shard_size !== w.n ? " (HSDP: shard groups of " + w.shard_size + ")" : "") + (w.link ? " on " + w.link + (num(w.link_bandwidth) ? " (" + F.bw(w.link_bandwidth) + ")" : "") : "") + "; an estimate, not a measurement";
    const wrap = h("div", {class: "grid3"});
    el.append(wrap);
    const fmt = (sect, k, v) => typeof v === "string" ? v : typeof v === "boolean" ? (v ? "yes" : "no") :
      (k === "share" || k === "mfu" || /frac/.test(k)) ? F.pct(Math.abs(v) < 1e-9 ? 0 : v) : /_s$/.test(k) ? F.time(v) : sect === "memory" ? F.bytes(v) : sig(v);
    for (const [sect, title, id] of [["memory", "memory per GPU", "fsdp-memory"], ["time", "step time per GPU", "fsdp-time"]]) {
      const obj = w[sect];
      if (!obj || typeof obj !== "object") continue;
      const box = h("div", {class: "kv", id, style: "grid-template-columns:auto auto"});
      for (const [k, v] of Object.entries(obj)) if (k !== "basis" && (v == null || typeof v !== "object"))
        box.append(h("span", {text: k.replace(/_s$/, "").replace(/_/g, " ")}), h("span", {class: "n", "data-key": k, text: v == null ? "–" : fmt(sect, k, v)}));
      wrap.append(h("div", {}, h("h2", {text: title, style: "margin-top:6px"}), box, obj.basis ? h("div", {class: "muted", text: obj.basis}) : null));
    }
    const comm = w.comm || {};
    const tb = h("table", {class: "t", id: "fsdp-comm"});
    tb.append(h("tr", {}, ["collective", "calls", "bytes"].map((c, i) => h("th", {class: i ? "n" : null, text: c}))));
    for (const [k, v] of Object.entries(comm)) if (v && typeof v === "object") tb.append(h("tr", {}, h("td", {text: k.replace(/_/g, " ")}), h("td", {class: "n", text: sig(v.calls)}), h("td", {class: "n", text: F.bytes(v.bytes)})));
    wrap.append(h("div", {}, h("h2", {text: "collectives per step", style: "margin-top:6px"}), tb));
  }
  function drawWhatIf(r) {
    const el = $("#whatif");
    el.innerHTML = "";
    const w = r.what_if, est = (r.header || {}).estimated_step_ms;
    if (!w) return;
    el.append(h("div", {class: "banner hint", id: "whatif-banner", "data-measured-on": w.measured_on, "data-roofs-of": w.roofs_of,
      text: "What-if: the times were measured on " + w.measured_on + " and are placed on the roofs of " + w.roofs_of +
        ". MFU and % of roof read the step as if it had run on " + w.roofs_of + " at the measured speed; the expected times are " + w.roofs_of + "'s" +
        (est && num(est.value) ? " (expected step there: " + figText(est) + ", " + est.basis + ")" : "") + "."}));
  }
  function fmtKey(k, v) {
    if (!num(v)) return v == null ? "–" : typeof v === "object" ? Object.entries(v).map(([a, n]) => a + " ×" + n).join(", ") : String(v);
    if (/_s$/.test(k)) return F.time(v);
    if (/bytes/.test(k)) return F.bytes(v);
    if (/frac|pct/.test(k)) return F.pct(v);
    if (/^(algbw|busbw|bandwidth)$/.test(k)) return F.bw(v);
    return sig(v);
  }
  function drawComm(r) {
    const p = $("#comm-panel"), el = $("#comm");
    el.innerHTML = "";
    const c = r.communication;
    p.style.display = c ? "" : "none";
    if (!c) return;
    const rows = c.rows || [];
    if (rows.length) {
      const cols = [["collective", "collective"], ["group", "group"], ["group_size", "ranks"], ["calls", "calls"], ["bytes", "bytes"],
        ["time_s", "time"], ["roof_s", "at link roof"], ["algbw", "algbw"], ["busbw", "busbw"], ["pct_of_link", "% of link"], ["layers", "launched from"]];
      const tb = h("table", {class: "t", id: "comm-table"});
      tb.append(h("tr", {}, cols.map(([k, l], i) => h("th", {class: i >= 2 && i <= 9 ? "n" : null, text: l}))));
      for (const row of rows.slice(0, 50)) tb.append(h("tr", {}, cols.map(([k], i) => h("td", {class: i >= 2 && i <= 9 ? "n" : k === "layers" ? "mono muted" : null, text: fmtKey(k, row[k])}))));
      el.append(h("div", {class: "basis", text: "per collective and process group; algbw = bytes / time, busbw = bytes on each rank's link / time (nccl-tests)"}), tb);
    }
    for (const [name, obj] of [["overlap with compute (device timeline)", c.overlap], ["rank skew", c.skew]]) {
      if (!obj || typeof obj !== "object") continue;
      const kv = h("div", {class: "kv", style: "grid-template-columns:auto auto;max-width:420px;margin-top:6px"});
      for (const [k, v] of Object.entries(obj)) if (v == null || typeof v !== "object") kv.append(h("span", {text: k.replace(/_s$/, "").replace(/_frac$/, " share").replace(/_/g, " ")}), h("span", {class: "n", text: fmtKey(k, v)}));
      el.append(h("h2", {text: name, style: "margin-top:8px"}), kv);
    }
  }

  /* ---------- over-time charts ---------- */
  const BREAKDOWN = [["step/data_wait_ms", "data wait", "#188038"], ["step/host_ms", "host", "#1a73e8"],
    ["step/device_busy_ms", "device busy", "#e8710a"], ["step/idle_ms", "idle", "#80868b"]];
  async function drawSeries() {
    const el = $("#charts");
    const ser = await API.series(S.run) || {};
    S.series = ser;
    el.innerHTML = "";
    const alerts = Array.isArray(ser.alerts) ? ser.alerts : [];
    const ms = (v) => F.time(v / 1e3);
    const specs = [["mfu", "MFU", F.pct], ["step_ms", "step time", ms], ["tokens_per_s", "tokens/s", (v) => F.count(v, "")]];
    if (!(ser.tokens_per_s || []).length && (ser.samples_per_s || []).length) specs[2] = ["samples_per_s", "samples/s", (v) => F.count(v, "")];
    for (const [k, label, fmt] of specs) el.append(lineChart(label, [{pts: ser[k] || []}], fmt, k, alerts));
    /* the step monitor's series, where the run has them */
    let parts = BREAKDOWN.filter(([k]) => (ser[k] || []).length).map(([k, name, color]) => ({name, color, pts: ser[k], key: k}));
    /* on a CPU the host is the device: device busy is the host time and idle the data wait, the same points; one
       line each, named for both (two lines drawn on top of each other showed two of four legend entries) */
    const same = (a, b) => a.length === b.length && a.every((p, i) => p[0] === b[i][0] && p[1] === b[i][1]);
    for (const [dup, of, also] of [["step/device_busy_ms", "step/host_ms", "device busy"], ["step/idle_ms", "step/data_wait_ms", "idle"]]) {
      const d = parts.find((p) => p.key === dup), o = parts.find((p) => p.key === of);
      if (d && o && same(d.pts, o.pts)) { parts = parts.filter((p) => p !== d); o.name += " = " + also; }
    }
    if (parts.length) el.append(lineChart("step breakdown (median per log interval)", parts, ms, "step_breakdown", alerts));
    const gpu = [["gpu/energy_j_per_token", "energy per token", (v) => sig(v) + " J", "energy_per_token"],
      ["gpu/power_w", "power", (v) => sig(v) + " W", "power"], ["gpu/sm_clock_mhz", "SM clock", (v) => v >= 1000 ? sig(v / 1000) + " GHz" : sig(v) + " MHz", "sm_clock"]];
    for (const [k, label, fmt, id] of gpu) if ((ser[k] || []).length) el.append(lineChart(label, [{pts: ser[k]}], fmt, id, alerts));
    const boxes = [...el.children];
    if (boxes.length && boxes.every((b) => b.hasAttribute("data-few") || b.querySelector(".empty"))) {
      const one = boxes.find((b) => b.hasAttribute("data-few"));
      el.innerHTML = "";
      el.append(h("div", {class: "empty", id: "series-few", text: (one ? "one profiled step in this run" : "no points in this run") + ": the charts over the run need 2 or more steps"}));
    }
    const box = $("#alerts");
    box.innerHTML = "";
    if (alerts.length) {
      const ul = h("ul", {class: "alerts"});
      for (const [st, text] of alerts) ul.append(h("li", {class: "alert", "data-step": st}, h("b", {text: "step " + st + ": "}), h("span", {text: text})));
      box.append(h("h2", {text: "Anomaly alerts (" + alerts.length + ")", style: "margin-top:8px"}), ul);
    }
  }
  function lineChart(label, lines, fmt, id, alerts) {
    const W = 420, Hh = 150, m = {l: 58, r: 10, t: 8, b: 22};
    const box = h("div", {class: "chart", "data-series": id});
    const all = lines.flatMap((l) => l.pts);
    const last = lines.length === 1 && all.length ? " · last " + fmt(all[all.length - 1][1]) : "";
    box.append(h("h3", {text: label + last}));
    if (!all.length) { box.append(h("div", {class: "empty", text: "no points in this run"})); return box; }
    if (new Set(all.map((p) => p[0])).size < 2) {
      box.setAttribute("data-few", "1");
      box.append(h("div", {class: "empty", text: "one point (step " + all[0][0] + "): a chart over the run needs 2 or more steps"}));
      return box;
    }
    const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
    let xa = Math.min(...xs), xb = Math.max(...xs), ya = Math.min(0, ...ys), yb = Math.max(...ys) * 1.08 || 1;
    if (xa === xb) { xa -= 1; xb += 1; }
    const X = (v) => m.l + (v - xa) / (xb - xa) * (W - m.l - m.r), Y = (v) => Hh - m.b - (v - ya) / (yb - ya) * (Hh - m.t - m.b);
    const svg = s("svg", {width: "100%", viewBox: "0 0 " + W + " " + Hh, preserveAspectRatio: "none", style: "max-height:170px"});
    const g = s("g", {class: "grid"}), ax = s("g", {class: "axis"});
    for (let i = 0; i <= 3; i++) { const v = ya + (yb - ya) * i / 3; g.append(s("line", {x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v)})); ax.append(s("text", {x: m.l - 5, y: Y(v) + 4, "text-anchor": "end"}, fmt(v))); }
    ax.append(s("text", {x: m.l, y: Hh - 5}, "step " + xa), s("text", {x: W - m.r, y: Hh - 5, "text-anchor": "end"}, "step " + xb));
    svg.append(g, ax);
    for (const [st, text] of alerts || []) {
      if (st < xa || st > xb) continue;
      const ln = s("line", {class: "alert-mark", "data-step": st, x1: X(st), x2: X(st), y1: m.t, y2: Hh - m.b});
      ln.append(s("title", {}, "step " + st + ": " + text));
      svg.append(ln);
    }
    for (const l of lines) {
      const col = l.color || "#1a73e8";
      svg.append(s("path", {d: l.pts.map((p, i) => (i ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1)).join(""), fill: "none", stroke: col, "stroke-width": 1.5, "data-line": l.key || null}));
      for (const p of l.pts) { const c = s("circle", {cx: X(p[0]), cy: Y(p[1]), r: 2.5, fill: col}); c.append(s("title", {}, (l.name ? l.name + ", " : "") + "step " + p[0] + ": " + fmt(p[1]))); svg.append(c); }
    }
    box.append(svg);
    if (lines.length > 1) box.append(h("div", {class: "legend"}, lines.map((l) => h("span", {}, h("i", {style: "background:" + l.color}), l.name))));
    return box;
  }

  /* ---------- diff of two steps (the content of `tscope diff`) ---------- */
  function repFacts(r) {
    const H = r.header || {}, rows = r.rows || {};
    const timed = (rows.category || []).some((x) => num(x.measured_s) && x.measured_s > 0);
    const stepMs = H.step_ms && num(H.step_ms.value) ? H.step_ms.value : null;
    const cats = rows.category || [];
    return {
      timed, stepMs, estMs: (H.estimated_step_ms || {}).value, basis: (H.step_ms || {}).basis,
      mfu: (H.mfu || {}).value, flops: (r.model || {}).flops_step,
      thr: num((H.tokens_per_s || {}).value) ? H.tokens_per_s.value : (H.samples_per_s || {}).value,
      thrLabel: num((H.tokens_per_s || {}).value) ? "tokens/s" : "samples/s",
      opTime: cats.reduce((a, x) => a + (x.measured_s || 0), 0), nOps: cats.reduce((a, x) => a + (x.calls || x.n_ops || 0), 0),
      peak: (r.memory || {}).peak_bytes, device: (r.device || {}).name,
      mfuPeak: (r.summary || {}).mfu_peak_flops, noiseFloor: (r.noise || {}).floor_s || 0,
    };
  }
  const NOISE_REL = 0.01;  /* changes under 1% are shown, not coloured */
  function change(a, b, opts) {
    opts = opts || {};
    if (!num(a) || !num(b)) return ["", ""];
    if (opts.points) {
      const d = Math.round((b - a) * 100 * 1e9) / 1e9, real = a && Math.abs(b / a - 1) >= NOISE_REL;  /* no float noise */
      return [(d >= 0 ? "+" : "") + sig(d) + " pts", !real ? "" : d > 0 ? "chg-good" : d < 0 ? "chg-bad" : ""];
    }
    if (!a) return ["", ""];
    const rel = b / a - 1;
    const p = rel * 100;  /* two decimals below 10% ("-0.12%", "-0.00%"), never a long tail */
    let t = (rel >= 0 ? "+" : "-") + (Math.abs(p) < 10 ? Math.abs(p).toFixed(2) : sig(Math.abs(p))) + "%";
    let cls = "";
    const real = Math.abs(rel) >= NOISE_REL;  /* smaller changes are not coloured: they are noise-sized */
    if (opts.lowerBetter && b && b !== a) {
      const f = b < a ? a / b : b / a;  /* the factor only where it reads as more than 1.00x */
      if (f >= 1.005) t += " (" + (f < 10 ? f.toFixed(2) : sig(f)) + "x " + (b < a ? "faster" : "slower") + ")";
      cls = real ? (b < a ? "chg-good" : "chg-bad") : "";
    }
    else if (opts.higherBetter) cls = !real ? "" : rel > 0 ? "chg-good" : rel < 0 ? "chg-bad" : "";
    return [t, cls];
  }
  function drawDiff(a, b, la, lb) {
    const el = $("#diff");
    el.innerHTML = "";
    const A = repFacts(a), B = repFacts(b);
    const timed = A.timed && B.timed;
    const notes = [];
    if (!timed) notes.push("one side is untimed (an analysis): layers and classes compare expected kernel times");
    const same = num(A.flops) && num(B.flops) && A.flops && Math.abs(B.flops / A.flops - 1) <= 0.01;
    if (!same) notes.push("the steps do different work (model FLOPs " + F.flops(A.flops) + " vs " + F.flops(B.flops) + "): compare throughput and MFU, not times");
    if (A.device !== B.device) notes.push("different devices: " + A.device + " vs " + B.device);
    if (A.stepMs != null && B.stepMs != null && A.basis !== B.basis) notes.push("the step times have different bases: " + A.basis + " vs " + B.basis);
    const sa = A.stepMs != null ? A.stepMs / 1e3 : A.estMs / 1e3, sb = B.stepMs != null ? B.stepMs / 1e3 : B.estMs / 1e3;
    const both = A.stepMs != null && B.stepMs != null;
    /* MFU is against each step's matrix roof; a measured roof widened where an op beat it differs from step to step:
       the change is then on the first step's roof (the same FLOPs in less time, not a moved roof) */
    let mfuB = B.mfu;
    if (num(A.mfuPeak) && num(B.mfuPeak) && num(B.mfu) && Math.abs(B.mfuPeak / A.mfuPeak - 1) > 1e-3) {
      mfuB = B.mfu * B.mfuPeak / A.mfuPeak;
      notes.push("the steps' MFU roofs differ (" + F.rate(A.mfuPeak) + " vs " + F.rate(B.mfuPeak) + "): the MFU change is on " + la + "'s roof (" + lb + " there: " + F.pct(mfuB) + ")");
    }
    const head = [
      ["step time" + (both ? "" : " (expected)"), F.time(sa), F.time(sb), same ? change(sa, sb, {lowerBetter: true}) : ["(different work)", ""]],
      ["MFU", F.pct(A.mfu), F.pct(B.mfu), change(A.mfu, mfuB, {points: true})],
      ["model FLOPs per step", F.flops(A.flops), F.flops(B.flops), change(A.flops, B.flops)],
      [A.thrLabel, F.count(A.thr, ""), F.count(B.thr, ""), change(A.thr, B.thr, {higherBetter: true})],
      ["op time", timed ? F.time(A.opTime) : "–", timed ? F.time(B.opTime) : "–", timed ? change(A.opTime, B.opTime, {lowerBetter: true}) : ["", ""]],
      ["ops", sig(A.nOps), sig(B.nOps), change(A.nOps, B.nOps)],
    ];
    if (num(A.peak) || num(B.peak)) head.push(["step memory peak", F.bytes(A.peak), F.bytes(B.peak), change(A.peak, B.peak)]);
    const basis = timed ? "measured op time" : "expected kernel time";
    el.append(h("div", {class: "basis", text: la + " → " + lb + " · " + basis + " · layers: self time, all phases, largest change first"}));
    const ht = h("table", {class: "t", id: "diff-headline"});
    ht.append(h("tr", {}, h("th", {text: ""}), h("th", {class: "n", text: la}), h("th", {class: "n", text: lb}), h("th", {class: "n", text: "change"})));
    for (const [n, va, vb, [c, cls]] of head) ht.append(h("tr", {"data-figure": n}, h("td", {text: n}), h("td", {class: "n", text: va}), h("td", {class: "n", text: vb}), h("td", {class: "n " + cls, text: c})));
    el.append(h("div", {style: "max-width:760px"}, ht, notes.length ? h("ul", {class: "muted"}, notes.map((n) => h("li", {text: n}))) : null));
    const wrap = h("div", {class: "grid2 even", style: "margin:10px 0 0"});
    /* a row's change is coloured when it is over 1% and over the steps' noise floor (their times' own spread) */
    const floor = Math.max(A.noiseFloor || 0, B.noiseFloor || 0);
    const real = (r, ratio) => ratio != null && Math.abs(ratio - 1) >= NOISE_REL && Math.abs(r.d) >= floor;
    const signedMs = (d) => (d >= 0 ? "+" : "") + sig(d * 1e3);
    const tim = (rows, key) => { const m = new Map(); for (const x of rows || []) m.set(key(x), timed ? (x.measured_s || 0) : x.expected_s); return m; };
    for (const [title, kind, keyf, id] of [["Layers", "layer", (x) => x.layer, "diff-layers"], ["Op classes", "category", (x) => x.name, "diff-classes"]]) {
      const ta = tim((a.rows || {})[kind], keyf), tbm = tim((b.rows || {})[kind], keyf);
      const names = [...new Set([...ta.keys(), ...tbm.keys()])].sort();
      const rows = names.map((n) => ({name: n, a: ta.get(n), b: tbm.get(n), d: (tbm.get(n) || 0) - (ta.get(n) || 0)})).sort((x, y) => Math.abs(y.d) - Math.abs(x.d));
      const t = h("table", {class: "t", id});
      t.append(h("tr", {}, ["name", la + " ms", lb + " ms", "change ms", lb + "/" + la].map((c, i) => h("th", {class: i ? "n" : null, text: c}))));
      for (const r of rows.slice(0, 12)) {
        const ratio = r.a && r.b != null ? r.b / r.a : null;
        t.append(h("tr", {}, h("td", {class: "mono", text: r.name || "(root)"}), h("td", {class: "n", text: F.ms(r.a)}), h("td", {class: "n", text: F.ms(r.b)}),
          h("td", {class: "n " + (!real(r, ratio) ? "" : r.d < 0 ? "chg-good" : r.d > 0 ? "chg-bad" : ""), text: signedMs(r.d)}), h("td", {class: "n", text: ratio != null ? F.ratio(ratio) : ""})));
      }
      if (rows.length > 12) {
        const rest = rows.slice(12), sum = (f) => rest.reduce((s1, r) => s1 + (f(r) || 0), 0);
        t.append(h("tr", {}, h("td", {class: "muted", text: "(" + rest.length + " more)"}), h("td", {class: "n", text: F.ms(sum((r) => r.a))}),
          h("td", {class: "n", text: F.ms(sum((r) => r.b))}), h("td", {class: "n", text: signedMs(sum((r) => r.d))}), h("td", {})));
      }
      wrap.append(h("div", {}, h("h2", {text: title + " (" + basis + ")"}), h("div", {class: "scroll", style: "max-height:300px"}, t)));
    }
    el.append(wrap);
  }

  /* ---------- start ---------- */
  async function start() {
    skeleton();
    startPolling();
    let idx;
    try { idx = await API.runs(); } catch (e) { banner("err", "cannot read the run list: " + esc(e)); return; }
    S.runs = (idx && idx.runs) || [];
    if (!S.runs.length) {
      banner("hint", idx && idx.hint ? esc(idx.hint) : "No tscope data here. Add the callback to your Trainer: <code>Trainer(callbacks=[tscope_callbacks.RooflineCallback()])</code>; each profiled step is written to <code>&lt;log_dir&gt;/tscope/step_&lt;N&gt;.json</code>.");
      return;
    }
    const bad = S.runs.flatMap((r) => r.steps.filter((x) => x.readable === false).map((x) => r.run + " " + stepLabel(x) + ": " + (x.error || "unreadable")));
    const withSteps = S.runs.find((r) => r.steps.some((x) => x.readable !== false)) || S.runs[0];
    await selectRun(withSteps.run);
    if (bad.length && !$("#banner").textContent) banner("err", "Unreadable step files (the rest is shown):<br>" + bad.map(esc).join("<br>"));
  }
  /* ---------- TensorBoard mode: new steps of a run still training appear on their own ---------- */
  const POLL_MS = 10000;
  const stepsKey = (r) => r ? r.steps.map((x) => x.stage + ":" + x.step + ":" + (x.readable !== false)).join(",") : "";
  async function poll() {
    let idx;
    try { idx = await API.runs(); } catch (e) { return false; }
    const runs = (idx && idx.runs) || [];
    if (!runs.length) return false;
    if (!S.runs.length || S.rep == null && !S.run) { S.runs = runs; $("#banner").innerHTML = ""; const w = runs.find((r) => r.steps.some((x) => x.readable !== false)) || runs[0]; await selectRun(w.run); return true; }
    const before = S.runs.find((r) => r.run === S.run), after = runs.find((r) => r.run === S.run);
    const changed = stepsKey(before) !== stepsKey(after) || runs.map((r) => r.run).join("\n") !== S.runs.map((r) => r.run).join("\n");
    S.runs = runs;
    if (!changed) return false;
    /* the selectors gain the new steps; the user's run, step and diff stay selected */
    fillSelectors();
    if (stepsKey(before) !== stepsKey(after)) drawSeries();
    if (S.step == null && after) { const ok = after.steps.filter((x) => x.readable !== false); const last = ok[ok.length - 1]; if (last) { S.stage = last.stage; S.step = last.step; fillSelectors(); await loadStep(); } }
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
})();
