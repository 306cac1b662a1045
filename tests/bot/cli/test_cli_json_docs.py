"""Every key the `--json` of the command line prints is named where its `--help` points:
docs/configuration.md, the paragraph of the JSON schemas."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec

from bot.records import Replica
from tests.bot.cli.test_cli import kestrel

DOCS = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def documented() -> set[str]:
    """The keys the JSON paragraphs name, in backticks."""
    text = DOCS.read_text()
    start = text.index("The JSON of `run --json`")
    end = text.index("Only a run's requester or on-call")
    return set(re.findall(r"`([a-z_]+)`", text[start:end]))


def test_the_json_of_pending_and_of_a_run_is_documented(tmp_path: Path) -> None:
    deferred = json.loads(
        kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ").stdout
    )
    (pending,) = json.loads(kestrel(tmp_path, "runs", "pending", "--json").stdout)
    (audited, *_) = json.loads(kestrel(tmp_path, "audit", "--json").stdout)
    keys = set(deferred) | set(deferred["requests"][0]) | set(pending) | set(audited)
    assert keys - documented() == set()


def test_the_json_of_replicas_is_documented() -> None:
    keys = {field.name for field in msgspec.structs.fields(Replica)}
    assert keys - documented() == set()
