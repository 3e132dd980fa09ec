/* The layer tree: module paths into a tree, each node's forward / backward times, how deep it opens. Pure. */
"use strict";
const {num} = require("./fmt.js");
const {timeOf, timed} = require("./report.js");

/** The tree of a report's layers: {path, info (the layer record), kids, self: {phase: seconds}, row (its layer
    row), inclRow}; a path's parent is its longest dotted prefix that is a node (else the root ""); children in
    path order, numbers compared as numbers (blocks.2 before blocks.10). */
function buildTree(r) {
  const nodes = new Map();
  const get = (path) => {
    if (!nodes.has(path)) nodes.set(path, {path, info: null, kids: [], self: {}, row: null, inclRow: null});
    return nodes.get(path);
  };
  for (const L of r.layers || []) get(L.path).info = L;
  const isTimed = timed(r);
  for (const x of (r.rows || {}).layer_phase || []) { const n = get(x.layer); n.self[x.phase] = (n.self[x.phase] || 0) + (timeOf(x, isTimed) || 0); }
  for (const x of (r.rows || {}).layer || []) get(x.layer).row = x;
  for (const x of (r.rows || {}).inclusive || []) get(x.layer).inclRow = x;
  get("");
  const depth = (p) => p.split(".").length;
  const paths = [...nodes.keys()].sort((a, b) => depth(a) - depth(b) || a.localeCompare(b, undefined, {numeric: true}));
  for (const p of paths) {
    if (p === "") continue;
    let q = p, parent = null;
    while (q.includes(".")) { q = q.slice(0, q.lastIndexOf(".")); if (nodes.has(q)) { parent = nodes.get(q); break; } }
    (parent || nodes.get("")).kids.push(nodes.get(p));
  }
  return nodes.get("");
}

/** an untimed step's (an estimate's) layer times: the expected kernel time of its own ops' rows (self) and with its
    children's (total); the hooks timed nothing, so their zeros are not used */
function expectedTimes(n) {
  if (n._exp) return n._exp;
  let ft = n.self.forward || 0, bt = n.self.backward || 0;
  for (const k of n.kids) { const e = expectedTimes(k); ft += e.ft; bt += e.bt; }
  n._exp = {fs: n.self.forward || 0, bs: n.self.backward || 0, ft, bt};
  return n._exp;
}

/** a node's {fs, bs, ft, bt}: forward / backward self and total seconds (totals null where the layer has no
    record); `untimed`: the step is an estimate */
function nodeTimes(n, untimed) {
  if (untimed) return expectedTimes(n);
  const L = n.info || {};
  return {
    fs: num(L.self_forward_s) ? L.self_forward_s : (n.self.forward || 0),
    bs: num(L.self_backward_s) ? L.self_backward_s : (n.self.backward || 0),
    ft: num(L.forward_s) ? L.forward_s : null, bt: num(L.backward_s) ? L.backward_s : null,
  };
}

/** a node's forward and backward time for its bar: the totals where known, else self */
function barTimes(n, untimed) {
  const t = nodeTimes(n, untimed);
  return {f: t.ft != null ? t.ft : t.fs, b: t.bt != null ? t.bt : t.bs};
}

/** the time a full bar stands for: the root's step (forward + backward), or its largest child when that is more */
function treeScale(root, untimed) {
  const L = root.info || {};
  const stepT = (L.forward_s || 0) + (L.backward_s || 0);
  const kids = root.kids.map((k) => { const t = barTimes(k, untimed); return t.f + t.b; });
  return Math.max(stepT, ...kids, 1e-30);
}

/** the rows the table starts from: the root, or its only child when the root has no record of its own */
const topRows = (root) => root.kids.length === 1 && !root.info ? [root.kids[0]] : [root];

/** how many levels open at first: level by level while the table stays within `maxRows` rows (a 1000-layer model
    opens fast), at most 3; `shown`: the children listed per node before a "show more" row */
function openDepth(rows, maxRows, shown) {
  let depth = 1, count = 1, level = rows;
  for (let d = 1; d <= 3; d++) {
    const next = level.flatMap((n) => n.kids);
    if (!next.length || count + Math.min(next.length, shown * level.length) > maxRows) break;
    count += next.length; level = next; depth = d;
  }
  return depth;
}

/** the names of a layer's non-finite flags ("output", "grad_input", "grad_output") */
const nanFlags = (L) => ["nonfinite_output", "nonfinite_grad_input", "nonfinite_grad_output"].filter((k) => L && L[k]).map((k) => k.replace("nonfinite_", ""));

module.exports = {buildTree, nodeTimes, barTimes, treeScale, topRows, openDepth, nanFlags};
