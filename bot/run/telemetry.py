"""OpenTelemetry spans when ``opentelemetry-api`` is installed, a no-op otherwise."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from typing import Any


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
_PROVIDER_VARIABLE = "OTEL_PYTHON_TRACER_PROVIDER"


def span(
    name: str, **attributes: str | int | float | bool
) -> contextlib.AbstractContextManager[Span]:
    """One span named ``kestrel.<name>`` around the block (a shared no-op when not recording)."""
    trace = _recording()
    if trace is None:
        return _NULL
    return _recorded(trace, name, attributes)


@contextlib.contextmanager
def _recorded(
    trace: Any, name: str, attributes: dict[str, str | int | float | bool]
) -> Iterator[Span]:
    tracer = trace.get_tracer("kestrel")
    with tracer.start_as_current_span(f"kestrel.{name}", attributes=attributes) as inner:
        yield Span(inner)


@functools.cache
def _recording() -> Any:
    """The API's ``trace`` module if an SDK installed a tracer provider, else None (looked up
    once: install it before any run)."""
    # A provider is installed through the API (imported by whoever installs it) or named by
    # OTEL_PYTHON_TRACER_PROVIDER; with neither, no span records and the API (some 10 ms
    # to import) is not imported.
    if "opentelemetry.trace" not in sys.modules and not os.environ.get(_PROVIDER_VARIABLE):
        return None
    try:
        from opentelemetry import trace
    except ImportError:  # the API is optional: without it every span is a no-op
        return None
    provider = trace.get_tracer_provider()
    recording = type(provider).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider")
    return trace if recording else None
