"""Who may cancel a run and settle an uncertain effect, from the command line and the policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from bot.domain import DecisionKind, Request, RequestKind, Session, new_id
from bot.people.policy import Actor, Policy, PolicyRules
from bot.people.refusal import Refusal
from bot.records import RunRecord
from storage.sqlite import open_sqlite
from tests.bot.cli.test_cli import kestrel, one_line_error, two_approvals_catalog, write_config


def deferred_run(folder: Path, user: str) -> str:
    result = kestrel(folder, "run", "checkout is failing", "--defer", "--json", "--as", user)
    return str(json.loads(result.stdout)["run_id"])


def status_of(folder: Path, run_id: str) -> str:
    return str(json.loads(kestrel(folder, "runs", "show", run_id, "--json").stdout)["status"])


def test_only_the_requester_or_oncall_may_cancel(tmp_path: Path) -> None:
    write_config(tmp_path, policy={"oncall": ["U0ONCALL"]})
    first, second = deferred_run(tmp_path, "U0REQ"), deferred_run(tmp_path, "U0REQ")
    refused = one_line_error(kestrel(tmp_path, "runs", "cancel", first, "--as", "U0MALLORY"))
    assert refused == (
        f"kestrel: U0MALLORY may not cancel run {first}:"
        " only its requester (U0REQ) or on-call (U0ONCALL) may"
    )
    assert status_of(tmp_path, first) == "suspended"
    by_oncall = kestrel(tmp_path, "runs", "cancel", first, "--as", "U0ONCALL")
    assert by_oncall.returncode == 0 and by_oncall.stdout.strip() == "cancelled"
    by_requester = kestrel(tmp_path, "runs", "cancel", second, "--as", "U0REQ")
    assert by_requester.returncode == 0 and by_requester.stdout.strip() == "cancelled"
    assert status_of(tmp_path, first) == status_of(tmp_path, second) == "cancelled"
    audit = kestrel(tmp_path, "audit").stdout.splitlines()
    assert any("U0MALLORY" in line and "cancel_refused" in line for line in audit)
    assert any("U0ONCALL" in line and " cancel " in line and first in line for line in audit)
    assert any("U0REQ" in line and " cancel " in line and second in line for line in audit)


def test_discord_ids_written_as_numbers_name_their_people(tmp_path: Path) -> None:
    # Discord's ids pasted unquoted, as YAML reads them: numbers. They name whom they spell.
    oncall, approver = 345678901234567890, 123456789012345678
    write_config(tmp_path, policy={"oncall": [oncall], "approvers": {"*": [approver]}})
    run_id = deferred_run(tmp_path, "U0REQ")
    cancelled = kestrel(tmp_path, "runs", "cancel", run_id, "--as", str(oncall))
    assert cancelled.returncode == 0, cancelled.stderr
    assert status_of(tmp_path, run_id) == "cancelled"


def test_without_oncall_the_refusal_says_so(tmp_path: Path) -> None:
    run_id = deferred_run(tmp_path, "U0REQ")
    refused = one_line_error(kestrel(tmp_path, "runs", "cancel", run_id, "--as", "cli"))
    assert "only its requester (U0REQ) may (policy.oncall is empty)" in refused


async def seed_uncertain_effect(db: Path, requester: str) -> Request:
    store = await open_sqlite(db)
    try:
        session = Session(id=new_id("ses"))
        run = RunRecord(id=new_id("run"), session_id=session.id, requested_by=requester)
        await store.create_run(run, "gone", 30, session=session)
        request = Request(
            run_id=run.id,
            kind=RequestKind.WAIT_EFFECT,
            call_id="call_1",
            tool="restart_service",
            requested_by=requester,
        )
        await store.open_request(request)
        return request
    finally:
        await store.close()


async def test_pending_effects_without_oncall_name_the_requester(tmp_path: Path) -> None:
    request = await seed_uncertain_effect(tmp_path / "kestrel.db", "U0REQ")
    line = kestrel(tmp_path, "runs", "pending").stdout
    assert request.id in line
    assert "may answer: U0REQ; the requester settles it: policy.oncall is empty" in line
    (row,) = json.loads(kestrel(tmp_path, "runs", "pending", "--json").stdout)
    assert row["may_answer"] == ["U0REQ"] and "policy.oncall is empty" in row["note"]
    write_config(tmp_path, tools=[])  # the offline demo says nothing of on-call
    banner = kestrel(tmp_path, "chat").stdout
    assert "note: policy.oncall is empty" in banner and "wait_effect" in banner
    # With -v the log says it as the runtime is built: the banner does not say it again.
    verbose = kestrel(tmp_path, "-v", "chat")
    assert (verbose.stdout + verbose.stderr).count("policy.oncall is empty") == 1


def effect(requested_by: str = "U0REQ") -> Request:
    return Request(
        run_id="run_1",
        kind=RequestKind.WAIT_EFFECT,
        call_id="c",
        tool="restart_service",
        requested_by=requested_by,
    )


@pytest.mark.parametrize("kind", [DecisionKind.RETRY, DecisionKind.DONE, DecisionKind.FAILED])
async def test_without_oncall_the_requester_settles_an_effect(kind: DecisionKind) -> None:
    policy = Policy(PolicyRules())
    assert await policy.check_decision(Actor("U0REQ"), kind, effect(), None) is None
    refusal = str(await policy.check_decision(Actor("U0OTHER"), kind, effect(), None))
    assert "requester" in refusal and "policy.oncall is empty" in refusal
    assert policy.who_may_answer(effect(), None) == ["U0REQ"]
    assert await policy.check_decision(Actor(""), kind, effect(requested_by=""), None)


async def test_with_oncall_only_oncall_settles_an_effect() -> None:
    policy = Policy(PolicyRules(oncall=["group:S0SRE"]))
    oncall = Actor("U0SRE", groups=frozenset({"S0SRE"}))
    assert await policy.check_decision(oncall, DecisionKind.DONE, effect(), None) is None
    refused = await policy.check_decision(Actor("U0REQ"), DecisionKind.DONE, effect(), None)
    assert "on-call" in str(refused)
    assert policy.who_may_answer(effect(), None) == ["group:S0SRE"]
    assert policy.notices() == [] and policy.answer_note(effect()) == ""


def test_an_empty_oncall_is_announced() -> None:
    (notice,) = Policy(PolicyRules()).notices()
    assert "policy.oncall is empty" in notice and "24 h" in notice


async def test_cancel_rules() -> None:
    policy = Policy(PolicyRules(oncall=["group:S0SRE"]))
    assert await policy.check_operate(Actor("U0REQ"), "cancel", "run_1", "U0REQ") is None
    assert (
        await policy.check_operate(
            Actor("U0X", groups=frozenset({"S0SRE"})), "cancel", "run_1", "U0REQ"
        )
        is None
    )
    refused = await policy.check_operate(Actor("U0X"), "cancel", "run_1", "U0REQ")
    assert "U0X may not cancel run run_1" in str(refused)
    # No requester: nobody by default.
    assert await policy.check_operate(Actor(""), "cancel", "run_1", "") is not None


def asked(kind: RequestKind, requested_by: str = "U0REQ", approvals: int = 1) -> Request:
    return Request(
        run_id="run_1",
        kind=kind,
        call_id="c",
        tool="deploy",
        requested_by=requested_by,
        approvals_needed=approvals,
    )


async def test_refusals_name_who_may_act() -> None:
    rules = PolicyRules(
        approvers={"*": ["*"]}, answerers=["U0ANS", "group:S0SRE"], oncall=["U0ON", "role:R1"]
    )
    policy = Policy(rules)
    question, effect_ = asked(RequestKind.WAIT_USER), asked(RequestKind.WAIT_EFFECT)
    refused = await policy.check_decision(Actor("U0X"), DecisionKind.ANSWER, question, None)
    assert refused == Refusal(
        "U0X may not answer this question:"
        " only U0REQ, U0ANS, group:S0SRE or on-call (U0ON, role:R1) may"
    )
    refused = await policy.check_decision(Actor("U0REQ"), DecisionKind.DONE, effect_, None)
    assert refused == Refusal("only on-call (U0ON, role:R1) may settle an uncertain effect")
    # A guest from another workspace is never let in by ``*``: the refusal says who is.
    guest = Actor("U0GUEST", external=True)
    approval = asked(RequestKind.WAIT_APPROVAL)
    refused = await policy.check_decision(guest, DecisionKind.APPROVE, approval, None)
    assert refused == Refusal("U0GUEST may not approve deploy: only people of this workspace may")


@pytest.mark.parametrize(
    ("rules", "request_", "phrase"),
    [
        (PolicyRules(), asked(RequestKind.WAIT_APPROVAL), "anyone but the requester (U0REQ)"),
        (PolicyRules(self_approval=True), asked(RequestKind.WAIT_APPROVAL), "anyone"),
        (
            PolicyRules(self_approval=True),
            asked(RequestKind.WAIT_APPROVAL, approvals=2),
            "anyone but the requester (U0REQ)",
        ),
        (PolicyRules(), asked(RequestKind.WAIT_APPROVAL, requested_by=""), "anyone"),
        (
            PolicyRules(approvers={"deploy": ["U0REQ", "U0LEAD"]}),
            asked(RequestKind.WAIT_APPROVAL),
            "U0LEAD",
        ),
        (
            PolicyRules(approvers={"deploy": ["U0REQ"]}),
            asked(RequestKind.WAIT_APPROVAL),
            "nobody (the requester, U0REQ, may not approve their own run)",
        ),
        (
            PolicyRules(answerers=["*"]),
            asked(RequestKind.WAIT_USER),
            "anyone",
        ),
        # Nobody named at all (a request asked before approvers: {}): not the requester's rule.
        (PolicyRules(approvers={}), asked(RequestKind.WAIT_APPROVAL), "nobody"),
    ],
)
def test_who_may_answer_in_words(rules: PolicyRules, request_: Request, phrase: str) -> None:
    assert Policy(rules).may_answer_phrase(request_, None) == phrase


def test_an_mcp_servers_tools_are_its_own_to_name() -> None:
    from bot.cli.compose import check_tool_names
    from bot.config.settings import ConfigError, DeadlineSettings, McpServerSettings, Settings
    from bot.tools.propose_plan import human_tools
    from bot.tools.toolset import ToolSet

    server = McpServerSettings(name="gh", transport="stdio", command=["gh-mcp"])
    policy = PolicyRules(approvers={"gh__create_issue": ["U0BOSS"]})
    tools = ToolSet(human_tools())
    check_tool_names(Settings(mcp_servers=[server], policy=policy), tools)  # listed by gh
    for name in ("ops_", "my__ops"):  # names the settings allow: their tools are NAME__TOOL
        odd = McpServerSettings(name=name, transport="stdio", command=["x"])
        named = PolicyRules(approvers={f"{name}__restart": ["U0BOSS"]})
        check_tool_names(Settings(mcp_servers=[odd], policy=named), tools)
    headless = Settings(
        human_in_the_loop=False, deadlines=DeadlineSettings(per_tool={"ask_human_confirm": 60})
    )
    check_tool_names(headless, ToolSet())  # a replica sharing the file asks people
    with pytest.raises(ConfigError, match="'gh__create_issue' names no tool or tag"):
        check_tool_names(Settings(policy=policy), tools)  # no server gh to list it
    # Every tool of a server carries tags mcp and mcp:SERVER (tools list shows them).
    for tag in ("tag:mcp", "tag:mcp:gh"):
        by_tag = PolicyRules(approvers={tag: ["U0BOSS"]})
        check_tool_names(Settings(mcp_servers=[server], policy=by_tag), tools)
        with pytest.raises(ConfigError, match=f"'{tag}' names no tool or tag"):
            check_tool_names(Settings(policy=by_tag), tools)


def test_a_gated_tool_needing_more_approvers_than_the_policy_names_is_refused(
    tmp_path: Path,
) -> None:
    # approvals: 2 counts two different people: one person named to approve it could never
    # be enough, and its every card waited until its deadline.
    from bot.cli.compose import check_approvable
    from bot.config.settings import ConfigError, Settings
    from bot.tools.catalog import load_catalog
    from bot.tools.toolset import ToolSet

    catalog = tmp_path / "ops.yaml"
    catalog.write_text(
        "tools:\n  - name: deploy\n    description: x\n    command: [echo]\n"
        "    confirm: true\n    approvals: 2\n    tags: [prod]\n"
    )
    tools = ToolSet(load_catalog(catalog))
    for approvers in ({"deploy": ["U0BOSS"]}, {"deploy": ["U0BOSS"], "tag:prod": ["U0BOSS"]}):
        with pytest.raises(ConfigError) as refused:
            check_approvable(Settings(policy=PolicyRules(approvers=approvers)), tools)
        assert str(refused.value).startswith(
            "policy.approvers: deploy needs 2 approvers (approvals: 2), and only U0BOSS may"
            ' approve it: name more under deploy, tag:prod or "*", or a group'
        ), str(refused.value)
    enough: list[dict[str, list[str]]] = [
        {"deploy": ["U0BOSS"], "tag:prod": ["U0SRE"]},
        {"deploy": ["group:S0SRE"]},
        {"deploy": ["U0BOSS"], "*": ["*"]},
        {"tag:prod": ["channel:C0OPS"]},
    ]
    for approvers in enough:
        check_approvable(Settings(policy=PolicyRules(approvers=approvers)), tools)


def test_an_mcp_tool_its_server_gates_that_nobody_may_approve_is_refused() -> None:
    # The server's confirm: list gates a tool before it is listed: with nobody to approve it
    # (the chart's approvers: {}), each of its cards waited until its deadline.
    from bot.cli.compose import check_approvable
    from bot.config.settings import ConfigError, McpServerSettings, Settings
    from bot.tools.propose_plan import human_tools
    from bot.tools.toolset import ToolSet

    gh = McpServerSettings(name="gh", transport="stdio", command=["gh-mcp"], confirm=["merge"])
    tools = ToolSet(human_tools())
    with pytest.raises(ConfigError) as refused:
        check_approvable(Settings(mcp_servers=[gh], policy=PolicyRules(approvers={})), tools)
    assert str(refused.value).startswith(
        "policy.approvers: nobody may approve gh__merge, which asks for approval (confirm:"
        ' true): name who may under gh__merge, tag:mcp, tag:mcp:gh or "*"'
    ), str(refused.value)
    for key in ("gh__merge", "tag:mcp:gh", "*"):
        named = PolicyRules(approvers={key: ["U0BOSS"]})
        check_approvable(Settings(mcp_servers=[gh], policy=named), tools)
    odd = McpServerSettings(name="gh", transport="stdio", command=["x"], confirm=["a.b"])
    # Offered under a name of its own (a.b is no tool name): not guessed here.
    check_approvable(Settings(mcp_servers=[odd], policy=PolicyRules(approvers={})), tools)


class _Repo(BaseModel):
    """The arguments of a server's repository tool."""

    name: str


def test_an_mcp_tool_its_annotations_gate_is_the_servers_own_to_list() -> None:
    # chat and serve check the tools they run, MCP ones included: a destructive tool a server
    # lists (gated by its annotation, not by confirm:) refused a replica that started before.
    from bot.cli.compose import check_approvable
    from bot.config.settings import McpServerSettings, Settings
    from bot.tools.python import function_tool
    from bot.tools.toolset import ToolSet

    @function_tool(name="gh__delete_repo", confirm=True, idempotent=False)
    async def delete_repo(args: _Repo) -> str:
        """As a server's destructive tool is offered."""
        return f"deleted {args.name}"

    gh = McpServerSettings(name="gh", transport="stdio", command=["gh-mcp"])
    check_approvable(
        Settings(mcp_servers=[gh], policy=PolicyRules(approvers={})), ToolSet([delete_repo])
    )


def own_run_refusal(folder: Path) -> tuple[str, str, str]:
    """The run U0REQ deferred, its request, and what U0REQ is told approving it."""
    started = kestrel(folder, "run", "checkout is failing", "--defer", "--json", "--as", "U0REQ")
    obj = json.loads(started.stdout)
    run_id, request_id = obj["run_id"], obj["requests"][0]["id"]
    mine = kestrel(folder, "runs", "approve", run_id, request_id, "--as", "U0REQ")
    return run_id, request_id, one_line_error(mine)


def restarts(folder: Path) -> str:
    log = folder / "demo-state" / "restarts.log"
    return log.read_text() if log.exists() else ""


def test_the_requester_refused_at_the_terminal_is_told_what_works_and_it_does(
    tmp_path: Path,
) -> None:
    # The README's demo from another shell: the requester's own approval was refused, with no
    # word on what to do. Each way the refusal names approves the call (once).
    run_id, _, refused = own_run_refusal(tmp_path)
    assert f"--as NAME), or resume the run in kestrel chat (/resume {run_id})" in refused
    assert restarts(tmp_path) == ""
    chat = kestrel(tmp_path, "chat", "--as", "U0REQ", stdin=f"/resume {run_id}\na\n")
    assert chat.returncode == 0, chat.stderr
    assert restarts(tmp_path) == "restart checkout\n"
    other_id, other_request, _ = own_run_refusal(tmp_path)
    approved = kestrel(tmp_path, "runs", "approve", other_id, other_request, "--as", "U0ALICE")
    assert approved.returncode == 0, approved.stderr
    assert restarts(tmp_path) == "restart checkout\nrestart checkout\n"


def test_the_refusal_offers_no_way_the_policy_refuses(tmp_path: Path) -> None:
    # Two approvals needed: kestrel chat cannot approve it (one person at a time, here).
    write_config(tmp_path, tools=[str(two_approvals_catalog(tmp_path))])
    _, _, refused = own_run_refusal(tmp_path)
    assert refused.endswith("--as NAME)") and "kestrel chat" not in refused
    # The requester the only approver: nobody else to approve as, the chat alone can.
    write_config(tmp_path, policy={"approvers": {"*": ["U0REQ"]}})
    _, _, refused = own_run_refusal(tmp_path)
    assert "may approve: nobody (the requester, U0REQ, may not approve their own run)" in refused
    assert "--as NAME" not in refused and "resume the run in kestrel chat" in refused
    # Approvers named only by group: the terminal knows nobody's groups.
    write_config(tmp_path, policy={"approvers": {"*": ["group:S0SRE"]}})
    _, _, refused = own_run_refusal(tmp_path)
    assert "--as NAME" not in refused


def test_any_other_refusal_adds_nothing(tmp_path: Path) -> None:
    write_config(tmp_path, policy={"approvers": {"*": ["U0BOSS"]}})
    run_id, request_id, _ = own_run_refusal(tmp_path)
    other = kestrel(tmp_path, "runs", "approve", run_id, request_id, "--as", "U0MALLORY")
    assert one_line_error(other) == (
        "kestrel: U0MALLORY may not approve restart_service: only U0BOSS may"
    )


@pytest.mark.parametrize("command", [("runs", "list"), ("runs", "pending"), ("run", "hello")])
def test_a_principal_that_names_nobody_stops_a_command_in_one_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    # The fast way of `runs list` and `runs pending` reads the policy too: it says the same.
    write_config(tmp_path, policy={"oncall": ["U0ONCALL", "Group:S0ONCALL"]})
    said = one_line_error(kestrel(tmp_path, *command))
    assert said.endswith("policy.oncall: 'Group:S0ONCALL': did you mean group:S0ONCALL?")
