"""A replica told to stop (SIGTERM to ``kestrel serve``) as a command runs hands its run back;
SIGKILLed after each kind of journal append as it does, another replica adopts the run, and no
effect runs again without a fresh decision by on-call. Real processes, a real SQLite file or
PostgreSQL schema, real openai client (the harness of test_crash_resume)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.crash.database import STORES, rows
from tests.crash.test_crash_resume import SCRIPT, assert_finished_each_effect_once, child, effects

# The command under way finishes within the stop's grace (the default), or is killed at once
# (none); with the kill points past what the first run's path has (test_crash_resume): the
# answer of a command let finish, and the run's suspension as it is handed back ("" is none).
GRACES = {"tool_finishes": "5", "tool_killed": "0"}
CRASHES = {
    "tool_finishes": ["", "tool_result", "run_suspended"],
    "tool_killed": ["", "run_suspended"],
}


@pytest.mark.parametrize("store_name", STORES)
@pytest.mark.parametrize("world", [SCRIPT], indirect=True)
@pytest.mark.parametrize(
    ("grace", "crash"), [(grace, crash) for grace, crashes in CRASHES.items() for crash in crashes]
)
def test_a_run_handed_back_is_adopted_and_runs_each_effect_once(
    world: dict[str, Path | str], grace: str, crash: str
) -> None:
    folder = Path(world["dir"])
    stopping = ["--stop-while-running", "effect", "--stop-grace", GRACES[grace]]
    crash_args = ["--crash-after", f"{crash}:1"] if crash else []
    stopped = child(world, *stopping, *crash_args)
    assert stopped.returncode == (-9 if crash else 0), stopped.stderr
    run_id = (folder / "run_id").read_text()
    if not crash:  # handed back, for any replica to go on with
        assert json.loads(stopped.stdout)["status"] == "suspended"
        ((body,),) = rows(
            world, "SELECT body FROM journal WHERE run_id = ? ORDER BY seq DESC LIMIT 1", run_id
        )
        assert json.loads(body)["reason"] == "handed_back", body
    ran = effects(folder)

    adopted = json.loads(child(world, "--resume", run_id, "--adopt").stdout)

    # A command let finish is answered, and asked about by nobody; one killed is on-call's.
    asked = [request["kind"] for request in adopted["requests"]]
    if grace == "tool_finishes" and crash != "":
        assert ran == ["a"] and asked == [], (ran, adopted)
    if grace == "tool_killed":
        assert ran == [] and asked == ["wait_effect"], (ran, adopted)
    retries: Counter[str] = Counter()
    assert_finished_each_effect_once(world, run_id, retries)
    # Each ran once, but for the one on-call chose to retry (if it got as far as its effect).
    assert Counter(effects(folder)) - Counter(retries) <= Counter("abc"), effects(folder)
    assert set(effects(folder)) == {"a", "b", "c"}
