"""What every run of one process shares: store, model, tools, hooks, events and settings."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from msgspec.structs import replace

from bot.config.deadlines import DeadlineSettings
from bot.digest import sha256
from bot.domain import Budgets, Fingerprint, Request, new_id, utcnow
from bot.events import FanOut
from bot.hooks import Hooks
from bot.kinds import Provenance
from bot.llm.base import ModelProvider
from bot.people.audit import Redact, unchanged
from bot.people.policy import Policy, PolicyRules
from bot.tools.source import ToolSource

if TYPE_CHECKING:
    from bot.store import Store


def default_owner() -> str:
    """This process's identity as a lease owner: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{new_id('p')[-6:]}"


class Runtime(msgspec.Struct):
    """The shared parts runs are built from."""

    store: Store
    model: ModelProvider
    tools: ToolSource
    hooks: Hooks = msgspec.field(default_factory=Hooks)
    events: FanOut = msgspec.field(default_factory=FanOut)
    system_prompt: str = ""
    budgets: Budgets = msgspec.field(default_factory=Budgets)
    model_timeout: float = 60.0
    owner: str = msgspec.field(default_factory=default_owner)
    lease_seconds: float = 30.0
    workdir: Path | None = None
    guard_hooks: Callable[[], Hooks] = Hooks
    # The PII guard as a function of text: what people type is audited through it.
    redact: Redact = unchanged
    policy: Policy = msgspec.field(default_factory=lambda: Policy(PolicyRules()))
    deadlines: DeadlineSettings = msgspec.field(default_factory=DeadlineSettings)
    provenance: Provenance = Provenance.ASK
    # The one clock that decides expiry: the store's (leases, due messages) is the same one,
    # so a test moves time for all of them at once instead of sleeping.
    clock: Callable[[], datetime] = utcnow
    # Whether other replicas share the store (PostgreSQL), and so go on with a run this one
    # hands back; with SQLite there is no other: it goes on when Kestrel starts again.
    shared: bool = False

    @property
    def renew_every(self) -> float:
        """How often a run's lease is renewed, and a store write it needs tried again: a third
        of the lease, so that two may fail before it runs out."""
        return max(self.lease_seconds / 3, 0.05)

    def stamp(self, request: Request) -> Request:
        """Give a new request its deadline: per tool, tag or ``*`` if configured, else per kind."""
        if request.deadline is not None:
            return request
        flags = self.tools.current().flags_of(request.tool)
        tags = flags.approval.tags if flags is not None else ()
        seconds = self.deadlines.seconds_for(request.kind.value, request.tool, tags)
        return replace(request, deadline=request.created_at + timedelta(seconds=seconds))

    def fingerprint(self) -> Fingerprint:
        """What resume compares: provider, model, tool set and system prompt."""
        return Fingerprint(
            provider=self.model.provider,
            model=self.model.model,
            tools_digest=self.tools.current().digest(),
            system_prompt_digest=sha256(self.system_prompt.encode()).hexdigest()[:16],
        )

    def run_hooks(self) -> Hooks:
        """The caller's hooks, then the guard's (the run installs the guard itself)."""
        return self.hooks.then(self.guard_hooks())
