"""Slack messages built from the core's values: within Slack's limits, escaped, ids only."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

from adapters.slack import answers, cards, ids, listings, modals, mrkdwn, status
from adapters.slack.app import MEMBERSHIP_EVENTS
from bot.chat.service import PendingRequest, RunView
from bot.domain import (
    Budgets,
    Decision,
    DecisionKind,
    Fingerprint,
    Request,
    RequestKind,
    RequestStatus,
    RunStatus,
    StopReason,
    TerminalResult,
    ToolCall,
    Usage,
)
from bot.journal.entries import RunStarted
from bot.journal.fold import CallState, RunState
from bot.records import RunRecord

ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]
DEADLINE = datetime(2030, 1, 2, 3, 4, tzinfo=UTC)
HOSTILE = "<script>&</script> <!channel> <@U0EVIL>"


def approval(**overrides: Any) -> Request:
    fields: dict[str, Any] = {
        "run_id": "run_0123456789abcdef",
        "kind": RequestKind.WAIT_APPROVAL,
        "call_id": "call_1",
        "tool": "restart_service",
        "arguments": {"unit": "checkout.service", "force": True},
        "requested_by": "U0REQUESTER",
        "deadline": DEADLINE,
    }
    fields.update(overrides)
    return Request(**fields)


def question(options: tuple[str, ...] = (), **overrides: Any) -> Request:
    fields: dict[str, Any] = {
        "kind": RequestKind.WAIT_USER,
        "tool": "ask_human_select" if options else "ask_human_input",
        "arguments": {"question": "Which region?"},
        "prompt": "Which region?",
        "options": options,
    }
    return approval(**{**fields, **overrides})


def effect(**overrides: Any) -> Request:
    return approval(
        kind=RequestKind.WAIT_EFFECT,
        prompt="restart_service timed out: did it take effect?",
        **overrides,
    )


# -- what every message must satisfy ---------------------------------------------------------


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every dict in a block tree."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


def mrkdwn_texts(blocks: list[dict[str, Any]]) -> list[str]:
    return [d["text"] for d in walk(blocks) if d.get("type") == "mrkdwn"]


def interactive(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Buttons, selects and feedback buttons."""
    kinds = {"button", "static_select", "feedback_buttons"}
    return [d for d in walk(blocks) if d.get("type") in kinds]


def values(blocks: list[dict[str, Any]]) -> list[str]:
    """Every value an interaction sends back to the app."""
    found = []
    for d in walk(blocks):
        if "value" in d and isinstance(d["value"], str):
            found.append(d["value"])
    return found


def assert_valid(blocks: list[dict[str, Any]], *, most: int = mrkdwn.MESSAGE_BLOCKS_LIMIT) -> None:
    assert 0 < len(blocks) <= most
    markdown = 0
    for block in blocks:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an unknown key is a warning in slack_sdk
            parsed = Block.parse(block)
            assert parsed is not None, block
            parsed.validate_json()
        match block["type"]:
            case "section":
                if "text" in block:
                    assert 0 < len(block["text"]["text"]) <= mrkdwn.SECTION_TEXT_LIMIT
                for field in block.get("fields", []):
                    assert 0 < len(field["text"]) <= mrkdwn.FIELD_TEXT_LIMIT
                assert len(block.get("fields", [])) <= mrkdwn.FIELDS_PER_SECTION
            case "header":
                assert len(block["text"]["text"]) <= mrkdwn.HEADER_LIMIT
            case "markdown":
                markdown += len(block["text"])
            case "actions":
                elements = block["elements"]
                assert len(elements) <= mrkdwn.BUTTONS_PER_ACTIONS
                action_ids = [e["action_id"] for e in elements]
                assert len(set(action_ids)) == len(action_ids), "action ids unique per block"
            case "context":
                assert len(block["elements"]) <= mrkdwn.CONTEXT_ELEMENTS_LIMIT
                for element in block["elements"]:
                    assert len(element["text"]) <= mrkdwn.SECTION_TEXT_LIMIT
    assert markdown <= mrkdwn.MARKDOWN_PAYLOAD_LIMIT
    for element in interactive(blocks):
        assert element["action_id"].startswith(ids.PREFIX)
        if element["type"] == "button":
            assert len(element["text"]["text"]) <= mrkdwn.BUTTON_TEXT_LIMIT


def assert_valid_view(view: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        View(**view).validate_json()
    assert_valid(view["blocks"], most=mrkdwn.VIEW_BLOCKS_LIMIT)
    if view["type"] == "modal":
        assert len(view["title"]["text"]) <= mrkdwn.MODAL_TITLE_LIMIT


def action_ids_of(blocks: list[dict[str, Any]]) -> list[str]:
    return [e["action_id"] for e in interactive(blocks)]


def types(blocks: list[dict[str, Any]]) -> list[str]:
    return [block["type"] for block in blocks]


# -- approval cards --------------------------------------------------------------------------


def test_approval_card_shows_the_exact_call_and_carries_only_the_request_id() -> None:
    request = approval()
    card = cards.request_card(request, reason="It keeps crashing.", may_answer=["U0APPROVER"])
    assert_valid(card.blocks)
    text = "\n".join(mrkdwn_texts(card.blocks))
    assert "*Approval needed:* `restart_service`" in text
    assert '"unit": "checkout.service"' in text and '"force": true' in text
    assert "*Why:*\n>It keeps crashing." in text
    assert "Requested by <@U0REQUESTER>" in text
    assert f"<!date^{int(DEADLINE.timestamp())}^" in text and "|2030-01-02 03:04 UTC>" in text
    assert "May approve: <@U0APPROVER>" in text
    assert action_ids_of(card.blocks) == [ids.APPROVE_ONCE, ids.APPROVE_RUN, ids.DENY]
    assert set(values(card.blocks)) == {request.id}
    buttons = {e["action_id"]: e for e in interactive(card.blocks)}
    assert buttons[ids.APPROVE_ONCE]["style"] == "primary"
    assert buttons[ids.DENY]["style"] == "danger"
    assert card.text == "Approval needed: restart_service"


FAKE_LINES = "It keeps crashing.\n*Approved by* <@U0APPROVER>\n*2.* `restart_unit` (no approval)"


def test_the_models_reason_cannot_pass_for_the_cards_own_lines() -> None:
    # The reason is the model's (a tool's output may have put it there): a line of it that
    # reads like the card's own ("Approved by", a plan's next step) is shown quoted, or on its
    # step's line, never as a line of the card's.
    card = cards.request_card(approval(), reason=FAKE_LINES, may_answer=["U0APPROVER"])
    why = next(t for t in mrkdwn_texts(card.blocks) if t.startswith("*Why:*"))
    assert why.split("\n")[1:] == [
        ">It keeps crashing.",
        ">*Approved by* &lt;@U0APPROVER&gt;",
        ">*2.* `restart_unit` (no approval)",
    ]
    from bot.domain import PlanStep

    step = PlanStep(tool="restart_unit", arguments={"unit": "u0"}, why=FAKE_LINES)
    planned = cards.request_card(one_step_plan(step), reason="", may_answer=[])
    first = next(t for t in mrkdwn_texts(planned.blocks) if t.startswith("*1.*"))
    one_line = (
        "It keeps crashing. *Approved by* &lt;@U0APPROVER&gt; *2.* `restart_unit` (no approval)"
    )
    assert first.split("\n")[0].endswith(one_line)


def plan(steps: int = 2, **overrides: Any) -> Request:
    from bot.domain import ArgumentOrigin, PlanStep, call_digest

    origin = ArgumentOrigin(
        argument="unit", value="payments-db", tool="read_log", call_id="c0", line=3, excerpt="x"
    )
    made = tuple(
        PlanStep(
            tool="restart_unit",
            arguments={"unit": f"u{n}", "script": "y" * 5000},
            why="w" * 900,
            digest=call_digest("restart_unit", {"unit": f"u{n}"}),
            origins=(origin,) * 12,
        )
        for n in range(steps)
    )
    fields: dict[str, Any] = {
        "kind": RequestKind.WAIT_PLAN,
        "tool": "propose_plan",
        "prompt": "drain, then restart",
        "steps": made,
    }
    fields.update(overrides)
    return approval(**fields)


def test_a_plan_card_shows_every_step_within_slacks_limits() -> None:
    request = plan(20)
    card = cards.request_card(request, reason="", may_answer=["U0APPROVER"])

    assert_valid(card.blocks)
    text = "\n".join(mrkdwn_texts(card.blocks))
    assert "*Plan approval needed:* drain, then restart" in text
    assert "*20.* `restart_unit`" in text
    assert "`unit` = `payments-db` came from `read_log` output, line 3" in text
    # Each step's 5,000-character script is cut on the card: the rest is a click away.
    assert action_ids_of(card.blocks) == [
        ids.APPROVE_PLAN,
        ids.STEP_BY_STEP,
        ids.DENY,
        ids.SHOW_ARGUMENTS,
    ]
    assert set(values(card.blocks)) == {request.id}
    assert card.text == "Plan approval needed: 20 steps"


def one_step_plan(step: Any) -> Request:
    return approval(kind=RequestKind.WAIT_PLAN, tool="propose_plan", prompt="p", steps=(step,))


def test_a_plan_step_cut_on_its_card_can_be_read_whole() -> None:
    # The step's dangerous part is its end: the card cuts it, so it must offer the rest.
    command = "rm -rf /tmp/" + "x" * 700 + " /"
    from bot.domain import PlanStep

    step = PlanStep(tool="run_shell", arguments={"command": command})
    request = one_step_plan(step)
    card = cards.request_card(request, reason="", may_answer=["U0APPROVER"])

    assert_valid(card.blocks)
    assert " /" + '"' not in "\n".join(mrkdwn_texts(card.blocks))
    assert ids.SHOW_ARGUMENTS in action_ids_of(card.blocks)
    view = modals.arguments_modal(request)
    assert_valid_view(view)
    shown = "".join(mrkdwn_texts(view["blocks"]))
    assert "run_shell" in shown
    assert f'"command": "{command}"' in shown


def test_a_plan_card_whose_steps_fit_offers_no_full_arguments() -> None:
    from bot.domain import PlanStep

    step = PlanStep(tool="restart_unit", arguments={"unit": "payments-db"})
    card = cards.request_card(one_step_plan(step), reason="", may_answer=[])
    assert action_ids_of(card.blocks) == [ids.APPROVE_PLAN, ids.STEP_BY_STEP, ids.DENY]


def test_an_off_plan_approval_says_how_it_differs() -> None:
    note = "off the approved plan (step 2 of restart_unit): changed argument `unit`"
    card = cards.request_card(approval(off_plan=note), reason="", may_answer=[])

    text = "\n".join(mrkdwn_texts(card.blocks))
    assert "Off the approved plan (step 2 of restart_unit): changed argument" in text


def test_a_plan_of_calls_off_an_approved_plan_says_how_they_differ() -> None:
    note = "off the approved plan: this plan's step 1 (against the approved step 2 of x): y"
    card = cards.request_card(plan(20, off_plan=note), reason="", may_answer=["U0APPROVER"])

    assert_valid(card.blocks)
    texts = mrkdwn_texts(card.blocks)
    assert texts[1] == (
        ":warning: Off the approved plan: this plan's step 1 (against the approved step 2 of x): y"
    )


def test_an_empty_reason_and_no_deadline_are_left_out() -> None:
    card = cards.request_card(approval(deadline=None), reason="  ", may_answer=[])
    text = "\n".join(mrkdwn_texts(card.blocks))
    assert "Why" not in text and "Expires" not in text and "<!date" not in text
    assert "May approve: nobody" in text


def test_two_person_rule_is_shown_and_offers_no_standing_grant() -> None:
    card = cards.request_card(approval(approvals_needed=2), reason="", may_answer=["group:S0SRE"])
    assert "Needs 2 approvals" in "\n".join(mrkdwn_texts(card.blocks))
    assert ids.APPROVE_RUN not in action_ids_of(card.blocks)


def test_a_50kb_argument_is_truncated_and_full_arguments_is_one_click_away() -> None:
    request = approval(arguments={"script": "x" * 50_000, "unit": "checkout"})
    card = cards.request_card(request, reason="r" * 5000, may_answer=["U0APPROVER"])
    assert_valid(card.blocks)
    assert sum(len(t) for t in mrkdwn_texts(card.blocks)) < 6000
    text = "\n".join(mrkdwn_texts(card.blocks))
    assert "(+49,700 characters)" in text
    assert '"unit": "checkout"' in text  # a long value does not hide the others
    assert ids.SHOW_ARGUMENTS in action_ids_of(card.blocks)
    assert set(values(card.blocks)) == {request.id}
    assert "x" * 1000 not in "".join(values(card.blocks))


def test_many_arguments_are_cut_as_a_whole() -> None:
    request = approval(arguments={f"key{i}": "v" * 100 for i in range(200)})
    card = cards.request_card(request, reason="", may_answer=[])
    assert_valid(card.blocks)
    assert "(truncated)" in "\n".join(mrkdwn_texts(card.blocks))
    assert ids.SHOW_ARGUMENTS in action_ids_of(card.blocks)


def test_short_arguments_have_no_full_arguments_button() -> None:
    card = cards.request_card(approval(), reason="", may_answer=[])
    assert ids.SHOW_ARGUMENTS not in action_ids_of(card.blocks)


def test_tool_text_and_reason_are_escaped() -> None:
    request = approval(arguments={"cmd": HOSTILE}, tool="evil<tool>")
    card = cards.request_card(request, reason=HOSTILE, may_answer=["U0APPROVER"])
    assert_valid(card.blocks)
    for text in [*mrkdwn_texts(card.blocks), card.text]:
        assert "<script>" not in text and "<!channel>" not in text and "<@U0EVIL>" not in text
        assert "&</" not in text
    joined = "\n".join(mrkdwn_texts(card.blocks))
    assert "&lt;script&gt;&amp;&lt;/script&gt;" in joined
    assert "&lt;!channel&gt;" in joined
    assert "`evil&lt;tool&gt;`" in joined


def test_arguments_cannot_close_their_code_block() -> None:
    card = cards.request_card(
        approval(arguments={"x": "```\n*bold* <!here>"}), reason="", may_answer=[]
    )
    code = mrkdwn_texts(card.blocks)[1]
    assert code.startswith("```") and code.endswith("```")
    assert code[3:-3].count("```") == 0


@pytest.mark.parametrize("run", [4, 5, 7, 9])
def test_a_run_of_backticks_cannot_close_the_code_block(run: int) -> None:
    # "```" made "``<ZWSP>`" left three backticks together in a run of five or more.
    request = approval(arguments={"x": "echo " + "`" * run + " *bold* <https://evil|docs>"})
    code = mrkdwn_texts(cards.request_card(request, reason="", may_answer=[]).blocks)[1]
    assert code[3:-3].count("```") == 0
    modal = [t for t in mrkdwn_texts(modals.arguments_modal(request)["blocks"]) if "echo" in t]
    assert modal and all(t[3:-3].count("```") == 0 for t in modal)


@pytest.mark.parametrize(
    ("principal", "shown"),
    [
        ("U0APPROVER", "<@U0APPROVER>"),
        ("W0ENTERPRISE", "<@W0ENTERPRISE>"),
        ("group:S0SRE", "<!subteam^S0SRE>"),
        ("channel:C0OPS", "<#C0OPS>"),
        ("channel:G0PRIV", "<#G0PRIV>"),
        ("*", "anyone in the workspace"),
        ("oncall", "`oncall`"),
        ("group:<!here>", "`group:&lt;!here&gt;`"),
        ("u0lower", "`u0lower`"),
    ],
)
def test_principals_render_as_mentions(principal: str, shown: str) -> None:
    assert mrkdwn.principal(principal) == shown
    card = cards.request_card(approval(), reason="", may_answer=[principal])
    assert f"May approve: {shown}" in "\n".join(mrkdwn_texts(card.blocks))


# -- closed cards ----------------------------------------------------------------------------


DECIDED_AT = datetime(2030, 1, 2, 3, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("request_", "kind", "said", "line"),
    [
        (approval(), DecisionKind.APPROVE, "", "Approved by <@U0DECIDER> <!date^"),
        (approval(), DecisionKind.APPROVE_ALWAYS, "", "Approved for this run by <@U0DECIDER>"),
        (approval(), DecisionKind.DENY, "not <now>", "Denied by <@U0DECIDER>: not &lt;now&gt;"),
        (question(), DecisionKind.ANSWER, "eu-west", "Answered by <@U0DECIDER>: eu-west"),
        (effect(), DecisionKind.RETRY, "", "Retried by <@U0DECIDER>"),
        (effect(), DecisionKind.DONE, "", "Marked done by <@U0DECIDER>"),
        (effect(), DecisionKind.FAILED, "", "Marked failed by <@U0DECIDER>"),
    ],
)
def test_a_closed_card_has_no_actions_and_names_the_decider(
    request_: Request, kind: DecisionKind, said: str, line: str
) -> None:
    decision = Decision(request_id=request_.id, kind=kind, text=said, by="U0DECIDER", at=DECIDED_AT)
    card = cards.request_card(
        request_,
        reason="why",
        may_answer=["U0APPROVER"],
        closed=cards.ClosedCard(RequestStatus.ANSWERED, decision),
    )
    assert_valid(card.blocks)
    assert "actions" not in types(card.blocks)
    assert interactive(card.blocks) == []
    assert any(line in text for text in mrkdwn_texts(card.blocks))
    assert "<@U0DECIDER>" in card.text
    assert "Expires" not in "\n".join(mrkdwn_texts(card.blocks))


def test_a_closed_card_keeps_the_facts_of_the_open_one() -> None:
    request = approval(arguments={"blob": "y" * 10_000})
    open_card = cards.request_card(request, reason="because", may_answer=["U0APPROVER"])
    closed = cards.request_card(
        request,
        reason="because",
        may_answer=["U0APPROVER"],
        closed=cards.ClosedCard(
            RequestStatus.ANSWERED,
            Decision(request_id=request.id, kind=DecisionKind.APPROVE, by="U0A"),
        ),
    )
    assert "actions" not in types(closed.blocks)
    assert mrkdwn_texts(open_card.blocks)[1] == mrkdwn_texts(closed.blocks)[1]  # the arguments
    assert "*Approval requested:* `restart_service`" in mrkdwn_texts(closed.blocks)[0]


def test_expired_and_cancelled_cards() -> None:
    request = approval()
    expired = cards.request_card(
        request,
        reason="",
        may_answer=[],
        closed=cards.ClosedCard(
            RequestStatus.EXPIRED,
            Decision(request_id=request.id, kind=DecisionKind.EXPIRED, at=DECIDED_AT),
        ),
    )
    assert any(
        f"Expired <!date^{int(DECIDED_AT.timestamp())}^" in t for t in mrkdwn_texts(expired.blocks)
    )
    bare = cards.request_card(
        request, reason="", may_answer=[], closed=cards.ClosedCard(RequestStatus.EXPIRED)
    )
    assert any("Expired" in t for t in mrkdwn_texts(bare.blocks))
    cancelled = cards.request_card(
        request, reason="", may_answer=[], closed=cards.ClosedCard(RequestStatus.CANCELLED)
    )
    assert any(t.endswith("Cancelled") for t in mrkdwn_texts(cancelled.blocks))
    for card in (expired, bare, cancelled):
        assert_valid(card.blocks)
        assert "actions" not in types(card.blocks)


# -- questions and uncertain effects ---------------------------------------------------------


def test_a_free_text_question_is_answered_in_the_thread_or_its_modal() -> None:
    request = question(prompt=f"Deploy {HOSTILE}?")
    card = cards.request_card(request, reason="", may_answer=["U0REQUESTER"])
    assert_valid(card.blocks)
    buttons = interactive(card.blocks)
    assert [(e["action_id"], e["value"]) for e in buttons] == [(ids.ANSWER, request.id)]
    text = "\n".join(mrkdwn_texts(card.blocks))
    assert "Reply in this thread to answer" in text
    assert "*Question:* Deploy &lt;script&gt;" in text
    assert "<!channel>" not in card.text


def test_a_question_with_options_has_one_button_each_carrying_its_index() -> None:
    request = question(("yes", "no"))
    card = cards.request_card(request, reason="", may_answer=["U0REQUESTER"])
    assert_valid(card.blocks)
    buttons = [e for e in interactive(card.blocks) if e["type"] == "button"]
    assert [e["text"]["text"] for e in buttons] == ["yes", "no"]
    assert [e["value"] for e in buttons] == [f"{request.id}:0", f"{request.id}:1"]
    assert all(ids.CHOOSE_PATTERN.match(e["action_id"]) for e in buttons)
    assert [ids.parse_choice(e["value"]) for e in buttons] == [(request.id, 0), (request.id, 1)]


def test_long_options_are_cut_to_the_button_limit() -> None:
    card = cards.request_card(question(("a" * 200, "")), reason="", may_answer=[])
    assert_valid(card.blocks)
    labels = [e["text"]["text"] for e in interactive(card.blocks)]
    assert len(labels[0]) == mrkdwn.BUTTON_TEXT_LIMIT and labels[0].endswith("…")
    assert labels[1] == "2. (blank)"  # numbered, as the options listed whole are


def test_options_alike_but_for_their_ends_can_be_told_apart() -> None:
    alike = "Fail over checkout from us-east-1 to us-west-2, then drain the old database "
    options = (alike + "primary", alike + "replica")
    card = cards.request_card(question(options), reason="", may_answer=[])
    assert_valid(card.blocks)
    labels = [e["text"]["text"] for e in interactive(card.blocks)]
    assert len(set(labels)) == 2
    assert labels[0].startswith("1. ") and labels[1].startswith("2. ")
    text = "\n".join(mrkdwn_texts(card.blocks))
    assert f"1. {alike}primary" in text and f"2. {alike}replica" in text


def test_short_options_are_not_numbered_or_listed() -> None:
    card = cards.request_card(question(("Yes", "No")), reason="", may_answer=[])
    assert [e["text"]["text"] for e in interactive(card.blocks)] == ["Yes", "No"]
    assert not any("1. Yes" in t for t in mrkdwn_texts(card.blocks))


def test_twenty_five_options_are_buttons_more_are_a_menu() -> None:
    request = question(tuple(f"option {i}" for i in range(25)))
    card = cards.request_card(request, reason="", may_answer=[])
    assert_valid(card.blocks)
    assert [e["type"] for e in interactive(card.blocks)] == ["button"] * 25

    request = question(tuple(f"option {i}" for i in range(130)))
    card = cards.request_card(request, reason="", may_answer=[])
    assert_valid(card.blocks)
    (select,) = interactive(card.blocks)
    assert select["type"] == "static_select" and select["action_id"] == ids.CHOOSE
    assert len(select["options"]) == mrkdwn.SELECT_OPTIONS_LIMIT
    assert select["options"][7]["value"] == ids.choice_value(request.id, 7)
    assert any("30 more options" in t for t in mrkdwn_texts(card.blocks))


def test_an_uncertain_effect_offers_retry_done_failed() -> None:
    request = effect()
    card = cards.request_card(request, reason="", may_answer=["U0ONCALL"])
    assert_valid(card.blocks)
    text = "\n".join(mrkdwn_texts(card.blocks))
    assert "The outcome of `restart_service` is uncertain" in text
    assert "did it take effect?" in text and '"unit": "checkout.service"' in text
    assert "May settle: <@U0ONCALL>" in text
    assert action_ids_of(card.blocks) == [ids.EFFECT_RETRY, ids.EFFECT_DONE, ids.EFFECT_FAILED]
    assert set(values(card.blocks)) == {request.id}
    retry = interactive(card.blocks)[0]
    assert "confirm" in retry  # running an effect twice deserves a second look


def test_values_never_carry_people_or_arguments() -> None:
    built = [
        cards.request_card(approval(arguments={"to": "U0VICTIM"}), reason="", may_answer=["U0A"]),
        cards.request_card(question(("yes", "no")), reason="", may_answer=["U0A"]),
        cards.request_card(effect(), reason="", may_answer=["U0A"]),
    ]
    for card in built:
        for value in values(card.blocks):
            assert "U0" not in value and "checkout" not in value
            assert ids.parse_request_value(value) or ids.parse_choice(value)


# -- answers ---------------------------------------------------------------------------------


def test_answer_message_has_markdown_payload_fields_and_feedback() -> None:
    result = TerminalResult(
        status=RunStatus.COMPLETED,
        stop_reason=StopReason.ANSWERED,
        text="**Restarted** checkout. <!channel> see `logs`.",
        payload={
            "service": "checkout",
            "healthy": True,
            "pods": [1, 2],
            "note": "a <b> & c",
            **{f"extra{i}": i for i in range(12)},
        },
        usage=Usage(input_tokens=1000, output_tokens=234),
    )
    message = answers.answer_message(result, run_id="run_0123456789abcdef")
    assert_valid(message.blocks)
    (markdown,) = [block for block in message.blocks if block["type"] == "markdown"]
    assert markdown["text"].startswith("**Restarted** checkout.")
    assert "<!channel>" not in markdown["text"]  # an answer pings no one
    fields = [f["text"] for block in message.blocks for f in block.get("fields", [])]
    assert "*service*\ncheckout" in fields
    assert "*healthy*\n`true`" in fields
    assert "*pods*\n`[1, 2]`" in fields
    assert "*note*\na &lt;b&gt; &amp; c" in fields
    assert len(fields) == 16
    (actions,) = [block for block in message.blocks if block["type"] == "context_actions"]
    (feedback,) = actions["elements"]
    assert feedback["type"] == "feedback_buttons" and feedback["action_id"] == ids.FEEDBACK
    assert feedback["positive_button"]["value"] == "up:run_0123456789abcdef"
    assert feedback["negative_button"]["value"] == "down:run_0123456789abcdef"
    assert ids.parse_feedback(feedback["negative_button"]["value"]) == (
        False,
        "run_0123456789abcdef",
    )
    assert "1,234 tokens" in "\n".join(mrkdwn_texts(message.blocks))
    assert "<!channel>" not in message.text
    assert answers.answer_continuations(result) == []


def test_a_failed_run_says_so() -> None:
    result = TerminalResult(
        status=RunStatus.FAILED, stop_reason=StopReason.TOKEN_BUDGET, error="used 200,001 <tokens>"
    )
    message = answers.answer_message(result, run_id="run_x")
    assert_valid(message.blocks)
    text = "\n".join(mrkdwn_texts(message.blocks))
    assert "*Run failed: token budget exhausted*" in text
    assert "used 200,001 &lt;tokens&gt;" in text
    assert message.text == "Run failed: token budget exhausted"
    assert "context_actions" in types(message.blocks)


def test_a_cancelled_run_is_not_cancelled_twice() -> None:
    result = TerminalResult(status=RunStatus.CANCELLED, stop_reason=StopReason.CANCELLED)
    message = answers.answer_message(result, run_id="run_x")
    assert message.text == "Run cancelled"


def test_a_long_answer_goes_on_in_further_messages() -> None:
    paragraphs = [f"Paragraph {i}. " + "word " * 400 for i in range(40)]  # ~80 KB
    text = "\n\n".join(paragraphs[:20]) + "\n\n```\n" + "code line\n" * 2000 + "```\n\n"
    text += "\n\n".join(paragraphs[20:])
    result = TerminalResult(status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED, text=text)
    first = answers.answer_message(result, run_id="run_x")
    assert_valid(first.blocks)
    rest = answers.answer_continuations(result)
    assert 1 <= len(rest) <= mrkdwn.MAX_CONTINUATIONS
    chunks = [
        block["text"] for m in [first, *rest] for block in m.blocks if block["type"] == "markdown"
    ]
    for message in rest:
        assert_valid(message.blocks)
    for chunk in chunks:
        assert len(chunk) <= mrkdwn.MARKDOWN_BLOCK_LIMIT
        assert chunk.count("```") % 2 == 0  # a fence cut in two is closed and reopened
    joined = "".join(chunks)
    assert "Paragraph 0." in joined and "Paragraph 39." in joined
    assert "goes on in the next" in "\n".join(mrkdwn_texts(first.blocks))


def test_a_huge_answer_says_it_was_cut() -> None:
    result = TerminalResult(
        status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED, text="z" * 500_000
    )
    rest = answers.answer_continuations(result)
    assert len(rest) == mrkdwn.MAX_CONTINUATIONS
    assert "(truncated)" in rest[-1].blocks[0]["text"]
    assert "journal" in "\n".join(mrkdwn_texts(rest[-1].blocks))


def test_a_structured_only_answer() -> None:
    result = TerminalResult(
        status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED, payload={"ok": True}
    )
    message = answers.answer_message(result, run_id="run_x")
    assert_valid(message.blocks)
    assert "markdown" not in types(message.blocks)


# -- progress, status, listings --------------------------------------------------------------


def test_progress_and_working_message() -> None:
    assert (
        status.progress_text("calling `restart_service`") == "Working… • calling `restart_service`"
    )
    assert status.progress_text("") == "Working…"
    assert "&lt;!here&gt;" in status.progress_text("<!here>")
    lines = [f"step {i}" for i in range(15)]
    message = status.working_message(lines)
    assert_valid(message.blocks)
    text = mrkdwn_texts(message.blocks)[0]
    assert "step 4" not in text and "step 5" in text and "step 14" in text
    assert "5 earlier step(s)" in "\n".join(mrkdwn_texts(message.blocks))
    assert message.text == "Working… • step 14"
    assert_valid(status.working_message([]).blocks)


def run_view(status: RunStatus = RunStatus.SUSPENDED, max_tokens: int = 200_000) -> RunView:
    request = approval()
    record = RunRecord(
        id="run_0123456789abcdef",
        session_id="slack:T0TEAM:C0CHAN:1712345678.000100",
        prompt="restart <checkout> please",
        requested_by="U0REQUESTER",
        status=status,
        stop_reason="waiting",
    )
    state = RunState(
        run_id=record.id,
        started=RunStarted(
            run_id=record.id,
            session_id=record.session_id,
            fingerprint=Fingerprint(
                provider="p", model="m", tools_digest="t", system_prompt_digest="s"
            ),
            budgets=Budgets(max_tokens=max_tokens),
        ),
        iteration=3,
        tool_calls=4,
        usage=Usage(input_tokens=1000, output_tokens=234),
        batch=[CallState(call=ToolCall(id="call_1", name="restart_service"), deferred=request)],
        status=status,
    )
    return RunView(record, state)


def test_status_message() -> None:
    message = status.status_message(run_view())
    assert_valid(message.blocks)
    text = "\n".join(mrkdwn_texts(message.blocks))
    assert "`run_0123456789abcdef` · *suspended*: waiting for people" in text
    assert "Requested by <@U0REQUESTER>" in text
    assert "restart &lt;checkout&gt; please" in text
    assert "• approval `restart_service` · expires <!date^" in text
    assert "iterations 3/20, tool calls 4/50, tokens 1,234/200,000" in text
    assert "tokens 1,234" in "\n".join(
        mrkdwn_texts(status.status_message(run_view(max_tokens=0)).blocks)
    )
    assert "tokens 1,234/" not in "\n".join(
        mrkdwn_texts(status.status_message(run_view(max_tokens=0)).blocks)
    )


def pending(run: str, tool: str, minutes: int, **overrides: Any) -> PendingRequest:
    request = approval(
        run_id=run, tool=tool, created_at=DECIDED_AT + timedelta(minutes=minutes), **overrides
    )
    return PendingRequest(request, ("U0APPROVER", "group:S0SRE"))


def test_runs_message_groups_by_run_with_links() -> None:
    items = [
        pending("run_a", "restart_service", 0),
        pending("run_b", "drain_node", 1),
        pending("run_a", "flush_cache", 2, kind=RequestKind.WAIT_USER),
    ]
    links = {"run_a": "https://example.slack.com/archives/C0/p1712345678000100"}
    message = listings.runs_message(items, links)
    assert_valid(message.blocks)
    texts = mrkdwn_texts(message.blocks)
    assert "2 run(s)" in texts[0]
    assert texts[1].startswith(
        "*Run* `run_a` · <https://example.slack.com/archives/C0/p1712345678000100|thread>"
    )
    assert "• approval `restart_service`" in texts[1] and "• question `flush_cache`" in texts[1]
    assert "{ago}" in texts[1]
    assert "may answer: <@U0APPROVER>, <!subteam^S0SRE>" in texts[1]
    assert texts[2].startswith("*Run* `run_b`") and "|thread>" not in texts[2]


def test_runs_message_empty_and_overfull() -> None:
    assert listings.runs_message([], {}).text == "Nothing is waiting."
    assert_valid(listings.runs_message([], {}).blocks)
    many = [pending(f"run_{i}", "t", i) for i in range(80)]
    message = listings.runs_message(many, {"run_1": "javascript:alert(1)"})
    assert_valid(message.blocks)
    assert "javascript:" not in json.dumps(message.blocks)
    assert "and 32 more run(s)" in mrkdwn_texts(message.blocks)[-1]
    crowded = [pending("run_a", "t" * 60, i) for i in range(100)]
    message = listings.runs_message(crowded, {})
    assert_valid(message.blocks)
    assert "more" in mrkdwn_texts(message.blocks)[1].splitlines()[-1]


def test_home_view() -> None:
    items = [
        pending("run_a", "restart_service", 0),
        pending("run_a", "ask_human_input", 1, kind=RequestKind.WAIT_USER, prompt="Which <db>?"),
        pending("run_b", "drain_node", 2, kind=RequestKind.WAIT_EFFECT),
    ]
    view = listings.home_view(items, {"run_a": "https://example.slack.com/archives/C0/p1"}, "U0ME")
    assert view["type"] == "home"
    assert_valid_view(view)
    text = "\n".join(mrkdwn_texts(view["blocks"]))
    assert "Approvals you may decide* (1)" in text and "Questions for you* (1)" in text
    assert (
        "Which &lt;db&gt;?" in text
        and "<https://example.slack.com/archives/C0/p1|open the thread>" in text
    )
    empty = listings.home_view([], {}, "U0ME")
    assert_valid_view(empty)
    assert "Nothing is waiting on you, <@U0ME>" in "\n".join(mrkdwn_texts(empty["blocks"]))
    crowded = listings.home_view([pending(f"run_{i}", "t", i) for i in range(300)], {}, "U0ME")
    assert_valid_view(crowded)


# -- modals ----------------------------------------------------------------------------------


def test_deny_modal() -> None:
    request = approval()
    view = modals.deny_modal(request)
    assert_valid_view(view)
    assert view["callback_id"] == ids.DENY_MODAL and view["private_metadata"] == request.id
    assert view["title"]["text"] == "Deny" and view["submit"]["text"] == "Deny"
    (block,) = [block for block in view["blocks"] if block["type"] == "input"]
    assert block["block_id"] == ids.REASON_BLOCK and block["optional"] is True
    assert block["element"]["action_id"] == ids.REASON_ACTION
    assert block["element"]["type"] == "plain_text_input" and block["element"]["multiline"]


def test_answer_modal() -> None:
    request = question(prompt=f"Why {HOSTILE}?")
    view = modals.answer_modal(request)
    assert_valid_view(view)
    assert view["callback_id"] == ids.ANSWER_MODAL and view["private_metadata"] == request.id
    (block,) = [block for block in view["blocks"] if block["type"] == "input"]
    assert block["block_id"] == ids.ANSWER_BLOCK
    assert block["element"]["action_id"] == ids.ANSWER_ACTION
    assert "<script>" not in json.dumps(view["blocks"])


def test_arguments_modal_shows_everything_that_fits() -> None:
    request = approval(arguments={"script": "line <&>\n" * 5000})  # ~45 KB, escaped ~90 KB
    view = modals.arguments_modal(request)
    assert_valid_view(view)
    codes = [t for t in mrkdwn_texts(view["blocks"]) if t.startswith("```")]
    assert len(codes) > 10
    assert all(t.endswith("```") for t in codes)
    assert "line &lt;&amp;&gt;" in codes[0]
    huge = modals.arguments_modal(approval(arguments={"blob": "q" * 400_000}))
    assert_valid_view(huge)
    assert len(huge["blocks"]) == mrkdwn.VIEW_BLOCKS_LIMIT
    assert "kestrel runs show run_0123456789abcdef" in mrkdwn_texts(huge["blocks"])[-1]


def test_ephemeral_text() -> None:
    assert mrkdwn.ephemeral_text("you may not <!here> & go") == "you may not &lt;!here&gt; &amp; go"
    assert len(mrkdwn.ephemeral_text("x" * 10_000)) <= mrkdwn.SECTION_TEXT_LIMIT


# -- ids -------------------------------------------------------------------------------------


def test_choice_values_round_trip_and_garbage_is_refused() -> None:
    assert ids.parse_choice(ids.choice_value("req_0123456789abcdef", 3)) == (
        "req_0123456789abcdef",
        3,
    )
    for garbage in [
        "",
        "req_1",
        "req_1:",
        ":1",
        "req_1:-1",
        "req_1:01",
        "req_1:1:2",
        "req_1:99999",
        "req 1:1",
        "req_1:1\n",
        "req_1:\u0661",  # a non-ASCII digit
        "U0EVIL:1 approve",
        "x" * 200 + ":1",
    ]:
        assert ids.parse_choice(garbage) is None, garbage
    with pytest.raises(ValueError):
        ids.choice_value("req:1", 0)
    with pytest.raises(ValueError):
        ids.choice_value("req_1", -1)


def test_feedback_values_round_trip_and_garbage_is_refused() -> None:
    assert ids.parse_feedback("up:run_abc") == (True, "run_abc")
    assert ids.parse_feedback(ids.feedback_value("run_abc", positive=False)) == (False, "run_abc")
    for garbage in ["", "up", "up:", "sideways:run_abc", "UP:run_abc", "up:run abc", "up:a:b"]:
        assert ids.parse_feedback(garbage) is None, garbage


def test_thread_session_ids_round_trip_and_garbage_is_refused() -> None:
    session = ids.thread_session_id("T0TEAM", "C0CHAN", "1712345678.000100")
    assert session == "slack:T0TEAM:C0CHAN:1712345678.000100"
    assert ids.parse_thread_session(session) == ids.SlackThread(
        "T0TEAM", "C0CHAN", "1712345678.000100"
    )
    for garbage in [
        "",
        "ses_0123",
        "console:x",
        "slack:T0TEAM:C0CHAN",
        "slack:T0TEAM:C0CHAN:1712345678.000100:extra",
        "discord:T0TEAM:C0CHAN:1712345678.000100",
        "slack:t0team:C0CHAN:1712345678.000100",
        "slack:T0TEAM:C0CHAN:now",
        "slack:T0TEAM:<!here>:1712345678.000100",
        "slack::C0CHAN:1712345678.000100",
    ]:
        assert ids.parse_thread_session(garbage) is None, garbage
    with pytest.raises(ValueError):
        ids.thread_session_id("T0", "C0:evil", "1.2")


def test_request_values() -> None:
    assert ids.parse_request_value("req_0123456789abcdef") == "req_0123456789abcdef"
    assert ids.parse_request_value("req_1:0") is None
    assert ids.parse_request_value("") is None


def test_every_id_has_the_prefix_and_none_repeats() -> None:
    every = [*ids.ACTION_IDS, *ids.CALLBACK_IDS]
    assert len(set(every)) == len(every)
    assert all(i.startswith(ids.PREFIX) for i in every)
    assert ids.CHOOSE_PATTERN.match(ids.CHOOSE)
    assert ids.CHOOSE_PATTERN.match(ids.choice_action_id(24))
    assert not ids.CHOOSE_PATTERN.match(ids.CHOOSE + "x")
    assert not ids.CHOOSE_PATTERN.match(ids.CHOOSE + ":1\n")


def test_one_pattern_routes_every_action_and_canonical_action_names_it() -> None:
    card = cards.request_card(question(("yes", "no")), reason="", may_answer=[])
    option_ids = action_ids_of(card.blocks)
    for action_id in [*ids.ACTION_IDS, *option_ids]:
        assert ids.ACTION_PATTERN.search(action_id), action_id
    assert [ids.canonical_action(a) for a in option_ids] == [ids.CHOOSE, ids.CHOOSE]
    assert ids.canonical_action(ids.DENY) == ids.DENY
    for garbage in ["", "kestrel_", "kestrel_deny2", "kestrel_choose:", "kestrel_choose:1\n", "x"]:
        assert ids.canonical_action(garbage) is None, garbage
        assert not ids.ACTION_PATTERN.search(garbage), garbage


# -- the manifest ----------------------------------------------------------------------------


def test_the_manifest_parses_and_asks_for_what_the_adapter_uses() -> None:
    manifest = yaml.safe_load((ROOT / "manifests" / "slack-app.yaml").read_text())
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    assert {
        "app_mentions:read",
        "chat:write",
        "channels:history",
        "groups:history",
        "users:read",
        "usergroups:read",
        "commands",
    } <= scopes
    settings = manifest["settings"]
    assert settings["socket_mode_enabled"] is False
    assert settings["interactivity"]["is_enabled"] is True
    events = set(settings["event_subscriptions"]["bot_events"])
    assert {"app_mention", "message.channels", "message.groups", "app_home_opened"} <= events
    # What Kestrel keeps of a group's or a channel's members goes when Slack says it changed.
    assert set(MEMBERSHIP_EVENTS) <= events
    (command,) = manifest["features"]["slash_commands"]
    assert command["command"] == "/kestrel"
    assert manifest["features"]["app_home"]["home_tab_enabled"] is True


# -- links in model text ---------------------------------------------------------------------

DISGUISED = "Pay at <https://evil.example|https://bank.example>; see [docs](https://evil.example)."
# Anything Slack (mrkdwn or a markdown block) could show as a link labelled other than its
# target: <target|label> (not a mention) or [label](target).
MASKED_LINK = __import__("re").compile(r"<(?![@#!])[^<>|]+\|[^<>]*>|\]\(")


def texts_of(node: Any) -> list[str]:
    """Every string in a message: text objects, markdown blocks, fallback text."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [t for value in node.values() for t in texts_of(value)]
    if isinstance(node, list):
        return [t for item in node for t in texts_of(item)]
    return []


def assert_unmasked(message: Any) -> None:
    texts = texts_of(message)
    assert not [t for t in texts if MASKED_LINK.search(t)]
    assert any("https://evil.example" in t for t in texts)


def test_a_link_in_model_text_shows_its_target_on_answers_and_cards() -> None:
    from adapters.slack.look import SlackLook

    result = TerminalResult(
        status=RunStatus.COMPLETED,
        stop_reason=StopReason.ANSWERED,
        text=DISGUISED,
        payload={"[docs](https://evil.example)": DISGUISED},
    )
    look = SlackLook(link=lambda run, at: f"https://kestrel.example/runs/{run}?sig=abc&exp=1")
    (answer,) = look.answer(result, "run_x", DEADLINE)
    (markdown,) = [block for block in answer["blocks"] if block["type"] == "markdown"]
    assert "https://bank.example (https://evil.example)" in markdown["text"]
    assert "docs (https://evil.example)" in markdown["text"]
    view_run = answer["blocks"].pop()  # Kestrel's own link stays a working link
    assert view_run["elements"][0]["text"] == (
        "<https://kestrel.example/runs/run_x?sig=abc&exp=1|View run>"
    )
    assert_unmasked(answer)
    long = TerminalResult(
        status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED, text="x\n\n" * 7000 + DISGUISED
    )
    assert_unmasked([m.blocks for m in answers.answer_continuations(long)])
    failed = TerminalResult(
        status=RunStatus.FAILED, stop_reason=StopReason.MODEL_ERROR, text=DISGUISED
    )
    assert_unmasked(answers.answer_message(failed, run_id="run_x").body())

    card = cards.request_card(approval(), reason=DISGUISED, may_answer=["U0APPROVER"])
    why = "*Why:*\n>Pay at https://bank.example (https://evil.example); see docs (https://evil.example)."
    assert why in mrkdwn_texts(card.blocks)
    assert_unmasked(card.body())
    asked = cards.request_card(question(prompt=DISGUISED), reason="", may_answer=["U0APPROVER"])
    assert_unmasked(asked.body())
    assert_unmasked(modals.answer_modal(question(prompt=DISGUISED)))
    said = Decision(request_id="req_1", kind=DecisionKind.DENY, text=DISGUISED, by="U0DECIDER")
    closed = cards.request_card(
        approval(), reason="", may_answer=[], closed=cards.ClosedCard(RequestStatus.ANSWERED, said)
    )
    assert_unmasked(closed.body())
    assert_unmasked(status.working_message([DISGUISED]).body())
    assert_unmasked(mrkdwn.ephemeral_text(DISGUISED))


def test_a_link_in_a_calls_arguments_is_shown_exactly_in_its_code_block() -> None:
    card = cards.request_card(
        approval(arguments={"body": "[docs](https://evil.example)"}), reason="", may_answer=[]
    )
    code = next(t for t in mrkdwn_texts(card.blocks) if t.startswith("```"))
    assert '"body": "[docs](https://evil.example)"' in code  # what is approved, as it is


def test_a_question_card_shown_as_text_names_its_request_and_keeps_its_options() -> None:
    # Slack refused the card's blocks: its text alone is shown. Each option button's value is
    # REQUEST:N, not a request; and the options, the model's words, are all a reader can reply.
    from slack_sdk.errors import SlackApiError

    from adapters.slack import transport

    request = approval(
        kind=RequestKind.WAIT_USER, prompt="Which region?", options=("eu <!channel>", "us")
    )
    card = cards.request_card(request, reason="", may_answer=["U0APPROVER"])
    refused = SlackApiError("refused", {"ok": False, "error": "invalid_blocks"})  # type: ignore[no-untyped-call]

    text = transport._plain_instead(refused, "card", card.body())["text"]

    assert f"request `{request.id}`" in text and f"{request.id}:0" not in text
    assert "eu &lt;!channel&gt;" in text and "<!channel>" not in text
    assert "us" in text


# A zero-width space and a tag character: the card would read "rm -rf /tmp/x" for a value
# that is not that.
HIDDEN = "rm -rf /tmp/x\u200b\U000e0041"
NAMED = "rm -rf /tmp/x[U+200B][U+E0041]"


def test_invisible_characters_in_arguments_are_named_on_cards_and_the_modal() -> None:
    from bot.domain import PlanStep

    request = approval(arguments={"command": HIDDEN})
    card = "\n".join(mrkdwn_texts(cards.request_card(request, reason="", may_answer=[]).blocks))
    step = PlanStep(tool="run_shell", arguments={"command": HIDDEN})
    planned = one_step_plan(step)
    plan_card = cards.request_card(planned, reason="", may_answer=[])
    off = approval(off_plan=f"off the approved plan: changed argument `command`: `{HIDDEN}`")
    off_card = cards.request_card(off, reason="", may_answer=[])
    modal = "".join(mrkdwn_texts(modals.arguments_modal(request)["blocks"]))
    plan_modal = "".join(mrkdwn_texts(modals.arguments_modal(planned)["blocks"]))

    for shown in (card, "\n".join(mrkdwn_texts(plan_card.blocks)), modal, plan_modal):
        assert f'"command": "{NAMED}"' in shown
    assert f"`{NAMED}`" in "\n".join(mrkdwn_texts(off_card.blocks))
    assert request.arguments == {"command": HIDDEN}  # what runs is untouched


def test_invisible_characters_in_a_questions_options_are_named() -> None:
    # Two options that differ only by a zero-width space and a tag character read alike on
    # their buttons, and the one clicked is the answer the model reads, hidden part and all.
    for count in (2, 30):  # buttons, then a menu
        options = ("skip", f"skip{HIDDEN[-2:]}", *(f"other {n}" for n in range(count - 2)))
        card = cards.request_card(question(options), reason="", may_answer=[])
        shown = json.dumps(card.blocks, ensure_ascii=False)
        assert "skip[U+200B][U+E0041]" in shown, count
        assert HIDDEN[-2:] not in shown, count
