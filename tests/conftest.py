"""What every test shares: a cache home of the session's own, and the logging set-up each test
starts from."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

from bot import logs

# Where Kestrel keeps files between processes: the kept folder (bot.kept) and the isolation
# probe's markers (bot.tools.isolation).
_HOMES = ("XDG_CACHE_HOME", "XDG_RUNTIME_DIR")


def pytest_configure(config: pytest.Config) -> None:
    """This session's processes, the commands it starts included, keep files in a folder of
    its own: thousands of settings files, catalogs and probes leave nothing in the developer's
    cache, and find nothing of an earlier run."""
    folder = tempfile.mkdtemp(prefix="kestrel-test-cache-")
    for name in _HOMES:
        os.environ[name] = folder
    _bytecode_kept_in(folder)


def _bytecode_kept_in(folder: str) -> None:
    """With PYTHONDONTWRITEBYTECODE, every ``kestrel`` and Python process the suite starts
    compiled Kestrel's sources again: byte code is kept in the session's folder instead, never
    beside the sources (as ``bench.startup`` does). The xdist workers inherit the controller's
    environment, and so share its folder."""
    if not sys.dont_write_bytecode:
        return
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    prefix = os.path.join(folder, "pycache")
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.pycache_prefix = prefix
    sys.dont_write_bytecode = False


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's folder goes with it."""
    folders = {os.environ.pop(name, "") for name in _HOMES}
    for folder in folders - {""}:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """Undo what a command run in-process set up (``logs.configure``: the root's level and
    handlers, the libraries' levels): a one-shot command raises the root to ERROR, and a later
    test on the same worker would otherwise never see the warnings it asserts on."""
    root = logging.getLogger()
    names = [*logs.LIBRARIES, *logs.QUIETER, *logs.LOUDER, "discord.client"]
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
