"""A logger whose records never carry a traceback: a library's ``log.exception`` (aiohttp's
"Error handling request", bolt's "Failed to run a request listener") becomes one line naming
the exception, and a request the HTTP parser refused is not quoted in it."""

from __future__ import annotations

import logging
import re

# Where a parser's message starts quoting the request (``b'Authorization: Bearer …'``,
# ``bytearray(b'/runs/…?sig=…')``, ``'GET …'``): a client's fault is logged up to there, as
# the line it refused may carry a credential (a bearer token, a signed link's signature).
_QUOTED = re.compile(r"""\s*:?\s*(?:bytearray\()?b?['"]""")


class OneLine(logging.Filter):
    """Folds a record's exception into its message, on one line. A client's fault (an HTTP
    error under 500, as aiohttp's parser raises, or a connection the client dropped) is a
    warning; anything else keeps its level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info:
            return True
        exc = record.exc_info[1]
        record.exc_info, record.exc_text = None, None
        said = " ".join(str(exc).split())
        client = 400 <= getattr(exc, "code", 0) < 500
        if client and (quoted := _QUOTED.search(said)):
            said = f"{said[: quoted.start()]} (the request's text is not logged)"
        record.msg = f"{record.getMessage()}: {type(exc).__name__}: {said[:300]}"
        record.args = None
        if client or isinstance(exc, ConnectionError):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        # The logger let the error through; the warning it may now be obeys its level too.
        return logging.getLogger(record.name).isEnabledFor(record.levelno)


def one_line(name: str) -> logging.Logger:
    """The logger ``name``, with ``OneLine`` on it (once)."""
    logger = logging.getLogger(name)
    if not any(isinstance(f, OneLine) for f in logger.filters):
        logger.addFilter(OneLine())
    return logger
