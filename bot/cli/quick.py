"""The fast way of ``kestrel runs list`` and ``kestrel runs pending``: a SQLite journal read
without asyncio or the settings' conversion, so that they answer about as fast as the
interpreter starts.

It reads only what these commands use (``database``, ``policy``), and only in the form that
validation keeps as it is. For anything else it answers None and the command goes the full way,
which validates the whole configuration and says what is wrong: a PostgreSQL database, a
setting set by a variable (other than ``KESTREL_DATABASE_URL``), a value the conversion would
change or refuse, approvers named by catalog tag (the catalogs would have to be read), or a
journal it cannot read as it stands.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, get_args, get_origin

from bot.config.sources import (
    DATABASE_VARIABLE,
    FILE_SUFFIX,
    base_dir_of,
    check_database,
    config_path,
    dotenv,
    names_a_setting,
    read_yaml,
    sqlite_file,
    unexpanded_variable,
)
from bot.kinds import RequestKind
from bot.nesting import MAX_DEPTH, deeper_than
from bot.people.policy import Policy, PolicyRules
from bot.plain import fields_of, is_struct
from storage.sqlite_rows import RunRow, Unreadable, open_request_bodies, reads_as_moment
from storage.sqlite_rows import newest_runs as stored_runs

OPENAI_KEY_FILE: Final = "OPENAI_API_KEY" + FILE_SUFFIX
# The settings' top-level keys (tests/bot/cli/test_cli_quick.py holds them to ``Settings``'s).
SETTINGS: Final = frozenset(
    {
        "database",
        "database_timeout_seconds",
        "model",
        "system_prompt",
        "tools",
        "budgets",
        "human_in_the_loop",
        "provenance",
        "pii",
        "policy",
        "deadlines",
        "schedules",
        "hooks",
        "replica",
        "web",
        "mcp_servers",
        "tool_isolation",
        "openai_api_key",
        "openai_base_url",
    }
)


@dataclass(frozen=True)
class ReadSettings:
    """The settings a read-only command uses: where the journal is, and the policy."""

    journal: Path
    policy: PolicyRules


@dataclass(frozen=True)
class StoredOrigin:
    """Where one argument of a stored request (or plan step) came from, as its body reads."""

    argument: str
    value: str
    tool: str
    call_id: str
    line: int
    excerpt: str
    instruction_like: bool


@dataclass(frozen=True)
class StoredStep:
    """One step of a stored plan, as ``runs pending`` shows it."""

    tool: str
    arguments: dict[str, Any]
    why: str
    digest: str
    gated: bool
    call_id: str
    origins: tuple[StoredOrigin, ...]

    @classmethod
    def of(cls, data: dict[str, Any]) -> StoredStep:
        """The step a checked stored step holds."""
        origins = tuple(StoredOrigin(**origin) for origin in data["origins"])
        return cls(**{**data, "origins": origins})


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
    approvals_needed: int
    digest: str
    steps: tuple[StoredStep, ...]
    off_plan: str
    created_at: datetime
    deadline: datetime | None
    origins: tuple[StoredOrigin, ...]

    @classmethod
    def from_json(cls, body: str) -> StoredRequest | None:
        """The request a body holds, if it is as the store writes one (every field of a
        ``Request``, each of its type, timestamps as pydantic writes them); else None."""
        try:
            data = json.loads(body, object_pairs_hook=_unique_keys, parse_float=_short_float)
            json.dumps(data, ensure_ascii=False).encode()  # pydantic refuses a lone surrogate
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or data.keys() != _REQUEST_FIELDS.keys():
            return None
        if not all(is_kept(data[name]) for name, is_kept in _REQUEST_FIELDS.items()):
            return None
        arguments = [data["arguments"], *(step["arguments"] for step in data["steps"])]
        if any(deeper_than(value, MAX_DEPTH) for value in arguments):
            return None  # an older journal's: the store names it if it cannot read it
        deadline = data["deadline"]
        return cls(
            id=data["id"],
            run_id=data["run_id"],
            kind=RequestKind(data["kind"]),
            tool=data["tool"],
            arguments=data["arguments"],
            prompt=data["prompt"],
            options=tuple(data["options"]),
            requested_by=data["requested_by"],
            approvals_needed=data["approvals_needed"],
            digest=data["digest"],
            steps=tuple(StoredStep.of(step) for step in data["steps"]),
            off_plan=data["off_plan"],
            created_at=datetime.fromisoformat(data["created_at"]),
            deadline=None if deadline is None else datetime.fromisoformat(deadline),
            origins=tuple(StoredOrigin(**origin) for origin in data["origins"]),
        )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are each given once (pydantic checks every value, json.loads keeps
    the last)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("a key given twice")
    return found


def _short_float(literal: str) -> float:
    """``float(literal)`` for a literal no longer than the store writes: pydantic refuses some
    of hundreds of digits as out of range, where ``float`` makes them infinite."""
    if len(literal) > _LONGEST_NUMBER:
        raise ValueError("a number of too many digits")
    return float(literal)


def _is_text(value: object) -> bool:
    return type(value) is str


def _is_origin(value: object) -> bool:
    """An ``ArgumentOrigin`` as the store writes one: its text fields and its line number."""
    if type(value) is not dict or value.keys() != _ORIGIN_TEXTS | {"line", "instruction_like"}:
        return False
    if type(value["line"]) is not int or type(value["instruction_like"]) is not bool:
        return False
    return all(type(value[name]) is str for name in _ORIGIN_TEXTS)


def _is_step(value: object) -> bool:
    """A ``PlanStep`` as the store writes one."""
    if type(value) is not dict or value.keys() != _STEP_FIELDS.keys():
        return False
    return all(is_kept(value[name]) for name, is_kept in _STEP_FIELDS.items())


def _is_json_stamp(value: object) -> bool:
    """A timestamp as pydantic writes an aware one, which it reads back as the same instant."""
    return type(value) is str and _STAMP.fullmatch(value) is not None and reads_as_moment(value)


_KINDS: Final = frozenset(kind.value for kind in RequestKind)
_ORIGIN_TEXTS: Final = frozenset({"argument", "value", "tool", "call_id", "excerpt"})
# No float the store writes is longer (``repr`` of a double is at most 24 characters).
_LONGEST_NUMBER: Final = 32
_STAMP: Final = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
)
# A ``PlanStep``'s fields (tests/bot/cli/test_cli_quick.py holds them to the model's).
_STEP_FIELDS: Final[dict[str, Callable[[object], bool]]] = {
    "tool": _is_text,
    "arguments": lambda value: type(value) is dict,
    "why": _is_text,
    "digest": _is_text,
    "gated": lambda value: type(value) is bool,
    "call_id": _is_text,
    "origins": lambda value: type(value) is list and all(map(_is_origin, value)),
}
# A ``Request``'s fields (tests/bot/cli/test_cli_quick.py holds them to the model's), each with
# whether a value is one validation keeps as it is.
_REQUEST_FIELDS: Final[dict[str, Callable[[object], bool]]] = {
    "id": _is_text,
    "run_id": _is_text,
    "kind": lambda value: type(value) is str and value in _KINDS,
    "call_id": _is_text,
    "tool": _is_text,
    "arguments": lambda value: type(value) is dict,
    "digest": _is_text,
    "prompt": _is_text,
    "options": lambda value: type(value) is list and all(map(_is_text, value)),
    "requested_by": _is_text,
    "approvals_needed": lambda value: type(value) is int,
    "origins": lambda value: type(value) is list and all(map(_is_origin, value)),
    "steps": lambda value: type(value) is list and all(map(_is_step, value)),
    "off_plan": _is_text,
    "created_at": _is_json_stamp,
    "deadline": lambda value: value is None or _is_json_stamp(value),
}


def read_settings(explicit: str | None) -> ReadSettings | None:
    """The journal and policy as ``load_settings`` would give them; None where only it can."""
    path = config_path(explicit)
    data = read_yaml(path) if path else {}
    if not data.keys() <= SETTINGS or unexpanded_variable(data) is not None:
        # A key no setting has, or a value written as a variable: the full way names it.
        return None
    database = data.get("database", "kestrel.db")
    for variables in (dotenv(), os.environ):
        if variables.get(OPENAI_KEY_FILE):
            return None  # a file only the full way reads (and names, if unreadable)
        # In the order ``load_settings`` lays them: of two spellings, the last sorted wins.
        for name, value in sorted(variables.items()):
            upper = name.upper()
            if upper == DATABASE_VARIABLE:
                database = value
            elif names_a_setting(upper):
                return None
    if not isinstance(database, str) or _refused(database):
        return None
    policy = data.get("policy", {})
    if not _kept_as_is(policy, PolicyRules):
        return None
    try:
        rules = PolicyRules(**policy)
    except ValueError:
        return None  # a principal that names nobody: the full way says which
    base_dir = base_dir_of(path)
    journal = sqlite_file(base_dir, database)
    if journal is None:
        return None  # PostgreSQL: the store reads it
    return ReadSettings(journal=journal, policy=rules)


def _refused(database: str) -> bool:
    """Whether the full way refuses the ``database`` setting (and says why)."""
    try:
        check_database(database)
    except ValueError:
        return True
    return False


def pending(settings: ReadSettings) -> list[tuple[StoredRequest, list[str], str, str]] | None:
    """Each open request with who may answer it (as principals, and in words) and why; None
    where the full way must say."""
    if any(key.startswith("tag:") for key in settings.policy.approvers):
        return None  # approvers by tag: the catalogs say which tools bear it
    try:
        bodies = open_request_bodies(settings.journal)
    except Unreadable:
        return None
    policy = Policy(settings.policy)
    found = []
    for body in bodies:
        request = StoredRequest.from_json(body)
        if request is None:
            return None
        # Without tag rules a tool's flags name nobody: who may answer needs none of them.
        who = policy.who_may_answer(request, None)
        phrase = policy.may_answer_phrase(request, None)
        found.append((request, who, phrase, policy.answer_note(request)))
    return found


def newest_runs(settings: ReadSettings, limit: int) -> list[RunRow] | None:
    """The newest runs' rows, newest first; None where the full way must say."""
    try:
        return stored_runs(settings.journal, limit)
    except Unreadable:
        return None


def moment(stored: str) -> datetime:
    """A timestamp as the store wrote it (``newest_runs`` checked that it reads as one)."""
    return datetime.fromisoformat(stored)


def _kept_as_is(value: Any, annotation: Any) -> bool:
    """Whether validating ``value`` as ``annotation`` gives ``value`` back unchanged: strings,
    booleans, lists and mappings of them, and the sections made of those."""
    if is_struct(annotation):
        types = fields_of(annotation)
        return (
            isinstance(value, dict)
            and value.keys() <= types.keys()
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
