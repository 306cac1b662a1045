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


_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.IGNORECASE | re.DOTALL)
_HIDDEN = re.compile(r"<(script|style)\b.*?</\1\s*>|<!--.*?-->", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
# A proxy's page says what went wrong near its top; the rest is not read.
_PAGE_CHARS = 64 * 1024


def _page_text(text: str) -> str:
    """A proxy's HTML error page as what it says (its title, else its text): its markup,
    a long head of styles above all, left the line with no cause in it."""
    if not text.lstrip().startswith("<"):
        return text
    page = text[:_PAGE_CHARS]
    title = _TITLE.search(page)
    if title and title.group(1).strip():
        return html.unescape(title.group(1))
    return html.unescape(_TAG.sub(" ", _HIDDEN.sub(" ", page)))
