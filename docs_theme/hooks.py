"""mkdocs hooks that make the built site work opened from disk (file://) and offline.

- Code highlighting at build time: Pygments (the ``codehilite`` extension in mkdocs.yml) marks the code up; this hook
  writes the style sheet, ``css/pygments.css``. The theme's highlight.js, which loads from a CDN, is off.
- Search without a worker or XHR (a browser refuses both for file:// pages): the search plugin's index is also
  written as a script, ``search/search_index.js``, which ``docs_theme/search/main.js`` loads with a script tag.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pygments.formatters import HtmlFormatter

#: the Pygments style of the code blocks (light, like the theme)
STYLE = "friendly"


def on_post_build(config: Any, **kwargs: Any) -> None:
    site = Path(config["site_dir"])
    css = site / "css" / "pygments.css"
    css.parent.mkdir(parents=True, exist_ok=True)
    css.write_text(HtmlFormatter(style=STYLE).get_style_defs(".codehilite") + "\n", encoding="utf-8")
    search = config["plugins"].get("search")
    if search is not None:
        data = json.loads(search.search_index.generate_search_index())
        out = site / "search" / "search_index.js"
        out.parent.mkdir(parents=True, exist_ok=True)
        # "</" never ends the script early: the index holds the pages' text
        text = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
        out.write_text(f"window.tscopeSearchIndex = {text};\n", encoding="utf-8")
