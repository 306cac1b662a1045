"""The outbox's keys (which message of a thread each one is) and the bodies that say a
message is owed: what the store writes beside a run's end or a request's opening, apart from
the delivering (``bot.chat.outbox``), which a process that only writes them never imports."""

from __future__ import annotations

from typing import Any


def answer_key(run_id: str, part: int = 0) -> str:
    """The outbox key of a run's answer (``part`` > 0: its continuations)."""
    return f"answer:{run_id}" if part == 0 else f"answer:{run_id}:{part}"


def owed_answer(run_id: str) -> dict[str, Any]:
    """The platform-neutral body a run's end writes at its answer's key: the answer is owed."""
    return {"owed": "answer", "run_id": run_id}


def owed_card(request_id: str) -> dict[str, Any]:
    """The platform-neutral body a request's opening writes at its card's key: it is owed."""
    return {"owed": "card", "request_id": request_id}


def owed_reminder(request_id: str) -> dict[str, Any]:
    """The platform-neutral body a request's reminder writes at its key: the reminder is owed
    (whichever replica reminded, one serving no platform of the thread's too)."""
    return {"owed": "reminder", "request_id": request_id}


def owed_of(body: dict[str, Any]) -> tuple[str, str] | None:
    """What ``body`` says is owed ("answer" and the run's id, or "card" or "reminder" and the
    request's); None for a body to show as it is."""
    kind = body.get("owed")
    if kind == "answer":
        return "answer", str(body.get("run_id") or "")
    if kind in ("card", "reminder"):
        return str(kind), str(body.get("request_id") or "")
    return None


def card_key(request_id: str) -> str:
    """The outbox key of a request's card (approval, question, uncertain effect)."""
    return f"card:{request_id}"


def card_request(key: str) -> str | None:
    """The request whose card ``key`` is (what ``card_key`` was given); None for another key."""
    kind, _, request_id = key.partition(":")
    return request_id if kind == "card" and request_id else None


def status_key(run_id: str) -> str:
    """The outbox key of a run's status message, edited in place as it progresses."""
    return f"status:{run_id}"


def reminder_key(request_id: str) -> str:
    """The outbox key of the reminder that a request still waits."""
    return f"remind:{request_id}"
