"""Hostile checks of what Kestrel's Discord messages look like, against Discord's documented
limits (which the fake enforces too, `discord_limits.py`): a body Discord refuses with 400 is
retried by the outbox forever and never shown."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from adapters.discord.look import (
    ARGUMENTS_MESSAGES,
    CUT_NOTE,
    DiscordLook,
    arguments_messages,
    note_text,
    runs_listing,
    working,
)
from bot.chat.service import RequestView
from bot.domain import (
    Decision,
    DecisionKind,
    PlanStep,
    Request,
    RequestKind,
    RequestStatus,
    RunStatus,
    StopReason,
    TerminalResult,
)

# https://discord.com/developers/docs/resources/message#embed-object-embed-limits
EMBED_TOTAL = 6000
FIELDS = 25


NOW = datetime(2030, 1, 1, tzinfo=UTC)


def refusals(body: dict[str, Any]) -> list[str]:
    """Why Discord would refuse ``body`` (empty: it would take it)."""
    why = []
    if len(str(body.get("content") or "")) > 2000:
        why.append("content > 2000")
    embeds = body.get("embeds") or []
    total = 0
    for embed in embeds:
        total += len(embed.get("title", "")) + len(embed.get("description", ""))
        fields = embed.get("fields") or []
        if len(fields) > FIELDS:
            why.append("more than 25 fields")
        for field in fields:
            if not field["name"] or len(field["name"]) > 256:
                why.append(f"field name {field['name']!r} empty or > 256")
            if not field["value"] or len(field["value"]) > 1024:
                why.append("field value empty or > 1024")
            total += len(field["name"]) + len(field["value"])
    if total > EMBED_TOTAL:
        why.append(f"embeds total {total} > {EMBED_TOTAL}")
    for row in body.get("components") or []:
        for component in row.get("components") or []:
            if component["type"] == 2 and not component.get("label"):
                why.append("a button without a label")
            if component["type"] == 3:
                for option in component["options"]:
                    if not option["label"]:
                        why.append("a select option without a label")
    return why


def _done(text: str, payload: dict[str, Any] | None = None) -> TerminalResult:
    return TerminalResult(
        status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED, text=text, payload=payload
    )


def test_a_payload_with_long_values_makes_an_answer_discord_takes() -> None:
    # Ten keys of 700 characters: each field fits (<= 1024), the embed does not (> 6000).
    payload = {f"key{i}": "x" * 700 for i in range(10)}
    text = "```json\n" + json.dumps(payload) + "\n```"
    bodies = DiscordLook().answer(_done(text[:1900], payload), "run_1", NOW)
    assert [refusals(b) for b in bodies] == [[] for _ in bodies]


def test_a_payload_with_an_empty_key_makes_an_answer_discord_takes() -> None:
    bodies = DiscordLook().answer(_done('{"": 1, "ok": true}', {"": 1, "ok": True}), "run_1", NOW)
    assert [refusals(b) for b in bodies] == [[] for _ in bodies]


def test_a_payload_with_30_keys_shows_them_all_or_says_some_are_left_out() -> None:
    payload = {f"k{i:02d}": i for i in range(30)}
    bodies = DiscordLook().answer(_done(json.dumps(payload), payload), "run_1", NOW)
    shown = json.dumps(bodies)
    assert [refusals(b) for b in bodies] == [[] for _ in bodies]
    assert '"k29"' in shown or "more" in shown.lower(), "5 keys silently dropped"


def test_a_huge_answer_says_it_was_cut() -> None:
    text = "\n".join(f"line {i:05d} " + "y" * 90 for i in range(400))  # ~40,000 characters
    bodies = DiscordLook().answer(_done(text), "run_1", NOW)
    assert all(not refusals(b) for b in bodies)
    shown = "".join(str(b["content"]) for b in bodies)
    assert "line 00399" in shown or "truncated" in shown.lower() or "cut" in shown.lower(), (
        f"{len(text) - len(shown)} characters dropped without a word"
    )


def test_an_answer_split_inside_a_code_fence_keeps_each_part_fenced() -> None:
    code = "\n".join(f"    step {i}: " + "z" * 40 for i in range(80))  # ~4,500 characters
    bodies = DiscordLook().answer(_done(f"Here is the log:\n```\n{code}\n```\nDone."), "run_1", NOW)
    assert len(bodies) > 1
    for body in bodies:
        # Every message must have balanced fences, or Discord shows the rest as prose/code.
        assert str(body["content"]).count("```") % 2 == 0, body["content"][:80]


def _view(request: Request, may: tuple[str, ...] = ("1002",), reason: str = "") -> RequestView:
    return RequestView(request, RequestStatus.OPEN, None, may, reason)


def _question(options: tuple[str, ...], prompt: str = "Which?") -> Request:
    """An open question of ``options`` (``ask_human_select``'s)."""
    return Request(
        run_id="run_1",
        kind=RequestKind.WAIT_USER,
        call_id="c",
        tool="ask_human_select",
        prompt=prompt,
        options=options,
    )


def test_a_select_with_an_empty_option_is_a_card_discord_takes() -> None:
    options = ("", *[f"opt{i}" for i in range(30)])
    request = _question(options)
    assert refusals(DiscordLook().card(_view(request))) == []


def test_buttons_with_an_empty_option_are_a_card_discord_takes() -> None:
    request = _question(("", "eu-west"))
    assert refusals(DiscordLook().card(_view(request))) == []


def test_a_long_why_and_long_arguments_make_a_card_discord_takes() -> None:
    request = Request(
        run_id="run_1",
        kind=RequestKind.WAIT_APPROVAL,
        call_id="c",
        tool="restart_service",
        arguments={f"a{i}": "v" * 150 for i in range(20)},
    )
    may = tuple(f"group:{10**17 + i}" for i in range(60))  # a policy naming many roles
    card = DiscordLook().card(_view(request, may, reason="because " * 700))
    assert refusals(card) == []


def test_a_select_with_more_than_25_options_offers_them_all() -> None:
    options = tuple(f"node-{i}" for i in range(40))
    request = _question(options, "Which node?")
    card = json.dumps(DiscordLook().card(_view(request)))
    assert "node-39" in card, "options 26-40 cannot be chosen on the card (nor is it said)"


def test_a_question_past_five_menus_offers_the_rest_through_its_answer_form() -> None:
    """Five menus hold 125 options: options 126 to 130 were on no menu, and the card said
    nothing of them. Four menus now hold the first 100, the fifth row is the Answer form, and
    the card lists the others and says how to give one."""
    options = tuple(f"node-{i}" for i in range(130))
    request = _question(options, "Which node?")
    card = DiscordLook(lambda run_id, _at: f"https://k.example/runs/{run_id}").card(_view(request))
    assert refusals(card) == []
    rows = card["components"]
    menus = [c for row in rows for c in row["components"] if c["type"] == 3]
    assert [o["label"] for menu in menus for o in menu["options"]] == list(options[:100])
    last = [c.get("custom_id") or c.get("url") for c in rows[-1]["components"]]
    assert last == ["kestrel:answer:" + request.id, "https://k.example/runs/run_1"]
    description = card["embeds"][0]["description"]
    assert "Options 101 to 130 are in no menu: press **Answer** and type one" in description
    assert "101. node-100" in description and "130. node-129" in description
    assert "100. node-99" not in description  # in a menu: not listed again


def test_mentions_in_a_question_and_a_reason_are_defused() -> None:
    request = Request(
        run_id="run_1",
        kind=RequestKind.WAIT_APPROVAL,
        call_id="c",
        tool="restart_service",
        arguments={"service": "@everyone <@&300> <@1002>"},
    )
    card = DiscordLook().card(_view(request, reason="@here ping <@&300> [x](https://evil)"))
    # Only the one who may answer is notified, never a role or @everyone the text names.
    assert card["allowed_mentions"] == {"parse": [], "users": ["1002"], "roles": []}
    description = card["embeds"][0]["description"]
    assert "@here" not in description and "<@&300>" not in description


MAY = ("1002", "group:300", "role:300", "role:301", "*", "channel:400", "U0SLACK", "group:ops")


def test_an_open_card_and_a_reminder_notify_exactly_who_may_answer() -> None:
    request = Request(
        run_id="run_1", kind=RequestKind.WAIT_APPROVAL, call_id="c", tool="restart_service"
    )
    exactly = {"parse": [], "users": ["1002"], "roles": ["300", "301"]}
    card = DiscordLook().card(_view(request, MAY))
    reminder = DiscordLook().reminder(_view(request, MAY))
    for body in (card, reminder):
        assert body["allowed_mentions"] == exactly
        # Discord notifies only mentions in the content (never in an embed).
        assert all(m in body["content"] for m in ("<@1002>", "<@&300>", "<@&301>"))
        assert "<#400>" in body["content"] and "@everyone" not in body["content"]
    closed = RequestView(request, RequestStatus.EXPIRED, None, MAY, "")
    assert DiscordLook().card(closed)["allowed_mentions"] == {"parse": []}
    nobody = DiscordLook().card(_view(request, ("*", "channel:400", "U0SLACK")))
    assert nobody["allowed_mentions"] == {"parse": []} and nobody["content"] == ""


def test_with_pings_off_no_card_or_reminder_notifies_anyone() -> None:
    request = Request(run_id="run_1", kind=RequestKind.WAIT_USER, call_id="c", tool="ask")
    quiet = DiscordLook(pings=False)
    card, reminder = quiet.card(_view(request, MAY)), quiet.reminder(_view(request, MAY))
    assert card["allowed_mentions"] == reminder["allowed_mentions"] == {"parse": []}
    assert card["content"] == ""
    assert "<@1002>" in reminder["content"]  # still named, not notified


def test_a_card_carries_the_signed_view_run_link_beside_its_buttons() -> None:
    look = DiscordLook(link=lambda run, at: f"https://k.example/runs/{run}?exp={at:%Y}&sig=ab")
    request = Request(
        run_id="run_1",
        kind=RequestKind.WAIT_APPROVAL,
        call_id="c",
        tool="restart_service",
        created_at=NOW,
    )
    for view in (_view(request), RequestView(request, RequestStatus.EXPIRED, None, (), "")):
        card = look.card(view)
        links = [c for row in card["components"] for c in row["components"] if c.get("style") == 5]
        assert links == [
            {
                "type": 2,
                "style": 5,
                "label": "View run",
                "url": "https://k.example/runs/run_1?exp=2030&sig=ab",
            }
        ]
        assert refusals(card) == []


DISGUISED = "Pay at <https://evil.example|https://bank.example>; see [docs](https://evil.example)."


def _texts(node: Any) -> list[str]:
    """Every string of a message body: content, embed titles, descriptions, fields, labels."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [t for value in node.values() for t in _texts(value)]
    if isinstance(node, list):
        return [t for item in node for t in _texts(item)]
    return []


def _assert_unmasked(body: Any) -> None:
    texts = _texts(body)
    # Discord renders [label](target) (and [label](<target>)) in content, descriptions and
    # field values; a Slack-style <target|label> is shown unmasked too.
    assert not [t for t in texts if "](" in t or "<https://evil.example|" in t]
    assert any("https://evil.example" in t for t in texts)


def test_a_link_in_model_text_shows_its_target_on_answers_and_cards() -> None:
    look = DiscordLook(link=lambda run, at: f"https://kestrel.example/runs/{run}?sig=abc")
    result = _done(DISGUISED, payload={"[docs](https://evil.example)": DISGUISED, "n": [DISGUISED]})
    (answer,) = look.answer(result, "run_1", NOW)
    assert answer["content"] == (
        "Pay at https://bank.example (https://evil.example); see docs (https://evil.example)."
    )
    view_run = answer["components"][-1]["components"][-1]  # Kestrel's own link still works
    assert view_run["url"] == "https://kestrel.example/runs/run_1?sig=abc"
    _assert_unmasked(answer)
    failed = TerminalResult(
        status=RunStatus.FAILED, stop_reason=StopReason.MODEL_ERROR, error=DISGUISED, text=""
    )
    _assert_unmasked(look.answer(failed, "run_1", NOW))

    request = Request(
        run_id="run_1",
        kind=RequestKind.WAIT_APPROVAL,
        call_id="c",
        tool="restart_service",
        arguments={"body": "[docs](https://evil.example)"},
    )
    card = look.card(_view(request, reason=DISGUISED))
    description = card["embeds"][0]["description"]
    assert "see docs (https://evil.example)" in description
    arguments = card["embeds"][0]["fields"][0]["value"]
    assert '"body": "[docs](https://evil.example)"' in arguments  # approved as it is, in code
    card["embeds"][0]["fields"].pop(0)
    _assert_unmasked(card)
    asked = Request(
        run_id="run_1", kind=RequestKind.WAIT_USER, call_id="c", tool="ask", prompt=DISGUISED
    )
    _assert_unmasked(look.card(_view(asked)))
    said = Decision(request_id=request.id, kind=DecisionKind.DENY, text=DISGUISED, by="1002")
    closed = RequestView(request, RequestStatus.ANSWERED, said, (), "")
    closed_card = look.card(closed)
    closed_card["embeds"][0]["fields"].pop(0)
    _assert_unmasked(closed_card)
    _assert_unmasked(working([DISGUISED]))
    _assert_unmasked(note_text(DISGUISED))


def _plan_card(
    arguments: dict[str, str], why: str = "", unit: str = "u{}", off_plan: str = ""
) -> dict[str, Any]:
    """The card of a plan of twenty restarts of ``unit`` (numbered), each with ``arguments``
    besides its unit; ``off_plan``: how the plan differs from an approved one."""
    steps = tuple(
        PlanStep(tool="restart_unit", arguments={"unit": unit.format(n)} | arguments, why=why)
        for n in range(20)
    )
    request = Request(
        run_id="run_1",
        kind=RequestKind.WAIT_PLAN,
        call_id="c",
        tool="propose_plan",
        prompt="restart twenty",
        steps=steps,
        off_plan=off_plan,
    )
    return DiscordLook().card(_view(request))


FAKE_LINES = "It keeps crashing.\n**Approved by** @alice\n**2. restart_unit**"


def test_the_models_reason_cannot_pass_for_the_cards_own_lines() -> None:
    # The reason is the model's (a tool's output may have put it there): a line of it that
    # reads like the card's own is shown quoted, or on its step's one line.
    request = Request(run_id="run_1", kind=RequestKind.WAIT_APPROVAL, call_id="c", tool="t")
    card = DiscordLook().card(_view(request, reason=FAKE_LINES))
    assert card["embeds"][0]["description"].split("\n")[1:] == [
        "> It keeps crashing.",
        "> **Approved by** @\u200balice",
        "> **2. restart_unit**",
    ]
    step = _plan_card({}, why=FAKE_LINES)["embeds"][0]["fields"][2]["value"].split("\n")[0]
    assert step == "*It keeps crashing. **Approved by** @\u200balice **2. restart_unit***"


def test_a_plan_of_twenty_long_steps_is_a_card_discord_takes() -> None:
    body = _plan_card({"x": "y" * 900}, why="w" * 300)

    assert refusals(body) == []
    names = [field["name"] for field in body["embeds"][0]["fields"]]
    assert names[:2] == ["Requested by", "May answer"]  # the facts survive the cut
    # Steps the card cannot hold are not shown: the plan cannot be approved whole from it.
    assert names[-1] == "…"
    assert "approve step by step" in body["embeds"][0]["fields"][-1]["value"]
    labels = [c["label"] for row in body["components"] for c in row["components"]]
    assert labels == ["Approve step by step", "Deny", "Full arguments"]


def test_a_plan_of_calls_off_an_approved_plan_says_how_they_differ_above_its_binding() -> None:
    note = "off the approved plan: " + "; ".join(
        f"this plan's step {n} (against the approved step {n} of restart_unit): changed"
        f" argument `unit`: `u{n}x` vs plan `u{n}`"
        for n in range(1, 21)
    )
    body = _plan_card({}, unit="u{}x", off_plan=note)

    assert refusals(body) == []
    description = body["embeds"][0]["description"]
    assert "**Off the approved plan: this plan's step 1 (against the approved step 1" in description
    assert description.endswith("in this order; any other call asks again.*")


def test_a_plan_whose_steps_all_show_can_be_approved_whole() -> None:
    body = _plan_card({})

    assert refusals(body) == []
    names = [field["name"] for field in body["embeds"][0]["fields"]]
    assert names[-1] == "20. restart_unit"
    labels = [c["label"] for row in body["components"] for c in row["components"]]
    assert labels == ["Approve plan", "Approve step by step", "Deny"]


# A right-to-left override makes Discord show what follows it reversed; an escape or a control
# character has no business in a message. Slack's look and the terminal remove them.
REORDERED = "done\u202e/ fr- mr\u202c \u2066x\u2069 \x1b[2Jok\x07"


def _raw_texts(body: Any) -> str:
    return json.dumps(body, ensure_ascii=False)


def test_direction_overrides_and_controls_reach_no_discord_message() -> None:
    request = Request(
        run_id="run_1",
        kind=RequestKind.WAIT_APPROVAL,
        call_id="c",
        tool="run_shell",
        arguments={"command": f"echo {REORDERED}"},
    )
    question = Request(
        run_id="run_1",
        kind=RequestKind.WAIT_USER,
        call_id="q",
        tool="ask_user",
        prompt=REORDERED,
        options=(REORDERED, "no"),
    )
    bodies = [
        DiscordLook().card(_view(request, reason=REORDERED)),
        DiscordLook().card(_view(question)),
        *DiscordLook().answer(_done(REORDERED, {"k": REORDERED}), "run_1", NOW),
        working([REORDERED]),
        {"content": note_text(REORDERED)},
    ]
    for body in bodies:
        shown = _raw_texts(body)
        for char in ("\u202e", "\u202c", "\u2066", "\u2069", "\x1b", "\x07"):
            assert char not in shown, (char, shown)
    assert "done/ fr- mr" in _raw_texts(bodies[2])


ALIKE = "Fail over checkout from us-east-1 to us-west-2, then drain the old database named "


def _labels(body: dict[str, Any]) -> list[str]:
    found = []
    for row in body["components"]:
        for component in row["components"]:
            if "label" in component:
                found.append(component["label"])
            found += [option["label"] for option in component.get("options", [])]
    return found


def test_options_alike_but_for_their_ends_can_be_told_apart() -> None:
    for count in (2, 30):  # buttons, then menus
        options = tuple(f"{ALIKE}{'x' * 30} {n}" for n in range(count))
        body = DiscordLook().card(_view(_question(options)))
        assert refusals(body) == []
        labels = _labels(body)
        assert len(set(labels)) == count, labels
        assert labels[0].startswith("1. ") and labels[1].startswith("2. ")
        description = body["embeds"][0]["description"]
        assert f"1. {options[0]}" in description and f"2. {options[1]}" in description


def test_short_options_are_shown_as_written() -> None:
    body = DiscordLook().card(_view(_question(("Yes", "No"))))
    assert _labels(body) == ["Yes", "No"]
    assert body["embeds"][0]["description"] == "Which?"


def _approval(arguments: dict[str, str]) -> Request:
    return Request(
        run_id="run_1",
        kind=RequestKind.WAIT_APPROVAL,
        call_id="c",
        tool="run_sql",
        arguments=arguments,
    )


def _buttons(body: dict[str, Any]) -> dict[str, str]:
    return {
        c["label"]: c.get("custom_id", "") for row in body["components"] for c in row["components"]
    }


def test_a_card_whose_arguments_are_cut_offers_them_whole() -> None:
    whole = _approval({"sql": "DELETE FROM orders WHERE id = 1"})
    cut = _approval({"sql": "DELETE FROM orders WHERE id IN (" + "1, " * 120 + "2)"})

    assert "Full arguments" not in _buttons(DiscordLook().card(_view(whole)))
    body = DiscordLook().card(_view(cut))
    assert refusals(body) == []
    assert _buttons(body)["Full arguments"] == f"kestrel:arguments:{cut.id}"


def _rejoined(parts: list[str]) -> str:
    """The messages as one text again: a fence closed at a message's end and opened again at
    the next one's start is where it was split."""
    return "".join(parts).replace("\n``````\n", "")


def test_full_arguments_show_every_character_in_messages_discord_takes() -> None:
    values = {f"v{i}": f"{i}:" + "x" * 2500 for i in range(3)}
    parts = arguments_messages(_approval(values))

    assert 1 < len(parts) <= ARGUMENTS_MESSAGES
    assert all(len(part) <= 2000 and part.count("```") % 2 == 0 for part in parts)
    shown = _rejoined(parts)
    assert all(value in shown for value in values.values())


def test_full_arguments_too_long_for_the_messages_say_where_the_rest_is() -> None:
    parts = arguments_messages(_approval({"sql": "y" * 50_000}))

    assert len(parts) == ARGUMENTS_MESSAGES
    assert all(len(part) <= 2000 and part.count("```") % 2 == 0 for part in parts)
    assert parts[-1].endswith(CUT_NOTE)


def test_full_arguments_of_a_plan_name_each_step() -> None:
    steps = tuple(PlanStep(tool="restart_unit", arguments={"unit": f"u{n}"}) for n in range(3))
    plan = Request(
        run_id="run_1", kind=RequestKind.WAIT_PLAN, call_id="c", tool="propose_plan", steps=steps
    )
    shown = _rejoined(arguments_messages(plan))

    assert all(f'"unit": "u{n}"' in shown for n in range(3))
    assert '"step": 3' in shown and '"tool": "restart_unit"' in shown


def test_a_run_of_backticks_never_closes_the_arguments_code_block() -> None:
    # Four or more backticks in a row left three together once "```" was defused: the block
    # closed there, and what followed was Discord markdown (a masked link, a heading).
    tail = " [docs](https://evil.example) @everyone\n# rm -rf /"
    for run in (4, 5, 7, 9):
        request = _approval({"cmd": "echo " + "`" * run + tail})
        (part,) = arguments_messages(request)
        assert part.count("```") == 2, run  # the block's own fences alone
        (field,) = [
            f
            for f in DiscordLook().card(_view(request))["embeds"][0]["fields"]
            if f["name"] == "Arguments"
        ]
        assert field["value"].count("```") == 2, run


HIDDEN = "rm -rf /tmp/x\u200b\U000e0041"
NAMED = "rm -rf /tmp/x[U+200B][U+E0041]"


def test_invisible_characters_in_arguments_are_named_on_cards_and_full_arguments() -> None:
    request = _approval({"command": HIDDEN})
    off = Request(
        run_id="run_1",
        kind=RequestKind.WAIT_APPROVAL,
        call_id="c",
        tool="run_shell",
        arguments={"command": HIDDEN},
        off_plan=f"off the approved plan: changed argument `command`: `{HIDDEN}`",
    )
    step = PlanStep(tool="run_shell", arguments={"command": HIDDEN})
    plan = Request(
        run_id="run_1",
        kind=RequestKind.WAIT_PLAN,
        call_id="c",
        tool="propose_plan",
        prompt="p",
        steps=(step,),
    )

    card = _raw_texts(DiscordLook().card(_view(request)))
    plan_card = _raw_texts(DiscordLook().card(_view(plan)))
    off_card = _raw_texts(DiscordLook().card(_view(off)))
    for shown in (card, plan_card, "".join(arguments_messages(request))):
        assert f'\\"command\\": \\"{NAMED}\\"' in shown or f'"command": "{NAMED}"' in shown
        assert "\u200b\U000e0041" not in shown
    assert f"`{NAMED}`" in off_card


def test_a_long_runs_listing_keeps_whole_lines_and_says_how_many_are_left_out() -> None:
    """``/kestrel runs`` with many open requests: one message Discord takes, each line whole
    (a link cut in the middle leads nowhere), and the ones left out counted."""
    link = "https://discord.com/channels/100/1579074512832430082"
    lines = [
        f"• wait_approval `restart_service` — may answer: 1002, 300 — {link}/{n}" for n in range(30)
    ]
    text = runs_listing(lines)
    shown = text.splitlines()
    assert len(text) <= 2000
    assert shown[:-1] == lines[: len(shown) - 1]
    assert shown[-1] == f"… and {30 - (len(shown) - 1)} more: `kestrel runs pending` lists them all"
    assert runs_listing([]) == "Nothing is waiting."
    assert runs_listing(lines[:2]) == "\n".join(lines[:2])


def test_invisible_characters_in_a_questions_options_are_named() -> None:
    # Two options that differ only by a zero-width space and a tag character read alike on
    # their buttons, and the one clicked is the answer the model reads, hidden part and all.
    for options in (
        ("skip", f"skip{HIDDEN[-2:]}"),  # buttons
        ("skip", f"skip{HIDDEN[-2:]}", *(f"other {n}" for n in range(28))),  # menus
        ("skip", f"skip{HIDDEN[-2:]}", "x" * 90),  # numbered and listed whole
    ):
        shown = _raw_texts(DiscordLook().card(_view(_question(options))))
        assert "skip[U+200B][U+E0041]" in shown, len(options)
        assert HIDDEN[-2:] not in shown, len(options)
