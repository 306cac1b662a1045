"""OpenTelemetry spans when ``opentelemetry-api`` is installed, a no-op otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import trace as _trace
except ImportError:  # the API is optional: without it every span is a no-op
    _trace = None  # type: ignore[assignment]


class Span:
    """The little of a span the core uses: attributes set after it started."""

    def __init__(self, inner: Any = None) -> None:
        self._inner = inner

    def set(self, key: str, value: str | int | float | bool) -> None:
        """Record one attribute."""
        if self._inner is not None:
            self._inner.set_attribute(key, value)


@contextlib.contextmanager
def span(name: str, **attributes: str | int | float | bool) -> Iterator[Span]:
    """One span named ``kestrel.<name>`` around the block."""
    if _trace is None:
        yield Span()
        return
    tracer = _trace.get_tracer("kestrel")
    with tracer.start_as_current_span(f"kestrel.{name}", attributes=attributes) as inner:
        yield Span(inner)
