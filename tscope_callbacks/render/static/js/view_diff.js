/* The step diff panel: draws the diff the Python analysis computed (analysis/diff.py StepDiff.to_dict(), served by
   the plugin's `diff` route or inline in a standalone page). Nothing is computed here: the figures, their texts and
   each change's verdict (better / worse / within the steps' noise) come with the diff. */
"use strict";
const {h, clear} = require("./dom.js");

const VERDICT_CLASS = {better: "chg-good", worse: "chg-bad", noise: "chg-noise"};
const VERDICT_TITLE = {noise: "within the steps' noise", unknown: "the steps' noise was not measured"};

function empty(text) { clear("#diff").append(h("div", {class: "empty", text})); }

function error(text) { clear("#diff").append(h("div", {class: "banner err", text})); }

function changeCell(x) {
  const title = (VERDICT_TITLE[x.verdict] || "") + (x.noise_text ? (VERDICT_TITLE[x.verdict] ? ": " : "noise ") + "±" + x.noise_text : "");
  return h("td", {class: "n " + (VERDICT_CLASS[x.verdict] || ""), "data-verdict": x.verdict || null, title: title || null},
    x.change || "");
}

function table(id, title, part, la, lb) {
  const t = h("table", {class: "t", id});
  t.append(h("tr", {}, ["name", la + " ms", lb + " ms", "change ms", "ratio (B/A)"].map((c, i) => h("th", {class: i ? "n" : null, text: c}))));
  for (const r of part.rows) {
    t.append(h("tr", {"data-name": r.name}, h("td", {class: "mono", text: r.name || "(root)"}), h("td", {class: "n", text: r.a}), h("td", {class: "n", text: r.b}),
      changeCell(r), h("td", {class: "n", text: r.ratio_text})));
  }
  if (part.more) {
    const m = part.more;
    t.append(h("tr", {class: "more"}, h("td", {class: "muted", text: "(" + m.n + " more)"}), h("td", {class: "n", text: m.a}),
      h("td", {class: "n", text: m.b}), h("td", {class: "n", text: m.change}), h("td", {class: "n", text: m.ratio_text || ""})));
  }
  return h("div", {}, h("h2", {text: title}), h("div", {class: "scroll", style: "max-height:300px"}, t));
}

/** draw diff `d` (a before -> after) */
function draw(d) {
  const el = clear("#diff");
  if (!d || d.error) { error((d && d.error) || "no diff"); return; }
  const [la, lb] = d.labels;
  el.append(h("div", {class: "basis", text: la + " → " + lb + " · " + d.basis + " · layers: self time, all phases, largest change first · " +
    "coloured: a change beyond the steps' noise (~: within it)"}));
  const ht = h("table", {class: "t", id: "diff-headline"});
  ht.append(h("tr", {}, h("th", {text: ""}), h("th", {class: "n", text: la}), h("th", {class: "n", text: lb}), h("th", {class: "n", text: "change"}), h("th", {class: "n", text: "noise"})));
  for (const x of d.headline) {
    ht.append(h("tr", {"data-figure": x.figure}, h("td", {text: x.figure}), h("td", {class: "n", text: x.a_text}), h("td", {class: "n", text: x.b_text}),
      changeCell(x), h("td", {class: "n muted", text: x.noise_text ? "±" + x.noise_text : ""})));
  }
  el.append(h("div", {style: "max-width:820px"}, ht, d.notes.length ? h("ul", {class: "muted", id: "diff-notes"}, d.notes.map((n) => h("li", {text: n}))) : null));
  el.append(h("div", {class: "grid2 even", style: "margin:10px 0 0"},
    table("diff-layers", d.layers.title, d.layers, la, lb), table("diff-classes", d.classes.title, d.classes, la, lb)));
}

module.exports = {draw, empty, error};
