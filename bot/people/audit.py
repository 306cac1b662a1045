"""What the audit says of a request and of a decision: the call as people read it (tool and
arguments, with the digest that ties it to the journal), and what a person typed (a deny
reason, an answer, an output), redacted as every other text a run keeps."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Final

from bot.domain import ArgumentOrigin, Decision, DecisionKind, Request

# Arguments longer than this are cut in the audit (the digest names the exact call).
ARGUMENTS_SHOWN: Final = 400
# What a decision's text is, by the kind of decision that carries it.
_TEXT_LABELS: Final = {
    DecisionKind.DENY: "reason",
    DecisionKind.ANSWER: "answer",
    DecisionKind.DONE: "output",
    DecisionKind.FAILED: "output",
}

Redact = Callable[[str], str]


def unchanged(text: str) -> str:
    """No redaction: the PII guard is off."""
    return text


# ``json.dumps(..., sort_keys=True, ensure_ascii=False)``'s text from one encoder, where that
# call builds one for every value it writes.
_SHOWN: Final = json.JSONEncoder(sort_keys=True, ensure_ascii=False)


def call_text(tool: str, arguments: dict[str, Any], digest: str = "") -> str:
    """``restart_service {"service": "checkout"} (digest 7cca…)``, the arguments cut if long."""
    shown = _SHOWN.encode(arguments)
    if len(shown) > ARGUMENTS_SHOWN:
        shown = shown[: ARGUMENTS_SHOWN - 1] + "…"
    return f"{tool} {shown}" + (f" (digest {digest})" if digest else "")


def asked_text(request: Request) -> str:
    """What a request asks about: its call, or a plan's steps with the plan's digest."""
    if not request.steps:
        return call_text(request.tool, request.arguments, request.digest)
    steps = "; ".join(call_text(step.tool, step.arguments) for step in request.steps)
    return f"plan of {len(request.steps)} steps: {steps} (plan digest {request.digest})"


def request_detail(request: Request, *, inline: bool = False) -> str:
    """The audit's detail of a request opened (asked at the terminal, when ``inline``)."""
    asked = f"{asked_text(request)}{_shown_origins(request)}"
    return f"{request.kind.value} {asked}" + (" (inline)" if inline else "")


def origins_text(origins: Sequence[ArgumentOrigin]) -> str:
    """``unit from read_log (call c1, line 3), …``: where arguments came from, in one line."""
    return ", ".join(
        f"{o.argument} from {o.tool} (call {o.call_id}, line {o.line})" for o in origins
    )


def _shown_origins(request: Request) -> str:
    """The audit keeps that a request (or a plan's steps) showed where arguments came from."""
    origins = [*request.origins, *(o for step in request.steps for o in step.origins)]
    return f"; taken from tool output: {origins_text(origins)}" if origins else ""


def decision_detail(
    request: Request, decision: Decision, redact: Redact = unchanged, *, inline: bool = False
) -> str:
    """The audit's detail of a decision on ``request``: the call (or the plan), then what the
    person said."""
    detail = asked_text(request) + _shown_origins(request)
    said = decision.text.strip()
    if said:
        label = _TEXT_LABELS.get(decision.kind, "text")
        detail += f"; {label}: {' '.join(redact(said).split())}"
    return detail + (" (inline)" if inline else "")
