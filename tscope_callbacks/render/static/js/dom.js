/* The few DOM helpers every view uses: h() builds an HTML element, s() an SVG one, $() finds one. */
"use strict";

const $ = (sel, el) => (el || document).querySelector(sel);

/** h("div", {class: "x", text: "...", onclick: f}, child, [children], ...): null/false attributes and children
    are skipped; "text" sets textContent, "html" innerHTML (only for markup the page built itself) */
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) {
    const v = attrs[k];
    if (v == null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k === "html") e.innerHTML = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of kids.flat(Infinity)) if (c != null && c !== false) e.append(c.nodeType ? c : String(c));
  return e;
}

const SVGNS = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...kids) {
  const e = document.createElementNS(SVGNS, tag);
  for (const k in attrs || {}) if (attrs[k] != null) e.setAttribute(k, attrs[k]);
  for (const c of kids.flat(Infinity)) if (c != null) e.append(c.nodeType ? c : String(c));
  return e;
}

/** empty `el` (found by selector when a string) and return it */
function clear(el) {
  if (typeof el === "string") el = $(el);
  el.innerHTML = "";
  return el;
}

module.exports = {$, h, s, clear};
