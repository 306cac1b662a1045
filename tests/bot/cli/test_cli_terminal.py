"""Model and tool text reaches the terminal without control sequences, in every command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bot.text import printable
from tests.bot.cli.test_cli import kestrel, write_config

# An OSC title change, a screen clear and a cursor move, in 7-bit and 8-bit (C1) forms.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[H\x9b31m\x9d2;pwned\x9c"
SCRIPT = [
    {"text": f"looking{HOSTILE} now", "calls": [{"name": "shout", "arguments": {}}]},
    {"text": f"all{HOSTILE} done"},
]
CATALOG = {
    "tools": [
        {
            "name": "shout",
            "description": "Print escape sequences",
            "command": ["printf", "loud\\033]0;pwned\\007\\033[2J\\033[3J output"],
            "idempotent": True,
        }
    ]
}
CONTROLS = ("\x1b", "\x07", "\x9b", "\x9c", "\x9d", "pwned")


def hostile_world(folder: Path) -> None:
    (folder / "script.yaml").write_text(yaml.safe_dump(SCRIPT))
    (folder / "tools.yaml").write_text(yaml.safe_dump(CATALOG))
    write_config(
        folder, model={"provider": "scripted", "script": "script.yaml"}, tools=["tools.yaml"]
    )


def assert_clean(text: str) -> None:
    for control in CONTROLS:
        assert control not in text, repr(text)


def test_run_and_runs_show_strip_control_sequences(tmp_path: Path) -> None:
    hostile_world(tmp_path)
    ran = kestrel(tmp_path, "run", f"why{HOSTILE}?")
    assert ran.returncode == 0, ran.stderr
    assert "all done" in ran.stdout
    assert_clean(ran.stdout + ran.stderr)
    (run,) = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)
    shown = kestrel(tmp_path, "runs", "show", run["run_id"])
    assert "looking now" in shown.stdout and "loud output" in shown.stdout
    assert_clean(shown.stdout + shown.stderr)
    listed = kestrel(tmp_path, "runs", "list")
    assert "why?" in listed.stdout
    assert_clean(listed.stdout)
    as_json = kestrel(tmp_path, "runs", "show", run["run_id"], "--json").stdout
    assert_clean(as_json.replace("pwned", ""))  # JSON escapes them; the data stays intact
    assert json.loads(as_json)["text"] == f"all{HOSTILE} done"


def test_chat_strips_control_sequences(tmp_path: Path) -> None:
    hostile_world(tmp_path)
    chatted = kestrel(tmp_path, "chat", stdin=f"why{HOSTILE}?\n")
    assert chatted.returncode == 0, chatted.stderr
    assert "kestrel> all done" in chatted.stdout
    assert "looking now" in chatted.stdout
    assert_clean(chatted.stdout + chatted.stderr)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b]0;title\x07b", "ab"),  # OSC ended by BEL
        ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # OSC 8 ended by ST
        ("x\x1b[2J\x1b[1;31mred\x1b[0m", "xred"),  # CSI
        ("\x9b2J\x9d0;t\x9cok", "ok"),  # 8-bit CSI, OSC and ST
        ("\x1bP+q\x1b\\after", "after"),  # DCS
        ("\x1bc\x1b(Bplain", "plain"),  # reset, charset selection
        ("cr\rbs\x08nul\x00del\x7fesc\x1b", "crbsnuldelesc"),  # lone controls
        ("keep\ttabs\nand lines ✓ é", "keep\ttabs\nand lines ✓ é"),
        ("unterminated \x1b]0;title", "unterminated "),
        ("half \ud800 a pair", "half \ufffd a pair"),  # a lone surrogate cannot be UTF-8
    ],
)
def test_printable(text: str, shown: str) -> None:
    assert printable(text) == shown
