"""Reading a stored entry back: validated by its own kind's model alone.

The union of every entry kind, validated as one, builds all thirteen entry models (and the
union) the first time: a fresh process that resumes one run reads five kinds. The ``kind``
leads every stored entry (it is each model's first field), so it picks the model; a body that
does not start with it, or names no known kind, goes through the whole union, whose error
says why.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Final, get_args

from pydantic import ConfigDict, TypeAdapter

from bot.domain import DomainModel
from bot.journal.entries import Entry

_LEAD: Final = '{"kind":"'


@cache
def _by_kind() -> dict[str, type[DomainModel]]:
    union = get_args(get_args(Entry)[0])
    return {model.model_fields["kind"].default: model for model in union}


@cache
def _union() -> TypeAdapter[Entry]:
    return TypeAdapter(Entry, config=ConfigDict(defer_build=True))


def decode_entry(body: str) -> Entry:
    """The entry stored as ``body`` (JSON); ``pydantic.ValidationError`` if it is not one."""
    model = _by_kind().get(_kind(body))
    if model is None:
        return _union().validate_json(body)
    entry: Entry = model.model_validate_json(body)  # type: ignore[assignment]
    return entry


def _kind(body: str) -> Any:
    if body.startswith(_LEAD):
        end = body.find('"', len(_LEAD))
        return body[len(_LEAD) : end] if end > 0 else None
    try:
        found = json.loads(body)
    except ValueError:
        return None
    return found.get("kind") if isinstance(found, dict) else None
