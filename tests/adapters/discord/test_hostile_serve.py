"""Hostile ``kestrel serve discord``: bad tokens, bad URLs, refused intents, and the token in
logs. The real CLI in a subprocess against the fake Discord."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import pytest

from adapters.discord.settings import DiscordSettings
from bot.cli.common import EXIT_TEMPFAIL
from bot.config.settings import ConfigError
from tests.fakes.discord_api import INTENT_MESSAGE_CONTENT, FakeDiscord
from tests.fakes.discord_world import APPROVER, discord_world
from tests.fakes.serving import free_port
from tests.fakes.slack_world import restart_script, write_config

TOKEN = "MTIzNDU2Nzg5MDEyMzQ1Njc4.Gabcde.s3cr3t-t0ken-value-xyz"
KESTREL = str(Path(sys.executable).with_name("kestrel"))


async def _serve(tmp: Path, env: dict[str, str], timeout: float = 45.0) -> tuple[int, str, float]:
    config = write_config(tmp, "http://127.0.0.1:9/v1")
    base = {k: v for k, v in os.environ.items() if not k.startswith("DISCORD_")}
    started = asyncio.get_running_loop().time()
    proc = await asyncio.create_subprocess_exec(
        KESTREL,
        "-v",
        "--config",
        str(config),
        "serve",
        "discord",
        "--port",
        str(free_port()),
        cwd=tmp,
        env={**base, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        return -1, out.decode(), timeout
    return proc.returncode or 0, out.decode(), asyncio.get_running_loop().time() - started


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "DISCORD_TOKEN is not set"),
        ({"DISCORD_TOKEN": f"Bot {TOKEN}"}, "without the 'Bot ' prefix"),
        # Kept by docker run --env-file: Discord said only "Improper token has been passed".
        ({"DISCORD_TOKEN": f'"{TOKEN}"'}, "DISCORD_TOKEN is in quotes"),
        ({"DISCORD_TOKEN": TOKEN, "DISCORD_API_URL": "discord.com/api"}, "DISCORD_API_URL"),
        ({"DISCORD_TOKEN": TOKEN, "DISCORD_API_URL": "http://h:99999/api"}, "DISCORD_API_URL"),
        ({"DISCORD_TOKEN": TOKEN, "DISCORD_MESSAGE_CONTENT": "maybe"}, "DISCORD_MESSAGE_CONTENT"),
        ({"DISCORD_TOKEN": TOKEN, "DISCORD_PING_APPROVERS": "loud"}, "DISCORD_PING_APPROVERS"),
        ({"DISCORD_TOKEN": TOKEN, "DISCORD_CATCH_UP_MINUTES": "15m"}, "DISCORD_CATCH_UP_MINUTES"),
        ({"DISCORD_TOKEN": TOKEN, "DISCORD_CATCH_UP_MINUTES": "-1"}, "DISCORD_CATCH_UP_MINUTES"),
        ({"DISCORD_TOKEN": TOKEN, "DISCORD_CATCH_UP_MINUTES": "1441"}, "from 0 to 1440"),
    ],
)
def test_settings_name_the_bad_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(")) as caught:
        DiscordSettings.from_env(env)
    assert TOKEN not in str(caught.value)


def test_catch_up_reads_back_15_minutes_unless_told() -> None:
    assert DiscordSettings.from_env({"DISCORD_TOKEN": TOKEN}).catch_up_minutes == 15
    off = {"DISCORD_TOKEN": TOKEN, "DISCORD_CATCH_UP_MINUTES": " 0 "}
    assert DiscordSettings.from_env(off).catch_up_minutes == 0


def test_pings_are_on_unless_turned_off() -> None:
    assert DiscordSettings.from_env({"DISCORD_TOKEN": TOKEN}).ping_approvers
    off = {"DISCORD_TOKEN": TOKEN, "DISCORD_PING_APPROVERS": " False "}
    assert not DiscordSettings.from_env(off).ping_approvers


async def _fails_cleanly(tmp: Path, env: dict[str, str], named: str, exits: int = 2) -> str:
    """Serve ``env``: it exits ``exits`` (2, a mistake; 75, Discord not answering), at once,
    naming what went wrong in one line, never the token."""
    code, out, took = await _serve(tmp, env)
    assert code == exits, f"exit {code} after {took:.0f}s:\n{out}"
    assert named in out, out
    assert "Traceback" not in out, out
    assert TOKEN not in out, "the token was printed"
    return out


async def test_serve_without_a_token(tmp_path: Path) -> None:
    await _fails_cleanly(tmp_path, {}, "DISCORD_TOKEN is not set")


async def test_serve_with_a_refused_token(tmp_path: Path) -> None:
    async with FakeDiscord(token="the-right-one") as fake:
        env = {"DISCORD_TOKEN": TOKEN, "DISCORD_API_URL": fake.api_url}
        await _fails_cleanly(tmp_path, env, "DISCORD_TOKEN was refused")


async def test_serve_with_a_token_pasted_with_a_quote(tmp_path: Path) -> None:
    # Sent as it was, the token was refused as "Improper token has been passed".
    async with FakeDiscord(token=TOKEN) as fake:
        env = {"DISCORD_TOKEN": f"{TOKEN}\u201d", "DISCORD_API_URL": fake.api_url}
        out = await _fails_cleanly(tmp_path, env, "DISCORD_TOKEN holds a character that is not")
    assert "(U+201D RIGHT DOUBLE QUOTATION MARK, character 55 of 55)" in out, out
    assert "refused" not in out, out


async def test_serve_with_an_unreachable_api(tmp_path: Path) -> None:
    env = {"DISCORD_TOKEN": TOKEN, "DISCORD_API_URL": "http://127.0.0.1:9/api/v10"}
    out = await _fails_cleanly(
        tmp_path, env, "cannot reach http://127.0.0.1:9/api/v10: ", exits=EXIT_TEMPFAIL
    )
    assert "; check DISCORD_API_URL" in out, out


async def test_serve_with_an_unclosed_session_warning_is_one_line(tmp_path: Path) -> None:
    async with FakeDiscord(token="the-right-one") as fake:
        env = {"DISCORD_TOKEN": TOKEN, "DISCORD_API_URL": fake.api_url}
        out = await _fails_cleanly(tmp_path, env, "DISCORD_TOKEN was refused")
        assert "Unclosed" not in out, out


async def test_serve_when_message_content_is_not_allowed(tmp_path: Path) -> None:
    async with FakeDiscord(disallowed_intents=INTENT_MESSAGE_CONTENT) as fake:
        env = {"DISCORD_TOKEN": TOKEN, "DISCORD_API_URL": fake.api_url}
        code, out, took = await _serve(tmp_path, env)
        assert code not in (0, -1), f"exit {code} after {took:.0f}s:\n{out}"
        assert "Message Content intent" in out and "Traceback" not in out, out
        assert took < 15, f"took {took:.0f}s to fail"


async def test_the_token_never_reaches_the_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with discord_world(tmp_path, restart_script()) as world:
        mention = await world.mention("checkout is failing")
        thread = await world.thread_of(mention)
        card = await world.card("approve")
        await world.click(card, "approve", user=APPROVER)
        await world.answer_posted(thread, "healthy again")
        await world.settled()
    assert "test-token" not in caplog.text
    assert "dGVzdC10b2tlbg" not in caplog.text  # base64 of it


@pytest.mark.parametrize("path", ["/users/@me", "/gateway/bot"])
async def test_serve_under_a_long_rate_limit_at_login_fails_in_one_line(
    tmp_path: Path, path: str
) -> None:
    # The client raises on a 429 it would sleep out for over 30 s; at start that is
    # discord.RateLimited, no HTTPException: it must say what happened, not print a traceback.
    async with FakeDiscord() as fake:
        fake.fail("GET", path, retry_after=900, times=None)
        env = {"DISCORD_TOKEN": TOKEN, "DISCORD_API_URL": fake.api_url}
        await _fails_cleanly(tmp_path, env, "rate limited for 900s")


async def test_serve_with_an_api_that_never_answers_gives_up_in_one_line(tmp_path: Path) -> None:
    # A proxy or a network that takes the connection and passes nothing: the login waited
    # forever, saying nothing at any level, and the startup probe killed it 650 s later.
    async with FakeDiscord() as fake:
        fake.delay("GET", "/users/@me", 600)
        env = {"DISCORD_TOKEN": TOKEN, "DISCORD_API_URL": fake.api_url}
        said = "no answer in time (timed out); check DISCORD_API_URL"
        out = await _fails_cleanly(tmp_path, env, said, exits=EXIT_TEMPFAIL)
        assert out.splitlines()[-1].startswith("kestrel: discord: cannot reach "), out
