"""The fast way of ``kestrel runs list`` and ``kestrel runs pending``: a SQLite journal read
without pydantic or asyncio, so that they answer about as fast as the interpreter starts.

It reads only what these commands use (``database``, ``policy``), and only in the form that
validation keeps as it is. For anything else it answers None and the command goes the full way,
which validates the whole configuration and says what is wrong: a PostgreSQL database, a
setting set by a variable (other than ``KESTREL_DATABASE_URL``), a value pydantic would convert
or refuse, approvers named by catalog tag (the catalogs would have to be read), or a journal it
cannot read as it stands.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin, get_type_hints

from bot.config_sources import (
    ENV_PREFIX,
    NON_SETTING_VARIABLES,
    config_path,
    dotenv,
    read_yaml,
    resolved,
)
from bot.kinds import RequestKind
from bot.policy import Policy, PolicyRules

if TYPE_CHECKING:
    from storage.sqlite_rows import RunRow

DATABASE_VARIABLE = "KESTREL_DATABASE_URL"
# Keys no settings file may set: ``bot.config`` derives them.
_DERIVED = frozenset({"base_dir"})


@dataclass(frozen=True)
class ReadSettings:
    """The settings a read-only command uses: where the journal is, and the policy."""

    journal: Path
    policy: PolicyRules


@dataclass(frozen=True)
class StoredRequest:
    """An open request as its stored body reads, with what ``runs pending`` shows of it."""

    id: str
    run_id: str
    kind: RequestKind
    tool: str
    arguments: dict[str, Any]
    prompt: str
    options: tuple[str, ...]
    requested_by: str
    created_at: datetime
    deadline: datetime | None

    @classmethod
    def from_json(cls, body: str) -> StoredRequest | None:
        """The request a body written by the store holds; None if it does not read as one."""
        try:
            data = json.loads(body)
            deadline = data.get("deadline")
            return cls(
                id=data["id"],
                run_id=data["run_id"],
                kind=RequestKind(data["kind"]),
                tool=data["tool"],
                arguments=dict(data.get("arguments", {})),
                prompt=data.get("prompt", ""),
                options=tuple(data.get("options", ())),
                requested_by=data.get("requested_by", ""),
                created_at=datetime.fromisoformat(data["created_at"]),
                deadline=None if deadline is None else datetime.fromisoformat(deadline),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def read_settings(explicit: str | None) -> ReadSettings | None:
    """The journal and policy as ``load_settings`` would give them; None where only it can."""
    path = config_path(explicit)
    data = read_yaml(path, _DERIVED) if path else {}
    database = data.get("database", "kestrel.db")
    for variables in (dotenv(), os.environ):
        for name, value in variables.items():
            upper = name.upper()
            if upper == DATABASE_VARIABLE:
                database = value
            elif upper.startswith(ENV_PREFIX) and upper not in NON_SETTING_VARIABLES:
                return None
    if not isinstance(database, str) or database.startswith(("postgres://", "postgresql://")):
        return None
    policy = data.get("policy", {})
    if not _kept_as_is(policy, PolicyRules):
        return None
    base_dir = path.parent.resolve() if path else Path.cwd()
    journal = resolved(base_dir, database.removeprefix("sqlite:///"))
    return ReadSettings(journal=journal, policy=PolicyRules(**policy))


def pending(settings: ReadSettings) -> list[tuple[StoredRequest, list[str], str]] | None:
    """Each open request with who may answer it and why; None where the full way must say."""
    from storage.sqlite_rows import Unreadable, open_request_bodies

    if any(key.startswith("tag:") for key in settings.policy.approvers):
        return None  # approvers by tag: the catalogs say which tools bear it
    try:
        bodies = open_request_bodies(settings.journal)
    except Unreadable:
        return None
    requests = [StoredRequest.from_json(body) for body in bodies]
    policy = Policy(settings.policy)
    found = []
    for request in requests:
        if request is None:
            return None
        found.append((request, policy.who_may_answer(request, None), policy.answer_note(request)))
    return found


def newest_runs(settings: ReadSettings, limit: int) -> list[RunRow] | None:
    """The newest runs' rows, newest first; None where the full way must say."""
    from storage.sqlite_rows import Unreadable
    from storage.sqlite_rows import newest_runs as rows

    try:
        return rows(settings.journal, limit)
    except Unreadable:
        return None


def _kept_as_is(value: Any, annotation: Any) -> bool:
    """Whether validating ``value`` as ``annotation`` gives ``value`` back unchanged: strings,
    booleans, lists and mappings of them, and the dataclass sections made of those."""
    if dataclasses.is_dataclass(annotation):
        fields = {f.name for f in dataclasses.fields(annotation)}
        types = get_type_hints(annotation)
        return (
            isinstance(value, dict)
            and set(value) <= fields
            and all(_kept_as_is(item, types[key]) for key, item in value.items())
        )
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is list:
        return isinstance(value, list) and all(_kept_as_is(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(
            _kept_as_is(k, args[0]) and _kept_as_is(v, args[1]) for k, v in value.items()
        )
    if annotation in (str, bool):
        return type(value) is annotation
    return False
