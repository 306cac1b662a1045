"""Finding a dispatched command's process group again: real processes in their own sessions."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from msgspec.structs import replace

from bot.domain import ProcessStamp
from bot.tools import orphans


@pytest.fixture
def group() -> Iterator[subprocess.Popen[bytes]]:
    """A command's process group as a tool runs it: a leader with a child, own session."""
    leader = subprocess.Popen(["/bin/sh", "-c", "sleep 30 & sleep 30"], start_new_session=True)
    yield leader
    leader.kill()
    leader.wait()


async def test_a_group_still_running_here_is_stopped(group: subprocess.Popen[bytes]) -> None:
    stamp = orphans.stamp(group.pid)
    assert stamp is not None
    assert orphans.members(stamp)

    said = await orphans.end_orphan(stamp)

    assert (
        said == f"its process group {group.pid} on {stamp.host} was still running and was stopped"
    )
    assert orphans.members(stamp) == []


async def test_a_group_id_now_naming_another_group_is_left_alone(
    group: subprocess.Popen[bytes],
) -> None:
    stamp = orphans.stamp(group.pid)
    assert stamp is not None
    reused = replace(stamp, start_ticks=stamp.start_ticks - 1)

    said = await orphans.end_orphan(reused)

    assert said.endswith("had ended")
    assert orphans.members(stamp), "another group's processes were killed"


async def test_a_group_on_another_host_is_reported_not_touched(
    group: subprocess.Popen[bytes],
) -> None:
    stamp = orphans.stamp(group.pid)
    assert stamp is not None
    elsewhere = replace(stamp, host="db7", host_key="db7/other-boot/pid:[1]")

    said = await orphans.end_orphan(elsewhere)

    assert said == (
        f"it may still be running (process group {group.pid} on db7): check there before retrying"
    )
    assert orphans.members(stamp)


@pytest.fixture
def ended() -> ProcessStamp:
    """The stamp of a group that has ended."""
    done = subprocess.Popen(["true"], start_new_session=True)
    stamp = orphans.stamp(done.pid)
    done.wait()
    assert stamp is not None
    return stamp


async def test_a_group_that_ended_is_said_to_have_ended(ended: ProcessStamp) -> None:
    assert (await orphans.end_orphan(ended)).endswith("had ended")
