"""Authorization: who may start runs, approve which tools, answer questions, operate runs.

Identities are the platform's immutable user and group ids; a button's payload is never trusted
for who may do what, only this policy and the store are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import msgspec

from bot.kinds import DecisionKind, RequestKind
from bot.people.refusal import Refusal, acted_from
from bot.place import Place
from bot.plain import nearest, run_field_checks

# Types only: ``kestrel runs pending`` decides who may answer without importing the models;
# what the policy reads of a request and asks of a platform are protocols, for the type checker.
if TYPE_CHECKING:
    from bot.domain import Request
    from bot.tools.base import ToolFlags

    class AskedStep(Protocol):
        """What the policy reads of one step of a plan."""

        @property
        def tool(self) -> str: ...
        @property
        def gated(self) -> bool: ...

    class Asked(Protocol):
        """What the policy reads of a request to say who may answer it."""

        @property
        def kind(self) -> RequestKind: ...
        @property
        def tool(self) -> str: ...
        @property
        def requested_by(self) -> str: ...
        @property
        def approvals_needed(self) -> int: ...
        @property
        def steps(self) -> Sequence[AskedStep]: ...

    class Directory(Protocol):
        """What a platform tells about people, asked only when a check needs it; an error or a
        time-out is a no for that check alone (never cached)."""

        async def in_group(self, user: str, group: str) -> bool:
            """Whether ``user`` belongs to the group (a Slack user group, a Discord role)."""
            ...

        async def sees(self, user: str, place: Place) -> bool:
            """Whether ``user`` can see the channel of ``place``."""
            ...

        def untold(self) -> str:
            """What the platform did not say when asked for this action (an error, a time-out),
            which counted as no, in words ("Slack did not say who is in group:S0SRE"); "" when
            it said everything asked."""
            ...


EVERYONE = "*"
# How a refusal of the requester's approval of their own run begins (the two-person rule).
OWN_RUN = "you asked for this run: someone else must approve it"

# Each tool's flags by name, for the steps of a plan (None: no tool set at hand, no tags).
FlagsOf = Callable[[str], "ToolFlags | None"]


def no_flags(_tool: str) -> ToolFlags | None:
    """No tool's flags: approvers are named per tool and ``*`` only."""
    return None


def approval_keys(tool: str, tags: Sequence[str]) -> list[str]:
    """The keys of ``policy.approvers`` that name approvers of ``tool``: it, its tags, ``*``."""
    return [tool, *(f"tag:{tag}" for tag in tags), EVERYONE]


def approvers_of(rules: PolicyRules, tool: str, tags: Sequence[str]) -> list[str]:
    """The principals ``rules`` name to approve ``tool`` (with these tags), in key order."""
    return [p for key in approval_keys(tool, tags) for p in rules.approvers.get(key, [])]


def requester_approves(rules: PolicyRules, approvals_needed: int) -> bool:
    """Whether a run's requester may approve its request needing ``approvals_needed`` outside
    the terminal: with ``self_approval``, and one approval needed (the two-person rule counts
    the requester as neither of two)."""
    return rules.self_approval and approvals_needed <= 1


def principal_problem(principal: str) -> str:
    """Why ``principal`` as written can name nobody ("" when it can name someone): spaces
    around it, a kind misspelt or in capitals (``Group:S0SRE``), a kind with no id or with a
    name, a mention, a pattern or small letters for one (``channel:#ops``, ``group:*``,
    ``channel:c0ops``), or a mention for a person's id. Matching no one, it would refuse
    everyone the check it is in."""
    if principal != principal.strip() or not principal:
        return "a principal has no spaces around it" if principal else "an empty principal"
    kind, colon, ident = principal.partition(":")
    if not colon:
        mention = principal != EVERYONE and principal.startswith(("<", "@", "#", "*"))
        return "name a person by their platform id, not a mention or a pattern" if mention else ""
    if kind in PRINCIPAL_KINDS:
        # Slack's ids are capitals and digits (C0123ABCD), Discord's digits: nothing else is one.
        if ident.isascii() and ident.isalnum() and ident == ident.upper():
            return ""
        return (
            f"{kind}:ID takes the platform's id (capitals and digits, C0123ABCD or"
            " 234567890123456789), not a name or a pattern"
        )
    known = list(PRINCIPAL_KINDS)
    near = kind.lower() if kind.lower() in known else nearest(kind.lower(), known)
    return f"did you mean {near}:{ident}?" if near else ""


def principals_as_written(rules: Mapping[str, Any]) -> dict[str, Any]:
    """``policy:`` as YAML read it, each whole number where a principal goes taken as the id
    it was written as: YAML reads a Discord id left unquoted (``oncall: [345678901234567890]``)
    as a number, and a snowflake never starts with a 0 that a number would drop."""
    written = dict(rules)
    for field in ("requesters", "answerers", "oncall"):
        if field in written:
            written[field] = _ids_as_written(written[field])
    approvers = written.get("approvers")
    if isinstance(approvers, Mapping):
        written["approvers"] = {key: _ids_as_written(who) for key, who in approvers.items()}
    return written


def _ids_as_written(principals: Any) -> Any:
    if not isinstance(principals, list):
        return principals  # not a list: converting it says so
    # ``type() is int``: YAML's true and false are ints to Python, and are no one's id.
    return [str(p) if type(p) is int else p for p in principals]


def _principals(principals: list[str]) -> None:
    for principal in principals:
        problem = principal_problem(principal)
        if problem:
            raise ValueError(f"{principal!r}: {problem}")


def _approvers_named(approvers: dict[str, list[str]]) -> None:
    for principals in approvers.values():
        _principals(principals)


class PolicyRules(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``policy:`` in kestrel.yaml: platform ids (never names) that may start runs, approve
    which tools (by name, ``tag:TAG`` or ``*``), answer questions, and operate runs."""

    # A principal that can name nobody as written is refused at load: it would refuse everyone
    # the check it is in, silently (a card nobody may approve waits until its deadline).
    __field_checks__: ClassVar = {
        "requesters": _principals,
        "approvers": _approvers_named,
        "answerers": _principals,
        "oncall": _principals,
    }

    requesters: list[str] = msgspec.field(default_factory=lambda: [EVERYONE])
    approvers: dict[str, list[str]] = msgspec.field(default_factory=lambda: {EVERYONE: [EVERYONE]})
    answerers: list[str] = []
    oncall: list[str] = []
    self_approval: bool = False

    def __post_init__(self) -> None:
        run_field_checks(self)


class NotPermitted(Exception):
    """The policy refuses an action; the message names who may take it."""


class Actor(msgspec.Struct, frozen=True):
    """Someone acting: their user id, the groups already known to hold them, the place they
    act from (None: the terminal that runs Kestrel), whether they come from outside the
    workspace (a shared channel's guest), and where to ask about the rest."""

    user: str
    groups: frozenset[str] = frozenset()
    place: Place | None = None
    external: bool = False
    directory: Directory | None = None

    # Who acts, not where to ask about them: the directory is no part of an actor's equality,
    # hash or repr (a dataclass's compare=False and repr=False before).
    def _identity(self) -> tuple[str, frozenset[str], Place | None, bool]:
        return (self.user, self.groups, self.place, self.external)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Actor):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __repr__(self) -> str:
        user, groups, place, external = self._identity()
        return f"Actor(user={user!r}, groups={groups!r}, place={place!r}, external={external!r})"

    def matches(self, principals: list[str], run: Place | None = None) -> bool:
        """Whether a principal names this actor without asking the platform: ``*``, their user
        id, a group or role already known to hold them, or ``channel:ID`` when the run at hand
        (``run``) lives in that channel.

        Someone from another workspace is named only by their own user id: ``*``, a channel
        or a group of ours never lets a guest in by accident.
        """
        if self.external:
            return self.user in principals
        for principal in principals:
            if principal in (EVERYONE, self.user):
                return True
            kind, _, ident = principal.partition(":")
            if kind in GROUP_KINDS and ident in self.groups:
                return True
            if kind == "channel" and run is not None and ident == run.channel:
                return True
        return False

    async def admitted(self, principals: list[str], run: Place | None = None) -> bool:
        """``matches``, then asking the directory about the groups these principals name that
        are not known yet: only those, and only when nothing cheaper matched."""
        if self.matches(principals, run):
            return True
        if self.external or self.directory is None:
            return False
        for group in _groups_in(principals):
            if group not in self.groups and await self.directory.in_group(self.user, group):
                return True
        return False


# How a refusal names another platform, and a workspace of one (a Discord guild is a server).
_PLATFORM_NAMES = {"slack": "Slack", "discord": "Discord"}
_WORKSPACE_WORDS = {"discord": "server"}


def _elsewhere(run: Place, here: Place) -> str:
    """Where a run lives, said from ``here``: "in another thread of this channel" (or "in a
    thread of this channel", from the channel itself), "in another channel", "in another
    workspace", "on Discord"."""
    if here.platform != run.platform:
        return f"on {_PLATFORM_NAMES.get(run.platform, run.platform)}"
    if here.workspace != run.workspace:
        return f"in another {_WORKSPACE_WORDS.get(run.platform, 'workspace')}"
    if here.channel != run.channel:
        return "in another channel"
    return "in another thread of this channel" if here.thread else "in a thread of this channel"


async def _sees(actor: Actor, run: Place) -> bool:
    """Whether the platform says ``actor`` sees the thread of ``run`` (a guest's word is
    not asked: they see only what was shared with them)."""
    if actor.external or actor.directory is None:
        return False
    return await actor.directory.sees(actor.user, run)


GROUP_KINDS = ("group", "role")  # ``role:ID`` reads better for a Discord role; both mean it
# What a principal may name besides one person: a person's name must not read as one of them.
PRINCIPAL_KINDS = (*GROUP_KINDS, "channel")


def _groups_in(principals: list[str]) -> list[str]:
    named = (p.partition(":") for p in principals)
    return [ident for kind, _, ident in named if kind in GROUP_KINDS and ident]


_KINDS_FOR = {
    RequestKind.WAIT_APPROVAL: {
        DecisionKind.APPROVE,
        DecisionKind.APPROVE_ALWAYS,
        DecisionKind.DENY,
    },
    RequestKind.WAIT_USER: {DecisionKind.ANSWER},
    RequestKind.WAIT_EFFECT: {DecisionKind.RETRY, DecisionKind.DONE, DecisionKind.FAILED},
    RequestKind.WAIT_PLAN: {DecisionKind.APPROVE, DecisionKind.STEP_BY_STEP, DecisionKind.DENY},
}


def fits(kind: DecisionKind, request: RequestKind) -> bool:
    """Whether a decision of ``kind`` answers a request of kind ``request`` at all."""
    return kind in _KINDS_FOR[request]


class Policy:
    """The rules of ``policy:`` in kestrel.yaml, checked against a person and a run's place."""

    def __init__(self, settings: PolicyRules) -> None:
        self.settings = settings

    async def may_start(self, actor: Actor, place: Place | None = None) -> bool:
        """Whether ``actor`` may start a run that lives in ``place``."""
        return await actor.admitted(self.settings.requesters, place)

    def start_refusal(self, actor: Actor) -> Refusal:
        """Why ``actor`` may not start a run, naming who may."""
        # Audited with where they asked: a refused start belongs to no run that would say it.
        where = acted_from(actor.place)
        if not self.settings.requesters:
            return Refusal(f"{actor.user} may not start runs: policy.requesters is empty", where)
        who = _either(self.settings.requesters, actor)
        reason = f"{actor.user} may not start runs: only {who} may (policy.requesters)"
        return _with_untold(Refusal(reason, where), actor)

    async def may_operate(self, actor: Actor, run: Place | None = None) -> bool:
        """On-call for a run that lives in ``run``: may resume, cancel, settle uncertain
        effects, and see it from anywhere on its platform."""
        return await actor.admitted(self.settings.oncall, run)

    async def may_see(self, actor: Actor, run: Place) -> bool:
        """Whether ``actor`` may read a run that lives in ``run`` (its prompt, tools, requests):
        at the terminal, from the run's own thread, or on the run's platform and workspace and
        on-call (a person or a group) or able to see its thread; from another workspace, only
        on-call named by their own user id."""
        if actor.place is None or run.within(actor.place):
            return True  # the terminal, or someone in the run's own thread
        if actor.place.platform != run.platform:
            return False
        if actor.place.workspace != run.workspace:
            # Another workspace's people see nothing of ours, but on-call named by their id.
            return actor.user in self.settings.oncall
        # On-call as a person or a group; else the platform says whether they see the thread.
        # ``channel:ID`` adds no one here: it names people acting on a run from where they see
        # its thread, and from its channel a Discord private thread shows to fewer people.
        if await self.may_operate(actor):
            return True
        return actor.directory is not None and await actor.directory.sees(actor.user, run)

    async def place_refusal(
        self, actor: Actor, run: Place | None, what: str, *, thread: bool = False
    ) -> Refusal | None:
        """None when ``actor`` acts from the run's place (or at the terminal); else why not:
        ``what`` ("request R", "run X") is elsewhere, said from where they are, and where its
        run's thread is, as a link to someone the platform says sees it (a private channel's
        or thread's is no one else's business: no link, no id). ``thread``: only from the
        run's thread itself, as a request is acted on (its card is there), not from its
        channel outside it, as a slash command acts on the run: a Discord private thread
        shows to fewer people than its channel."""
        here = actor.place
        if here is None or run is None:
            return None
        if run.within(here) if thread else run.holds(here):
            return None
        where = _elsewhere(run, here)
        if not run.platform:  # its session's row is gone from the store: it has no thread
            reason = f"{what} has no thread Kestrel knows of: on-call can act on it at the terminal"
        elif (here.platform, here.workspace) != (run.platform, run.workspace):
            reason = f"{what} is {where}: act on it from its run's thread there"
        elif (link := run.link()) and await _sees(actor, run):
            reason = f"{what} is {where}: act on it from its run's thread, {link}"
        else:  # they do not see it, or the platform did not say: the same words, true of both
            platform = _PLATFORM_NAMES.get(run.platform, run.platform)
            reason = (
                f"{what} is {where}; its thread is linked only for those {platform} says can"
                " see it: someone in that thread, or on-call, can act on it"
            )
        return Refusal(reason[:1].upper() + reason[1:], detail=acted_from(here))

    async def check_operate(
        self, actor: Actor, verb: str, run_id: str, requested_by: str, run: Place | None = None
    ) -> Refusal | None:
        """None when ``actor`` may ``verb`` (cancel, resume) the run: its requester, or
        on-call; else why not."""
        if requested_by and actor.user == requested_by:
            return None
        if await self.may_operate(actor, await self._seeing(actor, run)):
            return None
        requester = f"its requester ({requested_by or 'none recorded'})"
        if self.settings.oncall:
            oncall = _listed(self.settings.oncall)
            who = f"{requester} or on-call ({oncall})"
            said = f"{actor.user} may not {verb} run {run_id}: only {who} may"
            return _with_untold(Refusal(said), actor)
        return Refusal(
            f"{actor.user} may not {verb} run {run_id}: only {requester} may"
            " (policy.oncall is empty)"
        )

    async def _seeing(self, actor: Actor, run: Place | None) -> Place | None:
        """``run`` when ``actor`` acts on it from its thread, or from its channel and sees the
        thread (the platform says, and only when on-call names a channel): where ``channel:ID``
        names them; else None. A slash command in a Discord private thread's channel, by
        someone not in the thread, is not acting on its runs from where they are seen."""
        if run is None or actor.place is None or run.within(actor.place):
            return run
        named = any(p.partition(":")[0] == "channel" for p in self.settings.oncall)
        if not named or not run.holds(actor.place):
            return None
        return run if await _sees(actor, run) else None

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

    async def check_decision(
        self,
        actor: Actor,
        kind: DecisionKind,
        request: Request,
        flags: ToolFlags | None,
        *,
        run: Place | None = None,
        inline: bool = False,
        flags_of: FlagsOf = no_flags,
    ) -> Refusal | None:
        """None when ``actor`` may decide ``kind`` on ``request`` of a run that lives in
        ``run``; else the reason they may not (a plan's steps weighed with ``flags_of``).

        ``inline``: decided at the terminal that runs Kestrel (``kestrel chat``). Its operator
        holds the configuration, so approving their own run is no escalation; the approver
        lists, the two-person rule and on-call still hold.
        """
        if not fits(kind, request.kind):
            return Refusal(f"{kind.value} is not an answer to a {request.kind.value} request")
        refusal = await self.place_refusal(actor, run, f"request {request.id}", thread=True)
        if refusal:
            return refusal
        refusal = await self._decision_refusal(actor, kind, request, flags, run, inline, flags_of)
        return _with_untold(refusal, actor) if refusal else None

    async def _decision_refusal(
        self,
        actor: Actor,
        kind: DecisionKind,
        request: Request,
        flags: ToolFlags | None,
        run: Place | None,
        inline: bool,
        flags_of: FlagsOf,
    ) -> Refusal | None:
        """``check_decision`` once the decision fits the request and comes from its place."""
        if request.kind is RequestKind.WAIT_PLAN:
            return await self._plan(actor, kind, request, flags_of, run, inline)
        if request.kind is RequestKind.WAIT_APPROVAL:
            if inline and kind is not DecisionKind.DENY and request.approvals_needed > 1:
                return Refusal(
                    f"{request.tool} needs {request.approvals_needed} approvers: approve with"
                    " `kestrel runs approve`, one person at a time"
                )
            return await self._approval(actor, kind, request, flags, run, inline)
        if request.kind is RequestKind.WAIT_EFFECT:
            return await self._settle(actor, request, run)
        return await self._answer(actor, request, run)

    def who_may_answer(
        self, request: Asked, flags: ToolFlags | None, flags_of: FlagsOf = no_flags
    ) -> list[str]:
        """The principals that may answer ``request``, for people deciding who to ping (a
        plan: those who may approve every step, else everyone who may approve one)."""
        if request.kind is RequestKind.WAIT_PLAN:
            each = self._step_approvers(request, flags_of)
            return _common(each) or _unique([p for who in each for p in who])
        if request.kind is RequestKind.WAIT_EFFECT:
            # Without on-call nobody else could settle it: the requester does.
            return list(self.settings.oncall) or _unique([request.requested_by])
        if request.kind is RequestKind.WAIT_USER:
            return _unique([request.requested_by, *self.settings.oncall, *self.settings.answerers])
        return _unique(self._approvers(request.tool, flags))

    def may_answer_phrase(
        self, request: Asked, flags: ToolFlags | None, flags_of: FlagsOf = no_flags
    ) -> str:
        """Who may answer ``request``, for people: ``*`` as anyone, and the requester left out
        where the two-person rule leaves them out of approving."""
        if request.kind is RequestKind.WAIT_PLAN and not _common(
            self._step_approvers(request, flags_of)
        ):
            return "someone who may approve every step: " + "; ".join(
                f"{step.tool}: {_listed(who) or 'nobody'}"
                for step, who in zip(
                    _gated(request), self._step_approvers(request, flags_of), strict=True
                )
            )
        who = self.who_may_answer(request, flags, flags_of)
        requester = request.requested_by
        approving = (RequestKind.WAIT_APPROVAL, RequestKind.WAIT_PLAN)
        if request.kind in approving and requester and self._excludes(request) and who:
            if EVERYONE in who:
                return f"anyone but the requester ({requester})"
            who = [p for p in who if p != requester]
            if not who:
                return f"nobody (the requester, {requester}, may not approve their own run)"
        if EVERYONE in who:
            return "anyone"
        return ", ".join(who) or "nobody"

    def _step_approvers(self, request: Asked, flags_of: FlagsOf) -> list[list[str]]:
        """The approvers of each step of a plan that needs approval."""
        return [self._approvers(step.tool, flags_of(step.tool)) for step in _gated(request)]

    async def _plan(
        self,
        actor: Actor,
        kind: DecisionKind,
        request: Request,
        flags_of: FlagsOf,
        run: Place | None,
        inline: bool,
    ) -> Refusal | None:
        """A plan: approved only by someone who may approve every step (the refusal names
        the steps they may not); denied or taken step by step by the requester or anyone
        who may approve a step."""
        mine = actor.user == request.requested_by
        each = self._step_approvers(request, flags_of)
        if kind is not DecisionKind.APPROVE:
            if mine or any([await actor.admitted(who, run) for who in each]):
                return None
            who = _either([request.requested_by, *(p for w in each for p in w)], actor)
            return Refusal(f"{actor.user} may not decide this plan: only {who} may")
        if inline and request.approvals_needed > 1:
            return Refusal(
                f"this plan needs {request.approvals_needed} approvers: approve with"
                " `kestrel runs approve`, one person at a time"
            )
        if mine and not inline and not self._self_approval(request):
            phrase = self.may_answer_phrase(request, None, flags_of)
            return Refusal(f"{OWN_RUN}; may approve: {phrase}")
        refused = []
        for number, step in enumerate(request.steps, 1):
            flags = flags_of(step.tool)
            if not step.gated:
                continue
            if flags is not None and flags.approval.deny:
                refused.append(f"step {number} ({step.tool}: policy never allows it)")
            elif not await actor.admitted(self._approvers(step.tool, flags), run):
                refused.append(f"step {number} ({step.tool})")
        if refused:
            return Refusal(
                f"{actor.user} may not approve this plan: they may not approve "
                + ", ".join(refused)
            )
        return None

    def _excludes(self, request: Asked) -> bool:
        """Whether the requester may not approve their own request (outside the terminal)."""
        return not requester_approves(self.settings, request.approvals_needed)

    def _approvers(self, tool: str, flags: ToolFlags | None) -> list[str]:
        return approvers_of(self.settings, tool, flags.approval.tags if flags else ())

    async def _approval(
        self,
        actor: Actor,
        kind: DecisionKind,
        request: Request,
        flags: ToolFlags | None,
        run: Place | None,
        inline: bool,
    ) -> Refusal | None:
        mine = actor.user == request.requested_by
        approvers = self._approvers(request.tool, flags)
        if kind is DecisionKind.DENY:
            if mine or await actor.admitted(approvers, run):
                return None
            who = _either([request.requested_by, *approvers], actor)
            return Refusal(f"{actor.user} may not deny {request.tool}: only {who} may")
        if flags is not None and flags.approval.deny:
            return Refusal(f"policy never allows {request.tool}")
        if mine and not inline and not self._self_approval(request):
            phrase = self.may_answer_phrase(request, flags)
            return Refusal(f"{OWN_RUN}; may approve: {phrase}")
        if not await actor.admitted(approvers, run):
            return Refusal(
                f"{actor.user} may not approve {request.tool}: only {_either(approvers, actor)} may"
            )
        if kind is DecisionKind.APPROVE_ALWAYS and request.approvals_needed > 1:
            return Refusal(
                f"{request.tool} needs {request.approvals_needed} approvers for every call"
            )
        return None

    def _self_approval(self, request: Request) -> bool:
        # The two-person rule counts the requester as neither approver, whatever the setting.
        return not self._excludes(request)

    async def _settle(self, actor: Actor, request: Request, run: Place | None) -> Refusal | None:
        if await self.may_operate(actor, run):
            return None
        if not self.settings.oncall:
            if request.requested_by and actor.user == request.requested_by:
                return None
            requester = request.requested_by or "none recorded"
            return Refusal(
                f"only the run's requester ({requester}) may settle an uncertain effect while"
                " policy.oncall is empty"
            )
        oncall = _listed(self.settings.oncall)
        return Refusal(f"only on-call ({oncall}) may settle an uncertain effect")

    async def _answer(self, actor: Actor, request: Request, run: Place | None) -> Refusal | None:
        if actor.user == request.requested_by or await self.may_operate(actor, run):
            return None
        if await actor.admitted(self.settings.answerers, run):
            return None
        names = _unique([request.requested_by, *self.settings.answerers])
        if self.settings.oncall:
            names.append(f"on-call ({_listed(self.settings.oncall)})")
        return Refusal(
            f"{actor.user} may not answer this question: only {_either(names, actor)} may"
        )


def _with_untold(refusal: Refusal, actor: Actor) -> Refusal:
    """``refusal`` with what the platform did not say of ``actor`` when asked, which counted
    as no: a member it did not vouch for must not believe they are no member."""
    untold = actor.directory.untold() if actor.directory else ""
    if not untold:
        return refusal
    said = f"{refusal.reason}; {untold}, which counts as no here: try again in a moment"
    return Refusal(said, refusal.detail)


def _gated(request: Asked) -> list[AskedStep]:
    return [step for step in request.steps if step.gated]


def _common(each: list[list[str]]) -> list[str]:
    """The principals every list names, ``*`` in a list naming everyone of the others."""
    named = [who for who in each if EVERYONE not in who]
    if not named:
        return [EVERYONE] if each else []
    return [p for p in _unique(named[0]) if all(p in who for who in named[1:])]


def _listed(principals: list[str]) -> str:
    """Principals as written in the policy, ``*`` as anyone: ``U1, group:S1``."""
    return ", ".join("anyone" if p == EVERYONE else p for p in _unique(principals))


def _either(principals: list[str], actor: Actor) -> str:
    """Who may, for a refusal: ``U1, U2 or group:S1``; ``*`` is anyone (of this workspace, to
    a guest from another, whom only their own user id names)."""
    anyone = "people of this workspace" if actor.external else "anyone"
    names = [anyone if p == EVERYONE else p for p in _unique(principals)]
    if not names:
        return "nobody"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _unique(principals: list[str]) -> list[str]:
    return [p for i, p in enumerate(principals) if p and p not in principals[:i]]
