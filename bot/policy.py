"""Authorization: who may start runs, approve which tools, answer questions, operate runs.

Identities are the platform's immutable user and group ids; a button's payload is never trusted
for who may do what, only this policy and the store are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from bot.kinds import DecisionKind, RequestKind

# Types only: ``kestrel runs pending`` decides who may answer without importing the models.
if TYPE_CHECKING:
    from bot.domain import Request
    from bot.tools.base import ToolFlags

EVERYONE = "*"


@dataclass(frozen=True)
class PolicyRules:
    """``policy:`` in kestrel.yaml: platform ids (never names) that may start runs, approve
    which tools (by name, ``tag:TAG`` or ``*``), answer questions, and operate runs."""

    # Read by pydantic, which validates this section of the settings: unknown keys are errors.
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    requesters: list[str] = field(default_factory=lambda: [EVERYONE])
    approvers: dict[str, list[str]] = field(default_factory=lambda: {EVERYONE: [EVERYONE]})
    answerers: list[str] = field(default_factory=list)
    oncall: list[str] = field(default_factory=list)
    self_approval: bool = False


class Asked(Protocol):
    """What the policy reads of a request to say who may answer it."""

    @property
    def kind(self) -> RequestKind: ...
    @property
    def tool(self) -> str: ...
    @property
    def requested_by(self) -> str: ...


class NotPermitted(Exception):
    """The policy refuses an action; the message names who may take it."""


@dataclass(frozen=True)
class Actor:
    """Someone acting: their user id, the groups they belong to, the channel they act in, and
    whether they come from outside the workspace (a shared channel's guest)."""

    user: str
    groups: frozenset[str] = field(default_factory=frozenset)
    channel: str = ""
    external: bool = False

    def matches(self, principals: list[str]) -> bool:
        """Whether any principal (user id, ``group:ID``, ``channel:ID``, ``*``) names this actor.

        Someone from another workspace is named only by their own user id: ``*``, a channel
        or a group of ours never lets a guest in by accident.
        """
        if self.external:
            return self.user in principals
        for principal in principals:
            if principal in (EVERYONE, self.user):
                return True
            kind, _, ident = principal.partition(":")
            if kind == "group" and ident in self.groups:
                return True
            if kind == "channel" and ident == self.channel and self.channel:
                return True
        return False


_KINDS_FOR = {
    RequestKind.WAIT_APPROVAL: {
        DecisionKind.APPROVE,
        DecisionKind.APPROVE_ALWAYS,
        DecisionKind.DENY,
    },
    RequestKind.WAIT_USER: {DecisionKind.ANSWER},
    RequestKind.WAIT_EFFECT: {DecisionKind.RETRY, DecisionKind.DONE, DecisionKind.FAILED},
}


class Policy:
    """The rules of ``policy:`` in kestrel.yaml."""

    def __init__(self, settings: PolicyRules) -> None:
        self.settings = settings

    def may_start(self, actor: Actor) -> bool:
        """Whether ``actor`` may start a run."""
        return actor.matches(self.settings.requesters)

    def may_operate(self, actor: Actor) -> bool:
        """On-call: may resume, cancel and settle uncertain effects."""
        return actor.matches(self.settings.oncall)

    def check_operate(self, actor: Actor, verb: str, run_id: str, requested_by: str) -> str:
        """Empty when ``actor`` may ``verb`` (cancel, resume) the run: its requester, or
        on-call; else why not."""
        if (requested_by and actor.user == requested_by) or self.may_operate(actor):
            return ""
        requester = f"its requester ({requested_by or 'none recorded'})"
        if self.settings.oncall:
            return f"{actor.user} may not {verb} run {run_id}: only {requester} or on-call may"
        return (
            f"{actor.user} may not {verb} run {run_id}: only {requester} may"
            " (policy.oncall is empty)"
        )

    def groups_named(self) -> frozenset[str]:
        """Every group id a principal of this policy names (``group:ID``)."""
        lists = [
            self.settings.requesters,
            self.settings.oncall,
            self.settings.answerers,
            *self.settings.approvers.values(),
        ]
        prefix = "group:"
        return frozenset(p[len(prefix) :] for ps in lists for p in ps if p.startswith(prefix))

    def notices(self) -> list[str]:
        """What people should know about this policy when it is loaded."""
        if self.settings.oncall:
            return []
        return [
            "policy.oncall is empty: an uncertain effect (wait_effect) can be settled only by"
            " the run's requester, and waits until deadlines.wait_effect (24 h by default)"
        ]

    def answer_note(self, request: Asked) -> str:
        """Why the people who may answer ``request`` are who they are, when it is not obvious."""
        if request.kind is RequestKind.WAIT_EFFECT and not self.settings.oncall:
            return "the requester settles it: policy.oncall is empty"
        return ""

    def check_decision(
        self,
        actor: Actor,
        kind: DecisionKind,
        request: Request,
        flags: ToolFlags | None,
        *,
        inline: bool = False,
    ) -> str:
        """Empty when ``actor`` may decide ``kind`` on ``request``; else the reason they may not.

        ``inline``: decided at the terminal that runs Kestrel (``kestrel chat``). Its operator
        holds the configuration, so approving their own run is no escalation; the approver
        lists, the two-person rule and on-call still hold.
        """
        if kind not in _KINDS_FOR[request.kind]:
            return f"{kind.value} is not an answer to a {request.kind.value} request"
        if request.kind is RequestKind.WAIT_APPROVAL:
            if inline and kind is not DecisionKind.DENY and request.approvals_needed > 1:
                return (
                    f"{request.tool} needs {request.approvals_needed} approvers: approve with"
                    " `kestrel runs approve`, one person at a time"
                )
            return self._approval(actor, kind, request, flags, inline)
        if request.kind is RequestKind.WAIT_EFFECT:
            return self._settle(actor, request)
        return self._answer(actor, request)

    def who_may_answer(self, request: Asked, flags: ToolFlags | None) -> list[str]:
        """The principals that may answer ``request``, for people deciding who to ping."""
        if request.kind is RequestKind.WAIT_EFFECT:
            # Without on-call nobody else could settle it: the requester does.
            return list(self.settings.oncall) or _unique([request.requested_by])
        if request.kind is RequestKind.WAIT_USER:
            return _unique([request.requested_by, *self.settings.oncall, *self.settings.answerers])
        tags = flags.tags if flags else ()
        keys = [request.tool, *(f"tag:{tag}" for tag in tags), EVERYONE]
        return _unique([p for key in keys for p in self.settings.approvers.get(key, [])])

    def _approval(
        self,
        actor: Actor,
        kind: DecisionKind,
        request: Request,
        flags: ToolFlags | None,
        inline: bool,
    ) -> str:
        approver = self._approver_of(actor, request.tool, flags.tags if flags else ())
        if kind is DecisionKind.DENY:
            mine = actor.user == request.requested_by
            return "" if approver or mine else f"{actor.user} may not deny {request.tool}"
        if flags is not None and flags.deny:
            return f"policy never allows {request.tool}"
        mine = actor.user == request.requested_by
        if mine and not inline and not self._self_approval(request):
            return "you asked for this run: someone else must approve it"
        if not approver:
            return f"{actor.user} may not approve {request.tool}"
        if kind is DecisionKind.APPROVE_ALWAYS and request.approvals_needed > 1:
            return f"{request.tool} needs {request.approvals_needed} approvers for every call"
        return ""

    def _self_approval(self, request: Request) -> bool:
        # The two-person rule counts the requester as neither approver, whatever the setting.
        return self.settings.self_approval and request.approvals_needed <= 1

    def _approver_of(self, actor: Actor, tool: str, tags: tuple[str, ...]) -> bool:
        keys = [tool, *(f"tag:{tag}" for tag in tags), EVERYONE]
        return any(actor.matches(self.settings.approvers.get(key, [])) for key in keys)

    def _settle(self, actor: Actor, request: Request) -> str:
        if self.may_operate(actor):
            return ""
        if not self.settings.oncall:
            if request.requested_by and actor.user == request.requested_by:
                return ""
            return (
                "only the run's requester may settle an uncertain effect while policy.oncall"
                " is empty"
            )
        return "only on-call (policy.oncall) may settle an uncertain effect"

    def _answer(self, actor: Actor, request: Request) -> str:
        if actor.user == request.requested_by or self.may_operate(actor):
            return ""
        if actor.matches(self.settings.answerers):
            return ""
        return f"{actor.user} may not answer this question"


def _unique(principals: list[str]) -> list[str]:
    return [p for i, p in enumerate(principals) if p and p not in principals[:i]]
