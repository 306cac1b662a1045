"""How the page tests find and start a real browser: Chromium, headless, driven by Playwright.

The browser is ``KESTREL_CHROMIUM`` (a path or a command name) when set, else the first of
``chromium``, ``chromium-browser`` and ``google-chrome`` on ``PATH`` (Debian's ``chromium``
package installs ``/usr/bin/chromium``; ``.ci/run`` installs it). Playwright drives that
executable; its own downloaded browsers are not used. When there is none, or Playwright cannot
start it, the tests skip and say why.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.async_api import Browser

VARIABLE = "KESTREL_CHROMIUM"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
MISSING = "no Chromium: install Debian's chromium package or set KESTREL_CHROMIUM (CI installs it)"
ARGS = ("--no-sandbox",)  # as root in a container Chromium's sandbox cannot start


def chromium_path() -> str | None:
    """The browser's executable: ``KESTREL_CHROMIUM`` first, else the first candidate on
    ``PATH``; None when there is none (or ``KESTREL_CHROMIUM`` names nothing executable)."""
    configured = os.environ.get(VARIABLE, "").strip()
    if configured:
        return shutil.which(configured)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def missing_reason() -> str:
    """Why there is no browser, in a sentence."""
    configured = os.environ.get(VARIABLE, "").strip()
    if configured:
        return f"{VARIABLE}={configured!r} is not an executable; {MISSING}"
    return f"{MISSING} (looked for {', '.join(CANDIDATES)} on PATH)"


@asynccontextmanager
async def browser(path: str | None = None) -> AsyncIterator[Browser]:
    """A headless Chromium (``path``, else ``chromium_path()``) driven by Playwright; closed
    on the way out. Raises if there is none or it does not start (``browser_or_skip`` skips)."""
    from playwright.async_api import async_playwright

    executable = path or chromium_path()
    if executable is None:
        raise RuntimeError(missing_reason())
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=list(ARGS)
        )
        try:
            yield launched
        finally:
            await launched.close()


@asynccontextmanager
async def browser_or_skip() -> AsyncIterator[Browser]:
    """``browser()``, or the test skips saying why: no Chromium, no Playwright, or Playwright
    could not start the one found."""
    path = chromium_path()
    if path is None:
        pytest.skip(missing_reason())
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        pytest.skip("playwright is not installed: pip install -e '.[dev]'")
    async with AsyncExitStack() as stack:
        try:
            launched = await stack.enter_async_context(browser(path))
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            pytest.skip(f"Playwright could not start Chromium at {path}: {first}")
        yield launched
