"""What every test shares: the logging set-up each test starts from."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from bot import logs


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Undo what a command run in-process set up (``logs.configure``: the root's level and
    handlers, the libraries' levels): a one-shot command raises the root to ERROR, and a later
    test on the same worker would otherwise never see the warnings it asserts on."""
    root = logging.getLogger()
    names = [*logs.LIBRARIES, *logs.QUIETER, "discord.client"]
    kept = [(logging.getLogger(name), logging.getLogger(name).level) for name in names]
    propagate = [(logger, logger.propagate) for logger, _ in kept]
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers
    for logger, was in kept:
        logger.setLevel(was)
    for logger, was in propagate:
        logger.propagate = was
