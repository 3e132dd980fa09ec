"""The documentation site works opened from disk (``file://``) and offline, as ``make docs`` says to open it.

The site is built once (``mkdocs build --strict``: a broken link or anchor fails). Nothing it loads comes from the
network: no script, style sheet, font, image or frame from a URL (a static scan of every page, style sheet and script,
and in Chromium the page's own list of what it loaded: every resource is a ``file://`` URL). Search works from disk
(the index is a script, the search runs in the page: a browser refuses a Web Worker and XHR to a file:// page) and
code is highlighted at build time by Pygments (no highlight.js from a CDN)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import chromium, requested

ROOT = Path(__file__).resolve().parents[1]

#: a tag that loads what its src/href/... names (an <a> link loads nothing; neither does <link rel="canonical">)
_TAG = re.compile(r"<(script|link|img|iframe|frame|source|audio|video|embed|object|track|input)\b([^>]*)>", re.I | re.S)
_ATTR = re.compile(r"""\b(src|href|data|srcset|poster)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.I)
_CSS_URL = re.compile(r"""(?:url\(\s*["']?|@import\s+["'])([^"')\s]+)""", re.I)
#: a script that fetches, imports or injects a URL literal
_JS_LOAD = re.compile(r"""(?:importScripts|fetch|\.open|import)\s*\(\s*(?:"GET",\s*)?["'`]((?:https?:)?//[^"'`]+)["'`]"""
                      r"""|\.src\s*=\s*["'`]((?:https?:)?//[^"'`]+)["'`]""", re.I)


def _remote(url: str) -> bool:
    return bool(re.match(r"(?:[a-z][a-z0-9+.-]*:)?//", url.strip(), re.I)) and not url.strip().lower().startswith(
        ("file:", "data:"))


def network_references(site: Path) -> list[str]:
    """``file: what`` for every resource of the built site that would be fetched from the network."""
    out = []
    for path in sorted(site.rglob("*")):
        if path.suffix not in (".html", ".css", ".js"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        name = path.relative_to(site).as_posix()
        if path.suffix == ".html":
            for tag, attrs in _TAG.findall(text):
                if tag.lower() == "link" and re.search(r"""rel\s*=\s*["']?(canonical|alternate)""", attrs, re.I):
                    continue
                for m in _ATTR.finditer(attrs):
                    urls = [u.split()[0] for u in (m.group(2) or m.group(3) or m.group(4) or "").split(",") if u.strip()]
                    out += [f"{name}: <{tag} {m.group(1)}={u}>" for u in urls if _remote(u)]
            for style in re.findall(r"<style\b[^>]*>(.*?)</style>|\bstyle\s*=\s*\"([^\"]*)\"", text, re.I | re.S):
                out += [f"{name}: style url {u}" for u in _CSS_URL.findall("".join(style)) if _remote(u)]
        elif path.suffix == ".css":
            out += [f"{name}: url {u}" for u in _CSS_URL.findall(text) if _remote(u)]
        else:
            out += [f"{name}: loads {a or b}" for a, b in _JS_LOAD.findall(text)]
    return out


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("docs") / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_mkdocs_builds_strict(site: Path) -> None:
    assert (site / "glossary.html").is_file()  # pages as files: the site browses from disk
    assert (site / "search" / "search_index.js").is_file() and (site / "css" / "pygments.css").is_file()


def test_the_built_site_references_nothing_on_the_network(site: Path) -> None:
    assert network_references(site) == []


def test_the_scan_finds_what_a_cdn_would_load(tmp_path: Path) -> None:
    (tmp_path / "css").mkdir()
    (tmp_path / "page.html").write_text(
        '<link rel="canonical" href="https://example.org/page.html"><a href="https://example.org">a link</a>\n'
        '<script src="https://cdnjs.cloudflare.com/ajax/libs/highlight.js/11.8.0/highlight.min.js"></script>\n'
        "<link href='//fonts.googleapis.com/css?family=Lato' rel=stylesheet><img src=http://example.org/x.png>\n"
        '<div style="background: url(https://example.org/bg.png)"></div><img src="img/local.png">')
    (tmp_path / "css" / "a.css").write_text('@import "https://fonts.example/x.css"; .a{background:url(../img/x.png)}'
                                            ' .b{background:url("data:image/svg+xml,<svg xmlns=\'http://www.w3.org/2000/svg\'/>")}')
    (tmp_path / "a.js").write_text('// see https://example.org\nimportScripts("https://cdn.example/lunr.js");')
    found = network_references(tmp_path)
    assert len(found) == 6, found
    assert any("highlight.min.js" in f for f in found) and any("fonts.googleapis.com" in f for f in found)
    assert any("fonts.example" in f for f in found) and any("cdn.example/lunr.js" in f for f in found)


def test_search_and_highlighting_work_opened_from_disk(site: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    pages = sorted(p for p in site.glob("*.html") if p.name != "404.html")  # 404.html: a web server's page
    with chromium(1280, 900, console=True) as d:
        for page in pages:  # every page loads only files, and says nothing in its console
            d.get(page.as_uri())
            loaded = requested(d)
            assert len(loaded) > 5 and all(u.startswith("file://") for u in loaded), (page.name, loaded)
            errors = [e["message"] for e in d.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
            assert errors == [], (page.name, errors)
        d.get((site / "index.html").as_uri())
        WebDriverWait(d, 20).until(lambda d: d.execute_script(
            "return document.documentElement.getAttribute('data-search-ready')") == "1")
        d.find_element(By.CSS_SELECTOR, "[data-bs-target='#mkdocs_search_modal']").click()
        box = WebDriverWait(d, 10).until(lambda d: d.find_element(By.ID, "mkdocs-search-query"))
        WebDriverWait(d, 10).until(lambda d: box.is_displayed())
        box.send_keys("roofline")
        results = WebDriverWait(d, 10).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#mkdocs-search-results article h3 a"))
        hrefs = [a.get_attribute("href") for a in results]
        titles = [a.text for a in results]
        assert len(set(titles)) == len(titles), titles  # a page and its first heading are one result
        assert len(hrefs) >= 5 and all(h.startswith("file://") for h in hrefs), hrefs
        assert any("reading-the-report.html" in h for h in hrefs), hrefs
        results[0].click()  # a result opens its page, from disk
        WebDriverWait(d, 10).until(lambda d: d.current_url != (site / "index.html").as_uri())
        assert d.current_url.startswith("file://") and d.find_element(By.CSS_SELECTOR, "h1").text
        box = None
        # a word no page has: "No results found"
        d.get((site / "index.html").as_uri() + "?q=zzqxjv")
        WebDriverWait(d, 20).until(lambda d: "No results found" in d.find_element(By.ID, "mkdocs-search-results").text)
        # code blocks: Pygments' spans, coloured by its style sheet (a keyword is not the text colour)
        d.get((site / "getting-started.html").as_uri())
        kw = d.find_element(By.CSS_SELECTOR, ".codehilite .kn, .codehilite .k")
        text = d.find_element(By.CSS_SELECTOR, ".codehilite pre")
        assert kw.value_of_css_property("color") != text.value_of_css_property("color")
        d.save_screenshot(str(tmp_path / "getting-started.png"))
