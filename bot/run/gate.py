"""The confirm gate and its grants: default-deny in front of every gated call."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bot.domain import (
    ArgumentOrigin,
    Decision,
    DecisionKind,
    Grant,
    GrantKind,
    Request,
    RequestKind,
    RequestMaker,
    call_digest,
)
from bot.prompter import Prompter
from bot.tools.base import Tool


@dataclass(frozen=True)
class GateVerdict:
    """Allowed, refused with a reason the model can read, or deferred on a request."""

    allowed: bool
    reason: str = ""
    request: Request | None = None


_UNSEEN = (
    "refused: an argument of this command was taken from a tool's output, and no one is "
    "present to see where it came from and approve it"
)


class Gate:
    """Decides whether a gated call may run now, asking the prompter when no grant covers it.

    A grant is honoured from the moment it is given but only staged; ``flush`` hands the
    staged grants over to be journaled after the triggering call is answered or deferred.
    """

    def __init__(
        self,
        new_request: RequestMaker,
        prompter: Prompter | None,
        expired: Callable[[], bool],
        written: Iterable[Grant] = (),
        answers: Mapping[str, Decision] | None = None,
    ) -> None:
        self._new_request = new_request
        self._prompter = prompter
        self._expired = expired
        self._answers = dict(answers or {})
        self._standing: set[str] = set()
        self._one_shot: set[tuple[str, str]] = set()
        self._staged: list[Grant] = []
        for grant in written:
            self._honour(grant)

    async def check(
        self,
        call_id: str,
        original: Tool,
        effective: Tool,
        arguments: dict[str, Any],
        origins: tuple[ArgumentOrigin, ...] = (),
        *,
        must_see: bool = False,
    ) -> GateVerdict:
        """The gate's verdict for one call; the caller has established that it is gated.

        ``origins`` (arguments taken from tool output) go on the request; ``must_see``: only a
        decision on this very call, made on a card that showed them, lets it run (a standing
        grant does not).
        """
        tool = effective
        digest = call_digest(tool.name, arguments)
        answer = self._answers.get(call_id)
        if answer is None and (self._prompter is None or not self._prompter.present):
            if must_see:
                return GateVerdict(False, _UNSEEN)
            return GateVerdict(False, "refused: this command needs approval and no one is present")
        if self._expired():
            return GateVerdict(False, "refused: the run's deadline has passed")
        if original.flags.approval.deny or tool.flags.approval.deny:
            return GateVerdict(False, f"refused: policy never allows {tool.name}")
        standing = tool.name in self._standing and not must_see
        if standing or (call_id, digest) in self._one_shot:
            return GateVerdict(True)
        request = self._request(call_id, tool, arguments, digest, origins)
        decision = answer if answer is not None else await self._ask(request)
        if decision is None:
            return GateVerdict(False, "waiting for approval", request)
        return self._decide(decision, tool.name, call_id, digest)

    def decided(self, call_id: str) -> bool:
        """Whether a person already decided on call ``call_id``: that decision stands, even if
        the call would not be asked about now (the configuration or its origins changed)."""
        return call_id in self._answers

    def flush(self) -> list[Grant]:
        """Hand over the staged grants (to be journaled) and forget them."""
        staged, self._staged = self._staged, []
        return staged

    async def _ask(self, request: Request) -> Decision | None:
        assert self._prompter is not None
        return await self._prompter.ask(request)

    def _request(
        self,
        call_id: str,
        tool: Tool,
        arguments: dict[str, Any],
        digest: str,
        origins: tuple[ArgumentOrigin, ...],
    ) -> Request:
        return self._new_request(
            RequestKind.WAIT_APPROVAL,
            call_id,
            tool.name,
            arguments,
            digest=digest,
            prompt=tool.description,
            approvals_needed=max(1, tool.flags.approval.approvals),
            origins=origins,
        )

    def _decide(self, decision: Decision, tool: str, call_id: str, digest: str) -> GateVerdict:
        if decision.kind is DecisionKind.APPROVE:
            self._stage(
                Grant(
                    kind=GrantKind.ONE_SHOT,
                    tool=tool,
                    call_id=call_id,
                    digest=digest,
                    by=decision.by,
                )
            )
            return GateVerdict(True)
        if decision.kind is DecisionKind.APPROVE_ALWAYS:
            self._stage(Grant(kind=GrantKind.STANDING, tool=tool, by=decision.by))
            return GateVerdict(True)
        if decision.kind is DecisionKind.EXPIRED:
            return GateVerdict(
                False, "refused: the approval request expired before anyone answered"
            )
        who = f" by {decision.by}" if decision.by else ""
        why = f": {decision.text}" if decision.text else ""
        return GateVerdict(False, f"denied{who}{why}")

    def _stage(self, grant: Grant) -> None:
        self._honour(grant)
        self._staged.append(grant)

    def _honour(self, grant: Grant) -> None:
        if grant.kind is GrantKind.STANDING:
            self._standing.add(grant.tool)
        else:
            self._one_shot.add((grant.call_id, grant.digest))
