"""Structured events that adapters render and logs record."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("kestrel.events")


@dataclass(frozen=True)
class Event:
    """One thing that happened in a run: ``kind`` names it, ``data`` carries its facts."""

    kind: str
    run_id: str
    data: dict[str, Any] = field(default_factory=dict)


class EventSink(Protocol):
    """Receives events; must not block the run's task."""

    def emit(self, event: Event) -> None:
        """Deliver one event."""
        ...


class LogSink:
    """An event sink that writes each event to the ``kestrel.events`` logger."""

    def emit(self, event: Event) -> None:
        """Log the event at debug level."""
        log.debug("%s %s %s", event.run_id, event.kind, event.data)


class FanOut:
    """Delivers each event to several sinks; a failing sink cannot stop the others or the run."""

    def __init__(self, *sinks: EventSink) -> None:
        self._sinks = list(sinks)

    def add(self, sink: EventSink) -> None:
        """Subscribe one more sink."""
        self._sinks.append(sink)

    def emit(self, event: Event) -> None:
        """Deliver to every sink, logging (not raising) a sink's failure."""
        for sink in self._sinks:
            try:
                sink.emit(event)
            except Exception:
                log.exception("event sink %r failed on %s", sink, event.kind)
