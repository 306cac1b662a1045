"""``bot.logs``: one handler, one level, and the loggers held above or below it."""

from __future__ import annotations

import io
import json
import logging

import pytest

from bot import logs


@pytest.mark.parametrize("level", [logging.WARNING, logging.ERROR])
def test_serve_says_who_it_is_at_any_level(level: int) -> None:
    stream = io.StringIO()
    logs.configure(level, "json", stream)
    logging.getLogger(logs.SERVICE).info("kestrel serving as %s", "host:1:abc")
    logging.getLogger("kestrel.policy").info("what only info shows")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["level"], line["logger"], line["message"]) for line in lines] == [
        ("info", logs.SERVICE, "kestrel serving as host:1:abc")
    ]


def test_serve_speaks_at_debug_when_asked() -> None:
    stream = io.StringIO()
    logs.configure(logging.DEBUG, "text", stream)
    logging.getLogger(logs.SERVICE).debug("more")
    assert f"DEBUG {logs.SERVICE}: more" in stream.getvalue()
