"""The chat room's contract: every core name an adapter may use that does not live in ``bot.chat``.

Adapters (Slack, Discord, the console, the web pages) import ``bot.chat.*``, ``bot.events`` and
this module; the few other core modules they may import are listed, with the reason, in
``tests/adapters/test_contract.py``. Re-exporting here keeps that surface one short list a
reviewer can read, instead of an adapter reaching into the policy, the store or the journal.
"""

from __future__ import annotations

from bot.config.settings import ConfigError, WebSettings
from bot.errors import ResumeRefused, StoreError, UnknownRun, already_ended
from bot.journal.entries import Entry
from bot.journal.log import JournalRecord
from bot.options import answer_refusal, match_option
from bot.people.policy import (
    EVERYONE,
    GROUP_KINDS,
    Actor,
    NotPermitted,
    PolicyRules,
    requester_approves,
)
from bot.pii.guard import WITHHELD_MESSAGE
from bot.pii.scantext import ENTITY_TYPES
from bot.place import Place
from bot.records import RunRecord
from bot.store import Outbox
from bot.store_values import AuditRecord

__all__ = [
    "ENTITY_TYPES",
    "EVERYONE",
    "GROUP_KINDS",
    "WITHHELD_MESSAGE",
    "Actor",
    "AuditRecord",
    "ConfigError",
    "Entry",
    "JournalRecord",
    "NotPermitted",
    "Outbox",
    "Place",
    "PolicyRules",
    "ResumeRefused",
    "RunRecord",
    "StoreError",
    "UnknownRun",
    "WebSettings",
    "already_ended",
    "answer_refusal",
    "match_option",
    "requester_approves",
]
