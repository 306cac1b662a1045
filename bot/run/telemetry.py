"""OpenTelemetry spans when ``opentelemetry-api`` is installed, a no-op otherwise."""

from __future__ import annotations

import contextlib
import functools
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


class _NullSpan(Span):
    """The span used when nothing records: a reusable no-op context manager."""

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _NullSpan()


def span(
    name: str, **attributes: str | int | float | bool
) -> contextlib.AbstractContextManager[Span]:
    """One span named ``kestrel.<name>`` around the block (a shared no-op when not recording)."""
    if _trace is None or not _recording():
        return _NULL
    return _recorded(name, attributes)


@contextlib.contextmanager
def _recorded(name: str, attributes: dict[str, str | int | float | bool]) -> Iterator[Span]:
    assert _trace is not None
    tracer = _trace.get_tracer("kestrel")
    with tracer.start_as_current_span(f"kestrel.{name}", attributes=attributes) as inner:
        yield Span(inner)


@functools.cache
def _recording() -> bool:
    """Whether an SDK installed a tracer provider (looked up once: install it before any run)."""
    assert _trace is not None
    provider = _trace.get_tracer_provider()
    return type(provider).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider")
