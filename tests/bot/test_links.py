"""Signed run links: one run, until they expire, and nothing else; the same message, the
same link; and chat messages carry them when pages are public."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from adapters.discord.look import DiscordLook
from adapters.slack.look import SlackLook
from bot.chat.links import LinkSigner, run_links
from bot.chat.service import RequestView
from bot.domain import Request, RequestKind, RequestStatus, RunStatus, StopReason, TerminalResult

SECRET = "a-secret-of-enough-bytes"
NOW = 1_900_000_000.0


def _signer(now: float = NOW) -> LinkSigner:
    return LinkSigner(SECRET, 3600, clock=lambda: now)


def _parts(link: str) -> tuple[str, str, str]:
    path, _, query = link.partition("?")
    fields = dict(part.split("=") for part in query.split("&"))
    return path.rsplit("/", 1)[1], fields["exp"], fields["sig"]


def test_a_link_opens_its_run_until_it_expires_and_no_other() -> None:
    run, exp, sig = _parts(_signer().link("https://k.example", "run_1"))
    assert _signer().valid(run, exp, sig)
    assert not _signer().valid("run_2", exp, sig)
    assert not _signer().valid(run, str(int(exp) + 60), sig)
    assert not _signer().valid(run, exp, sig[:-1] + ("0" if sig[-1] != "0" else "1"))
    assert not _signer(NOW + 3601).valid(run, exp, sig)
    assert not LinkSigner("another-secret-of-bytes", 3600, clock=lambda: NOW).valid(run, exp, sig)


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        LinkSigner("short", 60)


def test_no_public_url_or_no_secret_means_no_links() -> None:
    assert run_links(None, _signer()) is None
    assert run_links("https://k.example", None) is None


def _view() -> RequestView:
    request = Request(
        run_id="run_1",
        kind=RequestKind.WAIT_APPROVAL,
        call_id="call_1",
        tool="restart_service",
        arguments={"service": "checkout"},
        requested_by="U1",
    )
    return RequestView(request, RequestStatus.OPEN, None, ("U2",), "why")


def _urls(body: Any) -> list[str]:
    import json
    import re

    return re.findall(r"https://k\.example/runs/run_1\?exp=\d+&sig=[0-9a-f]+", json.dumps(body))


@pytest.mark.parametrize("look_type", [SlackLook, DiscordLook])
def test_cards_and_answers_carry_one_stable_link(look_type: Any) -> None:
    link = run_links("https://k.example", _signer())
    look = look_type(link)
    view = _view()
    card = look.card(view)
    assert len(_urls(card)) == 1
    assert look.card(view) == card  # rendered again: the same body, so no edit is made
    result = TerminalResult(status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED, text="ok")
    answer = look.answer(result, "run_1", datetime.fromtimestamp(NOW, UTC))
    assert len(_urls(answer[0])) == 1
    assert _urls(look_type(None).card(view)) == []


@pytest.mark.parametrize(("exp", "sig"), [("²", "0" * 64), ("1" * 40, "0" * 64), ("9", "é" * 64)])
def test_malformed_links_are_not_valid(exp: str, sig: str) -> None:
    assert not _signer().valid("run_1", exp, sig)
