"""What a model server's error body says, as text: its JSON's message, or a page's words."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any


def error_message(body: object) -> str:
    """The message of an error body (a decoded JSON object, or text); empty if it has none."""
    message = _body_message(body) if isinstance(body, dict) else body
    return _page_text(message) if isinstance(message, str) else ""


def _body_message(body: dict[str, Any]) -> object:
    """An error body's message: OpenAI's ``message``, else a Python server's ``detail``
    (FastAPI's is a list of ``{"loc": […], "msg": …}`` for a request it refused)."""
    if "message" in body:
        return body["message"]
    detail = body.get("detail")
    if isinstance(detail, list):
        return "; ".join(_problem(item) for item in detail)
    return detail


def _problem(item: object) -> str:
    if not isinstance(item, Mapping):
        return str(item)
    where = ".".join(str(part) for part in item.get("loc") or ())
    return f"{where}: {item.get('msg')}" if where else str(item.get("msg"))


# Each found from where the last left off, and a tag never holds a "<": a page of openers with
# no closer ("<title>" or "<!--" over and over) reads in linear time, where patterns running
# ".*?" to a closer from each opener took seconds of the event loop for a 64 KiB page.
_TITLE = re.compile(r"<title[^<>]*>", re.IGNORECASE)
_TITLE_END = re.compile(r"</title\s*>", re.IGNORECASE)
_HIDDEN = re.compile(r"<(?:(script|style)\b|!--)", re.IGNORECASE)
_HIDDEN_END = {
    "script": re.compile(r"</script\s*>", re.IGNORECASE),
    "style": re.compile(r"</style\s*>", re.IGNORECASE),
    "": re.compile(r"-->"),
}
_TAG = re.compile(r"<[^<>]*>")
# A proxy's page says what went wrong near its top; the rest is not read.
_PAGE_CHARS = 64 * 1024


def _page_text(text: str) -> str:
    """A proxy's HTML error page as what it says (its title, else its text): its markup,
    a long head of styles above all, left the line with no cause in it."""
    if not text.lstrip().startswith("<"):
        return text
    page = text[:_PAGE_CHARS]
    title = _title(page)
    if title.strip():
        return html.unescape(title)
    return html.unescape(_TAG.sub(" ", _visible(page)))


def _title(page: str) -> str:
    """The first title's text; empty without one, or when it is never closed."""
    start = _TITLE.search(page)
    end = _TITLE_END.search(page, start.end()) if start else None
    return page[start.end() : end.start()] if start and end else ""


def _visible(page: str) -> str:
    """The page without its scripts, styles and comments (an unclosed one hides the rest)."""
    parts: list[str] = []
    at = 0
    while (hidden := _HIDDEN.search(page, at)) is not None:
        parts.append(page[at : hidden.start()])
        end = _HIDDEN_END[(hidden.group(1) or "").lower()].search(page, hidden.end())
        if end is None:
            return " ".join(parts)
        at = end.end()
    parts.append(page[at:])
    return " ".join(parts)
