"""``kestrel run``'s exit status says how the run stopped: scripts can tell failure from success."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.cli.common import EXIT_CANCELLED, EXIT_COMPLETED, EXIT_FAILED, EXIT_SUSPENDED, exit_status
from bot.domain import RunStatus
from tests.bot.cli.test_cli import kestrel, one_line_error, write_config


def test_a_completed_run_exits_0(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "run", "checkout is failing", "--json")
    assert json.loads(result.stdout)["status"] == "completed"
    assert result.returncode == 0, result.stderr


def test_a_failed_run_exits_1_with_its_result_still_printed(tmp_path: Path) -> None:
    write_config(tmp_path, budgets={"max_iterations": 1})
    result = kestrel(tmp_path, "run", "checkout is failing", "--json")
    obj = json.loads(result.stdout)
    assert (obj["status"], obj["stop_reason"]) == ("failed", "iteration_limit")
    assert result.returncode == 1, result.stderr
    plain = kestrel(tmp_path, "run", "checkout is failing")
    assert plain.returncode == 1
    assert "failed, iteration_limit" in plain.stderr


def test_a_deferred_run_exits_3(tmp_path: Path) -> None:
    result = kestrel(tmp_path, "run", "checkout is failing", "--defer", "--json")
    assert json.loads(result.stdout)["status"] == "suspended"
    assert result.returncode == 3, result.stderr


def test_a_refused_start_is_still_the_usage_status(tmp_path: Path) -> None:
    write_config(tmp_path, policy={"requesters": ["U0ALLOWED"]})
    assert "may not start runs" in one_line_error(kestrel(tmp_path, "run", "hi", "--as", "U0X"))


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (RunStatus.COMPLETED, EXIT_COMPLETED),
        (RunStatus.FAILED, EXIT_FAILED),
        (RunStatus.CANCELLED, EXIT_CANCELLED),
        (RunStatus.SUSPENDED, EXIT_SUSPENDED),
        (RunStatus.RUNNING, EXIT_SUSPENDED),  # taken over: it goes on elsewhere, not done here
    ],
)
def test_every_status_has_its_own_code(status: RunStatus, code: int) -> None:
    assert exit_status(status.value) == code
    assert len({EXIT_COMPLETED, EXIT_FAILED, 2, EXIT_SUSPENDED, EXIT_CANCELLED}) == 5


def test_the_codes_are_documented_in_help(tmp_path: Path) -> None:
    shown = kestrel(tmp_path, "run", "--help").stdout
    for line in ("0  completed", "1  failed", "2  not run", "3  suspended", "4  cancelled"):
        assert line in shown, shown
