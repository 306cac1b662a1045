"""What each principal form grants, on each platform, for a run that lives in a place."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bot.config.settings import ConfigError, load_settings
from bot.domain import DecisionKind, Request, RequestKind
from bot.people.policy import Actor, Policy, PolicyRules
from bot.place import Place

PLATFORMS = {
    "slack": ("T0001", "C0OPS", "C0PRIV", "S0SRE", "U0ALICE"),
    "discord": ("100", "200", "201", "300", "1001"),
}


@dataclass
class Directory:
    """A platform's answers, and which questions were asked."""

    groups: dict[str, set[str]] = field(default_factory=dict)
    channels: dict[str, set[str]] = field(default_factory=dict)
    # Threads that show to fewer people than their channel (Discord's private threads).
    threads: dict[str, set[str]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    async def in_group(self, user: str, group: str) -> bool:
        self.asked.append(group)
        return user in self.groups.get(group, set())

    async def sees(self, user: str, place: Place) -> bool:
        in_thread = place.thread not in self.threads or user in self.threads[place.thread]
        return user in self.channels.get(place.channel, set()) and in_thread

    def untold(self) -> str:
        return ""


def _approval(requested_by: str = "U0REQ") -> Request:
    return Request(
        run_id="run_1", kind=RequestKind.WAIT_APPROVAL, call_id="c", tool="restart",
        requested_by=requested_by,
    )  # fmt: skip


def _forms(platform: str) -> dict[str, str]:
    _team, ops, _priv, group, user = PLATFORMS[platform]
    return {
        "user": user,
        "group": f"group:{group}",
        "role": f"role:{group}",
        "channel": f"channel:{ops}",
        "*": "*",
    }


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
@pytest.mark.parametrize("form", ["user", "group", "role", "channel", "*"])
async def test_each_form_approves_runs_of_its_place_only(platform: str, form: str) -> None:
    team, ops, priv, group, user = PLATFORMS[platform]
    policy = Policy(PolicyRules(approvers={"*": [_forms(platform)[form]]}))
    directory = Directory(groups={group: {user}})
    run_in_ops = Place(platform, team, ops, "t1")
    run_in_priv = Place(platform, team, priv, "t2")

    def acting(where: Place, *, external: bool = False) -> Actor:
        return Actor(user, place=where, external=external, directory=directory)

    async def refusal(actor: Actor, run: Place) -> str:
        refused = await policy.check_decision(
            actor, DecisionKind.APPROVE, _approval(), None, run=run
        )
        return refused.reason if refused else ""

    # Named by the form, acting from the run's own thread: approved.
    assert await refusal(acting(run_in_ops), run_in_ops) == ""
    # The same person on a run of another channel, acting from there: only a form that names
    # the person (not the channel the clicker happens to be in) lets them.
    on_priv = await refusal(acting(run_in_priv), run_in_priv)
    assert (on_priv == "") is (form != "channel")
    # Acting on the #ops run from anywhere else: refused, whoever they are.
    assert "another channel" in await refusal(acting(run_in_priv), run_in_ops)
    other_platform = Place("console" if platform == "slack" else "slack", team, ops, "t1")
    elsewhere = "on Slack" if platform == "slack" else "on Discord"
    assert elsewhere in await refusal(acting(other_platform), run_in_ops)
    # A guest from another workspace is named by their own user id only.
    guest = await refusal(acting(run_in_ops, external=True), run_in_ops)
    assert (guest == "") is (form == "user")


async def test_groups_are_looked_up_only_when_a_check_names_them_and_nothing_cheaper_matched() -> (
    None
):
    directory = Directory(groups={"S0SRE": {"U0ALICE"}, "S0OTHER": set()})
    policy = Policy(PolicyRules(requesters=["*", "group:S0OTHER"], oncall=["group:S0SRE"]))
    place = Place("slack", "T0001", "C0OPS", "1.1")
    alice = Actor("U0ALICE", place=place, directory=directory)
    assert await policy.may_start(alice, place)
    assert directory.asked == []  # "*" matched: no group API was asked
    assert await policy.may_operate(alice, place)
    assert directory.asked == ["S0SRE"]  # only the group the check names
    bob = Actor("U0BOB", place=place, directory=directory)
    assert not await policy.may_operate(bob, place)


async def test_reads_show_a_run_to_its_channel_and_to_oncall_only() -> None:
    directory = Directory(channels={"C0PRIV": {"U0MEMBER"}})
    policy = Policy(PolicyRules(oncall=["U0ONCALL"]))
    run = Place("slack", "T0001", "C0PRIV", "1.1")
    elsewhere = Place("slack", "T0001", "C0OPS", "")

    def reader(user: str, where: Place = elsewhere, external: bool = False) -> Actor:
        return Actor(user, place=where, external=external, directory=directory)

    assert await policy.may_see(reader("U0MEMBER"), run)
    assert await policy.may_see(reader("U0ONCALL"), run)
    assert not await policy.may_see(reader("U0STRANGER"), run)
    assert not await policy.may_see(reader("U0MEMBER", Place("discord", "100", "200")), run)
    assert not await policy.may_see(reader("U0MEMBER", Place("slack", "T0OTHER", "C1")), run)
    assert await policy.may_see(Actor("anyone"), run)  # the terminal that runs Kestrel
    assert await policy.may_see(reader("U0STRANGER", Place("slack", "T0001", "C0PRIV", "1.1")), run)


def test_an_actor_is_who_acts_whatever_directory_answers_for_them() -> None:
    place = Place("slack", "T0001", "C0OPS", "t1")
    first = Actor("U0ALICE", frozenset({"S0SRE"}), place, directory=Directory())
    second = Actor("U0ALICE", frozenset({"S0SRE"}), place, directory=Directory(groups={"g": set()}))
    assert first == second and hash(first) == hash(second)
    assert first != Actor("U0ALICE", frozenset({"S0SRE"}), place, external=True)
    assert "directory" not in repr(first) and "Directory" not in repr(first)
    assert repr(Actor("U0BOB")) == (
        "Actor(user='U0BOB', groups=frozenset(), place=None, external=False)"
    )


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
async def test_oncall_by_channel_or_everyone_reads_no_run_from_elsewhere(platform: str) -> None:
    workspace, ops, private, _group, _user = PLATFORMS[platform]
    run = Place(platform, workspace, private, "1.1")
    other_server = Place(platform, "999", ops, "")
    policy = Policy(PolicyRules(oncall=[f"channel:{private}", "*"]))
    stranger = Actor("U0STRANGER", place=Place(platform, workspace, ops, ""), directory=Directory())
    # ``*`` names anyone of the run's workspace; ``channel:`` only those acting from its channel.
    assert await policy.may_see(stranger, run)
    assert not await policy.may_see(Actor("U0STRANGER", place=other_server), run)
    policy = Policy(PolicyRules(oncall=[f"channel:{private}", "U0ONCALL"]))
    assert not await policy.may_see(stranger, run)
    assert await policy.may_see(Actor("U0ONCALL", place=other_server), run)
    # From the run's channel, the platform says who sees its thread; channel on-call is
    # on-call there for those who do (a Discord private thread shows to fewer people).
    member = Directory(channels={private: {"U0STRANGER"}})
    outside = Directory(channels={private: {"U0STRANGER"}}, threads={"1.1": set()})
    here = Place(platform, workspace, private)
    seeing, unseeing = (Actor("U0STRANGER", place=here, directory=d) for d in (member, outside))
    assert await policy.may_see(seeing, run)
    assert not await policy.may_see(unseeing, run)
    assert await policy.check_operate(seeing, "cancel", "run_1", "U0REQ", run) is None
    assert await policy.check_operate(unseeing, "cancel", "run_1", "U0REQ", run) is not None


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
async def test_a_run_whose_place_is_unknown_is_refused_in_words_that_say_so(platform: str) -> None:
    # A run whose session's row the store lost has a place of no platform: the refusal said
    # "Request R is on : act on it from its run's thread there".
    workspace, ops, _private, _group, _user = PLATFORMS[platform]
    actor = Actor("U0ALICE", place=Place(platform, workspace, ops, "1.1"), directory=Directory())
    refusal = await Policy(PolicyRules()).place_refusal(actor, Place(""), "request req_1")
    assert refusal is not None
    assert refusal.reason == (
        "Request req_1 has no thread Kestrel knows of: on-call can act on it at the terminal"
    )


async def test_a_run_in_a_thread_is_read_from_its_channel_only_by_those_who_see_the_thread() -> (
    None
):
    directory = Directory(channels={"200": {"1004", "1999"}}, threads={"201": {"1004"}})
    policy = Policy(PolicyRules(oncall=["1003"]))
    run = Place("discord", "100", "200", "201")

    def reader(user: str, thread: str = "") -> Actor:
        return Actor(user, place=Place("discord", "100", "200", thread), directory=directory)

    # A slash command in the run's channel names no thread: the platform says who sees it.
    assert not await policy.may_see(reader("1999"), run)
    assert not await policy.may_see(reader("1999", "202"), run)
    assert await policy.may_see(reader("1004"), run)
    assert await policy.may_see(reader("1003"), run)
    assert await policy.may_see(reader("1999", "201"), run)  # from the thread itself


@pytest.mark.parametrize(
    ("principal", "said"),
    [
        ("Group:S0SRE", "did you mean group:S0SRE?"),
        ("chanel:C0OPS", "did you mean channel:C0OPS?"),
        ("channel:#ops", "channel:ID takes the platform's id"),
        ("channel:c0ops", "channel:ID takes the platform's id"),
        ("group:*", "group:ID takes the platform's id"),
        ("role:", "role:ID takes the platform's id"),
        ("<@U0ALICE>", "name a person by their platform id"),
        ("U0ALICE ", "a principal has no spaces around it"),
    ],
)
def test_a_principal_that_names_nobody_is_refused_when_the_policy_is_read(
    tmp_path: Path, principal: str, said: str
) -> None:
    # Each of these matches no one: the check it is in would refuse everyone, unsaid.
    path = tmp_path / "kestrel.yaml"
    path.write_text(json.dumps({"policy": {"approvers": {"*": ["U0APPROVER", principal]}}}))
    with pytest.raises(ConfigError) as refused:
        load_settings(str(path))
    assert f"policy.approvers: {principal!r}: {said}" in str(refused.value)


async def test_a_request_is_decided_from_its_runs_thread_the_run_also_from_its_channel() -> None:
    # A card is in its run's thread: a decision from the run's channel outside it (a Discord
    # click in the thread's parent) is from another place; a slash command, which names no
    # thread, acts on the run from its channel.
    directory = Directory(channels={"200": {"1001"}})
    policy = Policy(PolicyRules(approvers={"*": ["*"]}))
    run = Place("discord", "100", "200", "500")
    actor = Actor("1001", place=Place("discord", "100", "200"), directory=directory)
    refused = await policy.check_decision(actor, DecisionKind.APPROVE, _approval(), None, run=run)
    assert refused is not None and "in a thread of this channel" in refused.reason, refused
    assert await policy.place_refusal(actor, run, "run run_1") is None
    in_thread = Actor("1001", place=run, directory=directory)
    assert (
        await policy.check_decision(in_thread, DecisionKind.APPROVE, _approval(), None, run=run)
        is None
    )
