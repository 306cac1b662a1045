"""A logger whose records never carry a traceback: a library's ``log.exception`` (aiohttp's
"Error handling request", bolt's "Failed to run a request listener") becomes one line naming
the exception."""

from __future__ import annotations

import logging


class OneLine(logging.Filter):
    """Folds a record's exception into its message, on one line. A client's fault (an HTTP
    error under 500, as aiohttp's parser raises, or a connection the client dropped) is a
    warning; anything else keeps its level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info:
            return True
        exc = record.exc_info[1]
        record.exc_info, record.exc_text = None, None
        said = " ".join(str(exc).split())[:300]
        record.msg = f"{record.getMessage()}: {type(exc).__name__}: {said}"
        record.args = None
        if isinstance(exc, ConnectionError) or 400 <= getattr(exc, "code", 0) < 500:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        # The logger let the error through; the warning it may now be obeys its level too.
        return logging.getLogger(record.name).isEnabledFor(record.levelno)


def one_line(name: str) -> logging.Logger:
    """The logger ``name``, with ``OneLine`` on it (once)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, OneLine) for f in logger.filters):
        logger.addFilter(OneLine())
    return logger
