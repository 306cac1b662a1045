"""``kestrel chat`` stops within a deadline whatever its store does: a SIGTERM while a command
runs and PostgreSQL has gone silent used to wait on each of the stop's writes in turn, for as
long as ``database_timeout_seconds`` allows each, and a second signal was ignored."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest
import yaml

from bot.cli.chat_cmd import STOP_MARGIN_SECONDS
from bot.cli.stopping import EXIT_SECONDS
from tests.bot.cli.test_cli_signals import SLOW, SLOW_SCRIPT, effects
from tests.fakes.processes import KESTREL, clean_env
from tests.fakes.tcp_proxy import TcpProxy, proxied_dsn
from tests.fakes.waiting import until

DSN = os.environ.get("KESTREL_TEST_POSTGRES_DSN", "")
pytestmark = pytest.mark.skipif(not DSN, reason="set KESTREL_TEST_POSTGRES_DSN")


def chat_with(folder: Path, database: str) -> subprocess.Popen[str]:
    """``kestrel chat`` on ``database``, asked to run the slow command."""
    (folder / "slow.sh").write_text('echo start >> "$EFFECTS_FILE"\nsleep 30\n')
    (folder / "tools.yaml").write_text(yaml.safe_dump({"tools": [SLOW]}))
    (folder / "script.yaml").write_text(yaml.safe_dump(SLOW_SCRIPT))
    config = {
        "database": database,
        "database_timeout_seconds": 60,
        "model": {"provider": "scripted", "script": "script.yaml"},
        "tools": ["tools.yaml"],
    }
    (folder / "kestrel.yaml").write_text(yaml.safe_dump(config))
    chat = subprocess.Popen(
        [*KESTREL, "chat"],
        cwd=folder,
        env=clean_env(EFFECTS_FILE=str(folder / "effects.txt")),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert chat.stdin is not None
    chat.stdin.write("do the slow thing\n")
    chat.stdin.flush()
    return chat


@asynccontextmanager
async def slow_chat(folder: Path) -> AsyncIterator[tuple[subprocess.Popen[str], TcpProxy, str]]:
    """``kestrel chat`` on a schema of its own behind a proxy, once its slow command started;
    killed if still running, the proxy restored and the schema dropped on leaving."""
    schema = f"chat_stop_{uuid.uuid4().hex[:12]}"
    async with proxied_dsn(DSN) as (proxied, proxy):
        chat = chat_with(folder, f"{proxied}?schema={schema}")
        try:
            await until(lambda: effects(folder) == ["start"], timeout=30)
            yield chat, proxy, schema
        finally:
            if chat.poll() is None:
                chat.kill()
                chat.wait()
            proxy.restore()
            conn = await asyncpg.connect(DSN)
            await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            await conn.close()


async def test_chat_stops_by_its_deadline_with_the_store_silent(tmp_path: Path) -> None:
    async with slow_chat(tmp_path) as (chat, proxy, _):
        proxy.hold()  # every connection open, no byte passes: a silent server
        signalled = time.monotonic()
        chat.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(chat.communicate, timeout=40)
        took = time.monotonic() - signalled
    assert took < STOP_MARGIN_SECONDS + EXIT_SECONDS + 2, (took, err)
    assert chat.returncode == 143, err
    assert "Traceback" not in err
    # What it left: the run it could not suspend, and how it is taken up.
    assert "the stop outlasted its deadline" in err and "suspending run run_" in err, err
    assert "kestrel runs resume run_" in err, err


async def test_a_second_sigterm_ends_the_chats_stop_at_once(tmp_path: Path) -> None:
    # Once the chat was leaving, its signal handlers did nothing: a person whose chat hung on a
    # silent store had only SIGKILL, and nothing said what was left.
    async with slow_chat(tmp_path) as (chat, proxy, _):
        proxy.hold()
        chat.send_signal(signal.SIGTERM)
        await until(lambda: proxy.held > 0, timeout=10)  # the suspend's write, unanswered
        signalled = time.monotonic()
        chat.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(chat.communicate, timeout=20)
        took = time.monotonic() - signalled
    assert took < 3, (took, err)
    assert chat.returncode == 143, err
    assert "Traceback" not in err
    said = "SIGTERM again while stopping: stopping at once, cutting short suspending run run_"
    assert said in err, err


async def test_a_chats_stop_cut_short_that_still_suspended_the_run_says_so(
    tmp_path: Path,
) -> None:
    # The cut's line says what it may leave ("its lease runs out, then kestrel runs resume
    # takes it up"); when the suspend landed all the same, the chat ended on that line, and
    # its person waited on a lease that was released.
    async with slow_chat(tmp_path) as (chat, proxy, schema):
        proxy.hold()
        chat.send_signal(signal.SIGTERM)
        await until(lambda: proxy.held > 0, timeout=10)  # the suspend's write, unanswered
        chat.send_signal(signal.SIGTERM)
        proxy.restore()  # answered now, well within the second the cut gives
        _, err = await asyncio.to_thread(chat.communicate, timeout=20)
        conn = await asyncpg.connect(DSN)
        status, owner = await conn.fetchrow(f"SELECT status, owner FROM {schema}.runs")
        await conn.close()
    assert chat.returncode == 143, err
    assert (status, owner) == ("suspended", ""), err
    assert "SIGTERM again while stopping" in err, err
    assert "stopped: the run under way was suspended" in err, err
