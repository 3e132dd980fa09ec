/* The layer tree panel: a table of the module tree, opened level by level; a click on a name toggles its children,
   a double click lists its ops. */
"use strict";
const {num, F} = require("./fmt.js");
const {$, h, clear} = require("./dom.js");
const {buildTree, nodeTimes, barTimes, treeScale, topRows, openDepth, nanFlags} = require("./tree.js");
const {timed} = require("./report.js");

const KIDS_SHOWN = 100, MAX_OPEN_ROWS = 120;
const NOT_MEASURED = "not measured in this step: per-layer memory needs a profile with layer details";
const COLS = ["layer", "", "fwd self ms", "fwd total ms", "bwd self ms", "bwd total ms", "FLOPs", "bytes", "mem fwd", "mem bwd", "params", "in shapes", "out shapes", "grad shapes", "NaN/Inf"];
const COL_TITLES = {"in shapes": "input shapes", "out shapes": "output shapes", "grad shapes": "gradient output shapes (hover a cell: input gradients)", "NaN/Inf": "non-finite outputs or gradients"};

function draw(r, ctx) {
  const untimed = !timed(r);
  const tree = buildTree(r);
  const T = {tree, untimed, scale: treeScale(tree, untimed), ctx};
  const el = clear("#tree");
  $("#tree-basis").textContent = (untimed ? "expected kernel time per layer, forward / backward, self and total (total includes children): an estimate, nothing was timed; bar = total expected time (blue fwd, orange bwd)" :
    "forward / backward op time, self (the layer's own ops) and total (with its sub-layers), " + stepsText(r) + "; bar = total time (blue fwd, orange bwd)") +
    "; FLOPs and bytes = forward + backward (recompute and the optimizer's update are not in them: the report's totals add them)" +
    "; memory = the bytes the layer's forward / backward added (allocator readings on CUDA, tracked live storages on CPU)" +
    ((r.layers || []).some((L) => !num(L.memory_fwd_bytes)) ? " (not measured in this step: –)" : "");
  const tb = h("table", {class: "t", id: "tree-table"});
  const head = (c) => untimed && / ms$/.test(c) ? c.replace(" ms", " ms, expected") : c;  /* an estimate says so in its headers */
  tb.append(h("tr", {}, COLS.map((c, i) => h("th", {class: i >= 2 && i <= 10 ? "n" : null, text: head(c), title: COL_TITLES[c] || null}))));
  el.append(tb);
  const rows = topRows(tree);
  const depth = openDepth(rows, MAX_OPEN_ROWS, KIDS_SHOWN);
  for (const n of rows) insertNode(T, tb, null, n, 0, depth);
  ctx.S.tree = T;
}

/* the steps the layer times are of: each layer x phase time is the median over the roofline's merged steps (one
   step: that step's) -- a LayerProfilerCallback's table and scalars are one step's, so they may differ */
function stepsText(r) {
  const m = ((r.context || {}).merged_steps || []).filter((s) => s != null);
  if (m.length > 1) return "median of steps " + m.join(", ");
  return r.step != null ? "step " + r.step + " only" : "one step";
}

/* layer times: in an untimed step, the expected kernel time, marked as such (never the hooks' unmeasured zeros) */
function timeCell(T, v) {
  if (T.untimed) return h("td", {class: "n muted est", "data-expected": "1", title: "expected kernel time (untimed step: layer times not measured)", text: F.ms(v)});
  return h("td", {class: "n", text: F.ms(v)});
}

/* a memory figure: "–" with the reason when it was not measured (null), never a 0 that was not measured */
function memCell(v, peak) {
  if (!num(v)) return h("td", {class: "n muted", "data-unmeasured": "1", title: NOT_MEASURED, text: "–"});
  return h("td", {class: "n", title: num(peak) ? "peak above the start: " + F.bytes(peak) : null, text: F.bytes(v)});
}

function treeRow(T, n, depth) {
  const L = n.info || {}, t = nodeTimes(n, T.untimed), bar = barTimes(n, T.untimed);
  const fw = Math.min(100, bar.f / T.scale * 100), bw = Math.min(100 - fw, bar.b / T.scale * 100);
  const flops = num(L.flops_fwd) ? L.flops_fwd + (L.flops_bwd || 0) : (n.row ? n.row.flops : null);
  const bytes = num(L.bytes_fwd) ? L.bytes_fwd + (L.bytes_bwd || 0) : (n.row ? n.row.bytes : null);
  const nan = nanFlags(L);
  const name = n.path === "" ? "(root)" : n.path.slice(n.path.lastIndexOf(".") + 1);
  const shapes = (sh) => F.shapes(sh);
  const tr = h("tr", {class: "tree-row", "data-path": n.path, "data-depth": depth, title: n.path || "(root)"},
    h("td", {}, h("div", {class: "nm", style: "padding-left:" + depth * 14 + "px"},
      h("span", {class: "tg", text: n.kids.length ? "▸" : ""}), h("span", {class: "p", text: name}), h("span", {class: "ty", text: L.type || (n.row && n.row.type) || ""}))),
    h("td", {}, h("span", {class: "tbar", title: F.time(bar.f + bar.b)}, h("span", {class: "f", style: "left:0;width:" + fw.toFixed(1) + "%"}),
      h("span", {class: "b", style: "left:" + fw.toFixed(1) + "%;width:" + bw.toFixed(1) + "%"}))),
    timeCell(T, t.fs), timeCell(T, t.ft), timeCell(T, t.bs), timeCell(T, t.bt),
    h("td", {class: "n", text: F.flops(flops)}), h("td", {class: "n", text: F.bytes(bytes)}),
    memCell(L.memory_fwd_bytes, L.peak_fwd_bytes), memCell(L.memory_bwd_bytes, L.peak_bwd_bytes),
    h("td", {class: "n", text: num(L.num_parameters) ? F.count(L.num_parameters, "") : "–"}),
    h("td", {class: "mono muted", text: shapes(L.input_shapes), title: shapes(L.input_shapes) || null}),
    h("td", {class: "mono muted", text: shapes(L.output_shapes), title: shapes(L.output_shapes) || null}),
    h("td", {class: "mono muted", text: shapes(L.grad_output_shapes), title: L.grad_input_shapes && L.grad_input_shapes.length ? "grad input: " + shapes(L.grad_input_shapes) : null}),
    h("td", {class: nan.length ? "flag" : "muted", text: nan.length ? "✖ " + nan.join(", ") : ""}));
  tr.__node = n;
  tr.__open = false;
  if (n.kids.length) tr.firstChild.addEventListener("click", () => toggle(T, tr));
  tr.addEventListener("dblclick", () => T.ctx.showLayerOps(n.path));
  return tr;
}

function insertNode(T, tb, after, n, depth, open) {
  const tr = treeRow(T, n, depth);
  if (after) after.after(tr); else tb.append(tr);
  return depth < open && n.kids.length ? expand(T, tr, open) : tr;
}

function expand(T, tr, open) {
  const n = tr.__node, depth = +tr.getAttribute("data-depth");
  tr.__open = true;
  tr.querySelector(".tg").textContent = "▾";
  tr.classList.add("open");
  let last = tr;
  const show = (from) => {
    const upto = Math.min(n.kids.length, from + KIDS_SHOWN);
    for (let i = from; i < upto; i++) last = insertNode(T, null, last, n.kids[i], depth + 1, open || 0);
    if (upto < n.kids.length) {
      const more = h("tr", {class: "tree-more", "data-depth": depth + 1},
        h("td", {colspan: COLS.length}, h("div", {class: "nm", style: "padding-left:" + (depth + 1) * 14 + "px"},
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

function toggle(T, tr) { if (tr.__open) collapse(tr); else expand(T, tr, 0); }

/** expand every level (open) or collapse to the top row */
function all(ctx, open) {
  const T = ctx.S.tree, first = $("#tree-table .tree-row");
  if (!T || !first) return;
  collapse(first);
  if (open) expand(T, first, 99);
}

module.exports = {draw, all};
