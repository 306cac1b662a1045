"""A question with options (ask_human_confirm, ask_human_select) takes one of them only: the
console asks again, ``Decisions`` refuses naming the options, the tool never passes free text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.domain import Decision, DecisionKind, Request
from bot.options import answer_refusal, match_option
from bot.people.refusal import Refusal
from bot.tools.ask_human import AskHumanTool, ask_human_tools
from bot.tools.base import Deferral, ToolContext, ToolResult
from tests.bot.cli.test_cli import kestrel, one_line_error

PROMPT = "checkout is failing, can you look?"


@pytest.mark.parametrize(
    ("answer", "options", "picked"),
    [
        ("yes", ("yes", "no"), "yes"),
        (" YES ", ("yes", "no"), "yes"),
        ("y", ("yes", "no"), "yes"),
        ("N", ("yes", "no"), "no"),
        ("eu", ("EU", "US"), "EU"),
        ("what is the disk usage on db1?", ("yes", "no"), None),
        ("yes please", ("yes", "no"), None),
        ("y", ("eu", "us"), None),  # y/n stand for yes/no only
        ("", ("yes", "no"), None),
        # By number, as a card with long options numbers them (from 1).
        ("2", ("drain the primary", "drain the replica"), "drain the replica"),
        (" #1 ", ("drain the primary", "drain the replica"), "drain the primary"),
        ("2.", ("eu", "us", "ap"), "us"),
        ("3", ("eu", "us"), None),
        ("0", ("eu", "us"), None),
        ("²", ("eu", "us"), None),
        # Never where an option is a number: "2" is not the second of 3 and 5 replicas.
        ("2", ("3", "5"), None),
        ("5", ("3", "5"), "5"),
        # Nor where an option holds a number: "2" would pick "4 replicas", not "2 replicas".
        ("2", ("2 replicas", "4 replicas"), None),
        ("1", ("1 replica", "no"), None),
        ("#1", ("PR #2", "PR #1"), None),
        ("2", ("v2", "v1"), None),
        ("2", ("2.0", "3.0"), None),
        ("2", ("③", "⑤"), None),
        ("1", ("node-\u0661", "node-\u0662"), None),  # Arabic-Indic digits
        # Nor a yes/no question, whose card never numbers its two options.
        ("1", ("yes", "no"), None),
        ("2", ("Yes", "No"), None),
    ],
)
def test_match_option(answer: str, options: tuple[str, ...], picked: str | None) -> None:
    assert match_option(answer, options) == picked


def test_answer_refusal_names_the_options() -> None:
    assert answer_refusal("maybe", ("yes", "no")) == Refusal(
        "“maybe” is not one of the options: answer “yes” or “no”"
    )
    assert str(answer_refusal("x", ("a", "b", "c"))).endswith("answer “a”, “b” or “c”")
    assert answer_refusal("anything", ()) is None
    assert answer_refusal("Y", ("yes", "no")) is None


class OnePrompter:
    """Present; answers every question with one text."""

    def __init__(self, text: str) -> None:
        self.text = text

    @property
    def present(self) -> bool:
        """Someone is there."""
        return True

    async def ask(self, request: Request) -> Decision | None:
        """The same answer, whatever the question."""
        return Decision(request_id=request.id, kind=DecisionKind.ANSWER, text=self.text, by="U0")


def tool(name: str) -> AskHumanTool:
    found = next(t for t in ask_human_tools() if t.name == name)
    assert isinstance(found, AskHumanTool)
    return found


@pytest.mark.parametrize(
    ("name", "arguments", "text", "expected"),
    [
        ("ask_human_confirm", {"question": "ok?"}, "Y", ToolResult("yes")),
        (
            "ask_human_select",
            {"question": "where?", "options": ["eu", "us"]},
            "US",
            ToolResult("us"),
        ),
        (
            "ask_human_select",
            {"question": "where?", "options": ["eu", "us"]},
            "2",
            ToolResult("us"),
        ),
        ("ask_human_input", {"question": "why?"}, "because", ToolResult("because")),
    ],
)
async def test_an_option_is_passed_as_the_question_spells_it(
    name: str, arguments: dict[str, object], text: str, expected: ToolResult
) -> None:
    ctx = ToolContext(run_id="run_1", call_id="call_1", prompter=OnePrompter(text))

    result = await tool(name).call(arguments, ctx)

    assert result == expected


async def test_free_text_to_a_confirm_leaves_it_open() -> None:
    prompter = OnePrompter("what is the disk usage on db1?")
    ctx = ToolContext(run_id="run_1", call_id="call_1", prompter=prompter)

    result = await tool("ask_human_confirm").call({"question": "ok?"}, ctx)

    assert isinstance(result, Deferral)
    assert result.options == ("yes", "no")


def test_chat_asks_again_until_an_option(tmp_path: Path) -> None:
    stdin = f"{PROMPT}\na\nwhat is the disk usage on db1?\nmaybe\nN\n"

    result = kestrel(tmp_path, "chat", stdin=stdin)

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "“what is the disk usage on db1?” is not one of the options: answer “yes” or “no”" in out
    assert "“maybe” is not one of the options" in out
    assert out.count("answer yes / no, or [l]ater:") == 3
    assert "no follow-up recorded" in out


def test_chat_later_leaves_the_question_pending(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "chat", stdin=f"{PROMPT}\na\nl\n")

    assert "suspended" in result.stdout
    run_id = json.loads(kestrel(tmp_path, "runs", "list", "--json").stdout)[0]["run_id"]
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    (request,) = shown["requests"]
    assert request["tool"] == "ask_human_confirm"


def test_runs_answer_refuses_free_text_naming_the_options(tmp_path: Path) -> None:
    started = json.loads(
        kestrel(tmp_path, "run", PROMPT, "--defer", "--json", "--as", "U0REQ").stdout
    )
    (approval,) = started["requests"]
    run_id = started["run_id"]
    kestrel(tmp_path, "runs", "approve", run_id, approval["id"], "--as", "U0BOSS")
    shown = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    (asked,) = shown["requests"]

    refused = kestrel(
        tmp_path,
        "runs",
        "answer",
        run_id,
        asked["id"],
        "what is the disk usage on db1?",
        "--as",
        "U0REQ",
    )

    message = one_line_error(refused)
    assert "is not one of the options: answer “yes” or “no”" in message
    still = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    assert [r["id"] for r in still["requests"]] == [asked["id"]]
    answered = kestrel(tmp_path, "runs", "answer", run_id, asked["id"], "YES", "--as", "U0REQ")
    assert answered.returncode == 0, answered.stderr
    done = json.loads(kestrel(tmp_path, "runs", "show", run_id, "--json").stdout)
    assert done["status"] == "completed"
    assert "Follow-up (as you asked)" in done["text"]
