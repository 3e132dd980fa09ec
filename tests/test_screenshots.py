"""Every screenshot of the README and docs/ is made by ``make screenshots`` (scripts/screenshots.py) from the code it
shows, and is newer than that code.

``docs/screenshots.json`` holds, per PNG, the files of the code it shows (globs), their SHA-256 when the picture was
made, and the PNG's SHA-256. A change to any of those files (the dashboard's template, JavaScript or CSS, the plot, the
report table) or a PNG replaced by hand fails here: run ``make screenshots``, look at the pictures, commit them."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import screenshots as shots  # noqa: E402

MANIFEST = json.loads((ROOT / "docs" / shots.MANIFEST).read_text())["screenshots"]


def _referenced() -> set[str]:
    """The PNGs the README and the docs pages show."""
    out = set()
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        out |= {Path(p).name for p in re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", page.read_text())}
    return out


def test_every_picture_is_made_by_the_script() -> None:
    committed = {p.name for p in (ROOT / "docs").glob("*.png")}
    assert _referenced() <= committed, "a page shows a PNG that docs/ does not have"
    assert committed == set(shots.SOURCES) == set(MANIFEST), (
        "docs/*.png, scripts/screenshots.py's SOURCES and docs/screenshots.json must name the same pictures")
    assert committed <= _referenced(), f"pictures no page shows: {sorted(committed - _referenced())}"


def test_no_picture_is_older_than_the_code_it_shows() -> None:
    stale, edited = [], []
    for name, entry in sorted(MANIFEST.items()):
        assert entry["sources"] == shots.SOURCES[name], f"{name}: the manifest's sources are not the script's"
        assert shots.source_files(entry["sources"]), f"{name}: its sources match no file"
        changed = shots.changed_sources(entry["files"], entry["sources"])
        if changed:
            stale.append(f"{name} ({', '.join(changed[:3])}{f' and {len(changed) - 3} more' if len(changed) > 3 else ''}"
                         " changed since)")
        if shots.file_digest(ROOT / "docs" / name) != entry["png_sha256"]:
            edited.append(name)
    assert not stale, ("screenshots older than the code they show: " + "; ".join(stale)
                       + ". Run `make screenshots`, look at every PNG, commit them with docs/screenshots.json")
    assert not edited, f"PNGs not made by `make screenshots` (their hash is not the manifest's): {edited}"


def test_the_digest_sees_a_change(tmp_path: Path) -> None:
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "page.js").write_text("draw();\n")
    (tmp_path / "page.py").write_text("TEMPLATE = 1\n")
    globs = ["static/**/*", "page.py"]
    recorded = shots.source_hashes(globs, tmp_path)
    assert sorted(recorded) == ["page.py", "static/page.js"] and shots.changed_sources(recorded, globs, tmp_path) == []
    (tmp_path / "static" / "more.js").write_text("export {};\n")  # a new module in the static dir
    (tmp_path / "page.py").write_text("TEMPLATE = 2\n")
    (tmp_path / "static" / "page.js").unlink()
    assert shots.changed_sources(recorded, globs, tmp_path) == ["+static/more.js", "-static/page.js", "page.py"]
