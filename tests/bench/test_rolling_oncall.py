"""How the rolling restart's on-call (``bench.rolling.on_call``) decides what the restarts left:
an uncertain effect, and the approval a Retry of it asks again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.rolling import Fleet, Mention, Tally, on_call


class Thread:
    """One gated mention's thread: its approval card (approved already), a card of an uncertain
    effect, and, once on-call answers it Retry, a second approval card, as Kestrel posts it."""

    approver = "U0APPROVER"

    def __init__(self) -> None:
        self.approvals = ["approval-1"]
        self.settled: list[tuple[str, bool]] = []
        self.approved: list[str] = []
        self.done = asyncio.Event()

    def env(self) -> dict[str, str]:
        return {}

    def attach(self, fleet: Fleet) -> None:
        return

    async def ready(self, replicas: int) -> None:
        return

    async def mention(self, mention: Mention, tally: Tally) -> None:
        return

    async def approve(self, mention: Mention, tally: Tally) -> None:
        return

    def approval_cards(self, mention: Mention) -> list[str]:
        return list(self.approvals)

    async def approve_card(self, mention: Mention, card: str, tally: Tally) -> None:
        self.approved.append(card)
        self.done.set()

    def effect_cards(self, mention: Mention) -> list[str]:
        return ["effect-1"]

    async def settle_effect(self, mention: Mention, card: str, ran: bool, tally: Tally) -> None:
        self.settled.append((card, ran))
        if not ran:
            self.approvals.append("approval-2")

    def answered(self, mention: Mention) -> bool:
        return False

    def count(self, mentions: list[Mention], tally: Tally) -> None:
        return


async def test_the_approval_a_retry_asks_again_is_approved(tmp_path: Path) -> None:
    thread, mention, tally = Thread(), Mention(0, "deploy m000", gated=True), Tally()
    # The command never recorded a run: on-call answers Retry.
    deciding = asyncio.create_task(on_call(thread, [mention], tmp_path / "none.txt", tally))
    try:
        await asyncio.wait_for(thread.done.wait(), 30)
    finally:
        deciding.cancel()
        await asyncio.gather(deciding, return_exceptions=True)
    assert thread.settled == [("effect-1", False)]
    assert thread.approved == ["approval-2"]  # the first was ``approve``'s
    assert mention.retried == 1 and tally.uncertain == 1
