"""Spans: recorded through a tracer provider installed before the first span, and with none
installed a no-op that does not even import the OpenTelemetry API."""

from __future__ import annotations

import json
import subprocess
import sys

# A provider of the API's own kind (the SDK is not installed): it records span names.
INSTALLED = """
import json
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext

names = []

class Recorder(trace.NoOpTracer):
    def start_span(self, name, *args, **kwargs):
        names.append(name)
        return NonRecordingSpan(SpanContext(1, 1, False))

class Provider(trace.TracerProvider):
    def get_tracer(self, *args, **kwargs):
        return Recorder()

trace.set_tracer_provider(Provider())
from bot.run.telemetry import span
with span("tool", tool="restart") as current:
    current.set("outcome", "ok")
print(json.dumps(names))
"""
NONE = """
import json, sys
from bot.run.telemetry import span
with span("tool", tool="restart") as current:
    current.set("outcome", "ok")
print(json.dumps([type(current).__name__, "opentelemetry" in sys.modules]))
"""


def fresh(code: str) -> object:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout)


def test_a_provider_installed_before_the_first_span_records_it() -> None:
    assert fresh(INSTALLED) == ["kestrel.tool"]


def test_without_a_provider_a_span_is_a_no_op_and_the_api_stays_unimported() -> None:
    assert fresh(NONE) == ["_NullSpan", False]
