"""A team upgrades from the 0.2.0 release itself with runs in flight: ``db migrate`` takes its
store from schema version 6 to this release's, every journal and audit row as it was, and
every run it left waiting ends by the steps the CHANGELOG's "Upgrading" and docs/deploy.md
give. Those runs started with a tool set this release fingerprints otherwise (what each
catalog command runs is part of it now), so the first decision after the upgrade is recorded
and the run waits for ``kestrel runs resume RUN --force``, which accepts the new tool set
(later resumes compare with it) and asks an approval given before it again: no command runs
on an approval given before the upgrade, each runs once per approval given after it, and a
command killed midway is asked about, never run again.

The stores are ``fixtures/store_0_2_0_release/``, made by ``fixtures/store_0_2_0/make.py``
(its docstring says how) with the release's own ``kestrel`` (97baca8e^): the same runs as
``store_0_2_0``'s, by the same names (``test_upgrade_0_2_0.py`` says which is which), but
for ``plan``: 0.2.0 had no plans, so its two deploys wait on two approvals.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.bot.cli.test_cli import one_line_error
from tests.storage.test_schema import SCHEMA_0_2_0
from tests.storage.test_upgrade_0_2_0 import AS_LEFT, OWN, UPGRADES, Upgrade, migrated, pending

RELEASE = Path(__file__).parent / "fixtures" / "store_0_2_0_release"


@pytest.fixture(params=sorted(UPGRADES))
async def upgrade(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Upgrade]:
    async with UPGRADES[request.param](tmp_path, RELEASE, SCHEMA_0_2_0) as made:
        yield made


async def test_a_0_2_0_release_store_is_migrated_as_it_was(upgrade: Upgrade) -> None:
    await asyncio.to_thread(read_as_left, upgrade)


def read_as_left(upgrade: Upgrade) -> None:
    journal, audit = upgrade.rows("journal"), upgrade.rows("audit")
    migrated(upgrade)
    assert upgrade.statuses() == AS_LEFT
    waiting = sorted((name, r["kind"], r["tool"]) for name, r in named(upgrade))
    assert waiting == [
        ("approve", "wait_approval", "restart_service"),
        ("cancel", "wait_approval", "restart_service"),
        ("chat", "wait_approval", "restart_service"),
        ("effect", "wait_effect", "migrate_db"),
        ("plan", "wait_approval", "deploy"),
        ("plan", "wait_approval", "deploy"),
        ("question", "wait_user", "ask_human_confirm"),
    ]
    for run_id, _ in upgrade.runs.values():
        shown = upgrade.run("runs", "show", run_id)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert upgrade.rows("journal") == journal and upgrade.rows("audit") == audit


async def test_every_run_the_release_left_waiting_ends_by_the_documented_steps(
    upgrade: Upgrade,
) -> None:
    await asyncio.to_thread(forced_to_the_end, upgrade)


def forced_to_the_end(upgrade: Upgrade) -> None:
    assert upgrade.run("db", "migrate").returncode == 0
    journal, audit = upgrade.rows("journal"), upgrade.rows("audit")
    runs = upgrade.runs
    restarted(upgrade, runs["approve"][0])
    answered = recorded(upgrade, "runs", "answer", *runs["question"], "no", "--as", "bob")
    assert forced(upgrade, answered) == []  # its restart ran in 0.2.0, and not again
    done = upgrade.run("runs", "cancel", runs["cancel"][0], "--as", "bob")
    assert done.returncode == 0, done.stderr
    deployed(upgrade, runs["plan"][0])
    settled = recorded(upgrade, *OWN, "runs", "effect", *runs["effect"], "done", "--as", "bob")
    assert forced(upgrade, settled, *OWN) == []  # settled as done: nothing runs
    retried(upgrade, runs["in_flight"][0])
    chatted(upgrade, runs["chat"][0])

    assert pending(upgrade) == []
    assert upgrade.statuses() == {
        "approve": "completed",
        "question": "completed",
        "cancel": "cancelled",
        "plan": "completed",
        "effect": "completed",
        "in_flight": "completed",
        "chat": "completed",
        "finished": "completed",
        "cancelled": "cancelled",
    }
    # Once per approval given after a --force: the two restarts, the plan's deploys, and the
    # in-flight migration retried; an ended run forced again runs nothing.
    for name, (run_id, _) in runs.items():
        by = "carol" if name == "chat" else "bob"  # its requester
        again = upgrade.run("runs", "resume", run_id, "--force", "--as", by)
        assert f"run {run_id} already ended" in again.stderr, again.stderr
    assert ran(upgrade, "demo-state/restarts.log") == ["restart checkout"] * 2
    assert ran(upgrade, "executions.log") == ["deploy web", "deploy api", "migrate billing"]
    after = upgrade.rows("journal")
    assert set(journal) <= set(after) and set(audit) <= set(upgrade.rows("audit"))
    for name in runs:
        assert upgrade.kinds(name)[-1] == "run_ended", name
    flight = upgrade.kinds("in_flight")
    assert flight.count("tool_dispatched") == 2 and flight.count("tool_result") == 1


def restarted(upgrade: Upgrade, run_id: str) -> None:
    """The demo's run waiting on its restart: the approval given in 0.2.0's days is asked
    again after the --force, and the restart runs on the one given after it."""
    (asked,) = open_requests(upgrade, run_id)
    refused = one_line_error(upgrade.run("runs", "resume", run_id, "--as", "bob"))
    assert refused.endswith(f"resume with --force (kestrel runs resume {run_id} --force)")
    recorded(upgrade, "runs", "approve", run_id, asked["id"], "--as", "alice")
    (again,) = forced(upgrade, run_id)
    assert (again["kind"], again["tool"]) == ("wait_approval", "restart_service")
    assert again["id"] != asked["id"] and ran(upgrade, "demo-state/restarts.log") == []
    went_on(upgrade, "runs", "approve", run_id, again["id"], "--as", "alice")
    assert ran(upgrade, "demo-state/restarts.log") == ["restart checkout"]
    (question,) = open_requests(upgrade, run_id)
    went_on(upgrade, "runs", "answer", run_id, question["id"], "yes", "--as", "bob")
    assert open_requests(upgrade, run_id) == []


def deployed(upgrade: Upgrade, run_id: str) -> None:
    """The two deploys 0.2.0 asked about one by one: both asked again, both run once."""
    first, second = open_requests(upgrade, run_id)
    said = upgrade.run(*OWN, "runs", "approve", run_id, first["id"], "--as", "alice").stdout
    assert said.startswith("recorded\n") and second["id"] in said  # still waiting on the other
    recorded(upgrade, *OWN, "runs", "approve", run_id, second["id"], "--as", "alice")
    asked = forced(upgrade, run_id, *OWN)
    assert [r["arguments"] for r in asked] == [{"service": "web"}, {"service": "api"}]
    assert ran(upgrade, "executions.log") == []
    went_on(upgrade, *OWN, "runs", "approve", run_id, asked[0]["id"], "--as", "alice")
    went_on(upgrade, *OWN, "runs", "approve", run_id, asked[1]["id"], "--as", "alice")
    assert open_requests(upgrade, run_id) == []
    assert ran(upgrade, "executions.log") == ["deploy web", "deploy api"]


def retried(upgrade: Upgrade, run_id: str) -> None:
    """The migration whose process was killed: its outcome is asked of on-call, never assumed;
    retried, it asks its approval again and runs once."""
    before = ran(upgrade, "executions.log")
    refused = one_line_error(upgrade.run(*OWN, "runs", "resume", run_id, "--as", "bob"))
    assert refused.endswith(f"resume with --force (kestrel runs resume {run_id} --force)")
    (effect,) = forced(upgrade, run_id, *OWN)
    assert effect["kind"] == "wait_effect" and ran(upgrade, "executions.log") == before
    went_on(upgrade, *OWN, "runs", "effect", run_id, effect["id"], "retry", "--as", "bob")
    (again,) = open_requests(upgrade, run_id)
    assert again["kind"] == "wait_approval" and ran(upgrade, "executions.log") == before
    went_on(upgrade, *OWN, "runs", "approve", run_id, again["id"], "--as", "alice")
    assert open_requests(upgrade, run_id) == []
    assert ran(upgrade, "executions.log") == [*before, "migrate billing"]


def chatted(upgrade: Upgrade, run_id: str) -> None:
    """The console's run: ``/resume`` there says to force it at the terminal, where it waits
    on 0.2.0's card still; approved, that card is asked again, as the others' were."""
    console = f"/resume {run_id}\n/quit\n"
    said = upgrade.run("chat", "--as", "carol", stdin=console)
    assert said.returncode == 0, said.stderr
    assert f"resume with --force (kestrel runs resume {run_id} --force)" in said.stdout
    # Forced while it waits on people, it has nothing to do: it takes nothing up, and so
    # accepts no tool set yet; the decision after it is recorded and waits for the next.
    (card,) = forced(upgrade, run_id, by="carol")
    assert card["id"] == upgrade.runs["chat"][1]
    recorded(upgrade, "runs", "approve", run_id, card["id"], "--as", "alice")
    (again,) = forced(upgrade, run_id, by="carol")  # 0.2.0's card's approval asked again
    assert again["id"] != card["id"] and ran(upgrade, "demo-state/restarts.log") == [
        "restart checkout"
    ]
    went_on(upgrade, "runs", "approve", run_id, again["id"], "--as", "alice")
    (question,) = open_requests(upgrade, run_id)
    went_on(upgrade, "runs", "answer", run_id, question["id"], "yes", "--as", "carol")
    assert open_requests(upgrade, run_id) == []


def recorded(upgrade: Upgrade, *args: str) -> str:
    """A decision on a run whose tool set changed: recorded, the run not resumed here, and
    told how to go on. The run's id."""
    run_id = args[args.index("runs") + 2]
    done = upgrade.run(*args)
    assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr)
    said = (
        "recorded; not resumed here: the tool set changed since the run started;"
        f" resume with --force (kestrel runs resume {run_id} --force)"
    )
    assert said in done.stdout, (args, done.stdout)
    return run_id


def went_on(upgrade: Upgrade, *args: str) -> None:
    """A decision on a run forced since the upgrade: recorded, and the run goes on here."""
    done = upgrade.run(*args)
    assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr)
    assert "not resumed here" not in done.stdout, (args, done.stdout)


def forced(upgrade: Upgrade, run_id: str, *config: str, by: str = "bob") -> list[dict[str, Any]]:
    """``kestrel runs resume RUN --force`` by the run's requester: what the run waits on then."""
    done = upgrade.run(*config, "runs", "resume", run_id, "--force", "--as", by)
    waits = open_requests(upgrade, run_id)
    assert done.returncode == (3 if waits else 0), done.stderr
    return waits


def open_requests(upgrade: Upgrade, run_id: str) -> list[dict[str, Any]]:
    """What ``run_id`` waits on, in the order it asked."""
    return [r for r in pending(upgrade) if r["run_id"] == run_id]


def named(upgrade: Upgrade) -> list[tuple[str, dict[str, Any]]]:
    """Each open request, with the name of its run."""
    names = {run_id: name for name, (run_id, _) in upgrade.runs.items()}
    return [(names[r["run_id"]], r) for r in pending(upgrade)]


def ran(upgrade: Upgrade, log: str) -> list[str]:
    """The commands a log beside the store says ran, in order."""
    path = upgrade.folder / log
    return path.read_text().splitlines() if path.exists() else []
