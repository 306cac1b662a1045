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


def test_the_schedulers_per_tick_lines_are_debug_only() -> None:
    # serve's sweeps run every poll_seconds (1 s): at info (the chart's and the unit's level)
    # APScheduler's executor said "Running job …" and "… executed successfully" for each,
    # four lines a second. They are heard at debug; its warnings and errors at every level.
    executor = logging.getLogger("apscheduler.executors.default")
    stream = io.StringIO()
    logs.configure(logging.INFO, "text", stream)
    executor.info('Running job "Supervisor.adopt_orphans"')
    executor.warning("Run time of job was missed by 0:00:02")
    assert "Running job" not in stream.getvalue() and "missed" in stream.getvalue()
    stream = io.StringIO()
    logs.configure(logging.DEBUG, "text", stream)
    executor.info('Running job "Supervisor.adopt_orphans"')
    assert "Running job" in stream.getvalue()
