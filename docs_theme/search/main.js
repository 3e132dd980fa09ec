// The site's search, run in the page itself: no Web Worker and no XMLHttpRequest, neither of which a browser allows
// for a site opened from disk (file://). The index is a script (search/search_index.js, written at build time by
// docs_theme/hooks.py from the search plugin's search_index.json), lunr.js is the search plugin's own copy. Replaces
// the plugin's search/main.js (the theme's custom_dir comes first).
(function () {
  "use strict";
  var MIN_LENGTH = 3;
  var index = null;
  var docs = {};
  var pageTitles = {};  // page file -> its title (a section's result names its page)

  function joinUrl(base, path) {
    if (path.charAt(0) === "/") return path;
    return base.charAt(base.length - 1) === "/" ? base + path : base + "/" + path;
  }

  function escapeHtml(value) {
    return value.replace(/&/g, "&amp;").replace(/"/g, "&quot;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function loadScript(path, done) {
    var s = document.createElement("script");
    s.src = joinUrl(base_url, path);
    s.onload = done;
    s.onerror = function () { console.error("search: could not load " + path); };
    document.head.appendChild(s);
  }

  function build(data) {
    MIN_LENGTH = (data.config && data.config.min_search_length) || MIN_LENGTH;
    if (data.config && data.config.separator) lunr.tokenizer.separator = new RegExp(data.config.separator);
    index = lunr(function () {
      this.field("title");
      this.field("text");
      this.ref("location");
      for (var i = 0; i < data.docs.length; i++) {
        var doc = data.docs[i];
        doc.text = doc.text.replace(/\u00b6/g, "");  // the headings' permalink signs
        this.add(doc);
        docs[doc.location] = doc;
        if (doc.location.indexOf("#") < 0) pageTitles[doc.location] = doc.title;
      }
    });
  }

  function find(query) {
    try {
      return index.search(query);
    } catch (e) {  // lunr's query syntax (field:term, ~, ^) misread: search the words alone
      return index.search(query.replace(/[:~^*+-]/g, " "));
    }
  }

  function show(results) {
    var box = document.getElementById("mkdocs-search-results");
    while (box.firstChild) box.removeChild(box.firstChild);
    if (!results.length) {
      var none = box.getAttribute("data-no-results-text") || "No results found";
      box.insertAdjacentHTML("beforeend", "<p>" + escapeHtml(none) + "</p>");
      return;
    }
    var seen = {};
    for (var i = 0; i < results.length; i++) {
      var doc = docs[results[i].ref];
      var page = doc.location.split("#")[0];
      var pageTitle = pageTitles[page] || "";
      if (seen[page + "\n" + doc.title]) continue;  // a page and its first heading: one result
      seen[page + "\n" + doc.title] = true;
      var title = pageTitle && pageTitle !== doc.title ? doc.title + " \u2014 " + pageTitle : doc.title;
      var summary = doc.text.length > 200 ? doc.text.substring(0, 200) + "\u2026" : doc.text;
      box.insertAdjacentHTML("beforeend", '<article><h3><a href="' + escapeHtml(joinUrl(base_url, doc.location)) +
        '">' + escapeHtml(title) + "</a></h3><p>" + escapeHtml(summary) + "</p></article>");
    }
  }

  function search() {
    var query = document.getElementById("mkdocs-search-query").value.trim();
    if (index === null) return;
    if (query.length < MIN_LENGTH) {
      show([]);
      return;
    }
    show(find(query));
  }

  function termFromLocation() {
    var m = /[?&]q=([^&]*)/.exec(window.location.search);
    return m ? decodeURIComponent(m[1].replace(/\+/g, "%20")) : "";
  }

  loadScript("search/lunr.js", function () {
    loadScript("search/search_index.js", function () {
      build(window.tscopeSearchIndex);
      var input = document.getElementById("mkdocs-search-query");
      if (!input) return;
      input.addEventListener("input", search);
      var term = termFromLocation();
      if (term) {
        input.value = term;
      }
      search();
      document.documentElement.setAttribute("data-search-ready", "1");
    });
  });
})();
