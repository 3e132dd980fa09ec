"""Headless Chromium for the browser tests (selenium): one way to start it, and one rule for when it is missing.

Missing selenium, ``chromium`` or ``chromedriver`` skips the test with the reason (Debian: ``apt-get install -y
chromium chromium-driver``; ``pip install selenium``), unless ``TSCOPE_REQUIRE_BROWSER=1`` (set by ``.ci/run`` once the
browser is installed) makes it a failure."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

__all__ = ["CHROMIUM", "CHROMEDRIVER", "browser_missing", "chromium", "requested", "wait"]

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"


def browser_missing() -> str | None:
    """Why no headless browser can run here (None: it can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for exe, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.path.exists(exe):
            return f"{exe} not found (apt-get install -y {pkg}; .ci/run installs it when run as root)"
    return None


@contextmanager
def chromium(width: int = 1440, height: int = 1800, console: bool = False) -> Iterator[Any]:
    """A headless Chromium webdriver (quit on exit); ``console``: keep the page's console messages
    (``driver.get_log("browser")``) and every request it makes (:func:`requested`). Skips (or fails, under
    TSCOPE_REQUIRE_BROWSER=1) when there is none."""
    why = browser_missing()
    if why:
        if os.environ.get("TSCOPE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"TSCOPE_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(f"browser tests need headless Chromium: {why}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              f"--window-size={width},{height}"):
        opts.add_argument(a)
    if console:
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    opts.binary_location = CHROMIUM
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    d.set_page_load_timeout(60)
    try:
        yield d
    finally:
        d.quit()


def requested(driver: Any) -> list[str]:
    """The URLs the browser requested since the last call (a ``chromium(console=True)`` driver): every page,
    script, style sheet, font and image, loaded or failed, from DevTools' network events."""
    import json

    out = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            out.append(msg["params"]["request"]["url"])
    return out


def wait(d: Any, cond: Any, what: str = "the page", timeout: float = 20) -> Any:
    """``cond(d)``'s first true value within ``timeout`` s. An element found by one check and re-rendered by the page
    before the next (stale) or not there yet counts as "not yet", as on a slow machine it often is."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(d, timeout, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
                         ).until(cond, f"waited {timeout:.0f} s for {what}")
