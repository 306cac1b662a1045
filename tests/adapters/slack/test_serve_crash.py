"""``kestrel serve slack`` killed (SIGKILL) right after Slack got its 200: restarted on the same
database, every mention and every answering reply is answered exactly once, whether Slack
sends the delivery again (``X-Slack-Retry-Num``) or not, and a run that ended just before the
kill shows its answer once."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

from adapters.slack import ids
from tests.fakes import discord_payloads as p
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_world import REQUESTER as DISCORD_REQUESTER
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.serving import free_port, serve_env, start_serve, wait_healthy
from tests.fakes.slack_api import FakeSlackApi
from tests.fakes.slack_client import SlackSender, app_mention, message
from tests.fakes.slack_world import CHANNEL, REQUESTER, SECRET, write_config
from tests.fakes.waiting import until

# A mention starting with "ask" asks a question, any other is answered at once; an answer to
# the question is echoed.
SCRIPT: list[Any] = [
    {
        "one_of": [
            {
                "match": "^ask",
                "text": "One detail first.",
                "calls": [{"name": "ask_human_input", "arguments": {"question": "Which region?"}}],
            },
            {"match": "(?P<said>.+)", "text": "Answered: {said}."},
        ]
    },
    {"one_of": [{"match": "(?P<answer>.+)", "text": "Looking at {answer}."}]},
]
# Milliseconds between a delivery's 200 and the kill (the last one sent is killed at once).
DELAYS = (50, 20, 5, 2, 0)
# A lease of a second: a dead replica's work, runs and outbox claims are taken up after it.
REPLICA = {"replica": {"lease_seconds": 1.0}}


def answers_in(api: FakeSlackApi, thread_ts: str) -> list[str]:
    """The answers posted in a thread (messages with the feedback buttons), as JSON."""
    posted = [json.dumps(c.args) for c in api.calls_to("chat.postMessage") if c.ok]
    return [p for p in posted if f'"thread_ts": "{thread_ts}"' in p and ids.FEEDBACK in p]


def ended(database: Path, thread_ts: str) -> bool:
    """Whether the run of the thread ``thread_ts`` has ended."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        found = conn.execute(
            "SELECT runs.status FROM runs JOIN sessions ON sessions.id = runs.session_id"
            " WHERE sessions.thread = ?",
            (thread_ts,),
        ).fetchone()
    return found is not None and found[0] == "completed"


def accepted(database: Path, message_id: str) -> bool:
    """Whether a Discord message is held in the store."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT payload FROM work WHERE kind = 'inbound'").fetchall()
    return any(f'"{message_id}"' in row[0] for row in rows)


def settled(database: Path) -> bool:
    """Whether the store holds nothing more to do: no work left, no run going, no message
    waiting to be shown."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        work = conn.execute("SELECT COUNT(*) FROM work WHERE done_at IS NULL").fetchone()[0]
        running = conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'running'").fetchone()
        due = conn.execute("SELECT COUNT(*) FROM outbox WHERE version > delivered_version")
        return bool(work == 0 and running[0] == 0 and due.fetchone()[0] == 0)


def kill(process: subprocess.Popen[str]) -> str:
    """SIGKILL, and what the process said on stderr."""
    process.send_signal(signal.SIGKILL)
    return process.communicate(timeout=10)[1]


async def stop(process: subprocess.Popen[str]) -> str:
    """SIGTERM, to its end; its stderr."""
    process.send_signal(signal.SIGTERM)
    _out, err = await asyncio.to_thread(process.communicate, timeout=30)
    return err


async def test_killed_after_the_200_every_message_is_answered_once(tmp_path: Path) -> None:
    async with FakeOpenAI(SCRIPT) as model, FakeSlackApi() as api:
        config = write_config(tmp_path, model.base_url, extra_config=REPLICA)
        port = free_port()
        env = serve_env(config, api.url)
        url = f"http://127.0.0.1:{port}/slack/events"
        sender = SlackSender(url, SECRET, api=api)
        process = start_serve(tmp_path, port, env, "slack")
        try:
            await wait_healthy(port, process)
            question = app_mention(REQUESTER, "ask me")
            assert (await sender.event(question)).status == 200
            await api.wait_for(lambda c: ids.ANSWER in json.dumps(c.args), timeout=20)

            # The reply answering the question, then mentions each killed a little sooner
            # after its 200: each is somewhere between its mark and its answer at the kill.
            sent: list[tuple[dict[str, Any], str]] = []
            reply = message(REQUESTER, "eu-west", channel=CHANNEL, thread_ts=question["ts"])
            events = [reply, *(app_mention(REQUESTER, f"check {d}") for d in DELAYS)]
            for event, delay in zip(events, (DELAYS[0], *DELAYS), strict=True):
                event_id = f"Ev{event['ts'].replace('.', '')}"
                assert (await sender.event(event, event_id=event_id)).status == 200
                sent.append((event, event_id))
                await asyncio.sleep(delay / 1000)
            err = kill(process)
            assert "Traceback" not in err

            process = start_serve(tmp_path, port, env, "slack")
            await wait_healthy(port, process)
            # Slack sends every other delivery again (it never heard back in time), as retry 1.
            for event, event_id in sent[::2]:
                response = await sender.event(event, event_id=event_id, retry_num=1)
                assert response.status == 200

            threads = [question["ts"], *(event["ts"] for event, _ in sent[1:])]
            await until(lambda: all(answers_in(api, ts) for ts in threads), timeout=30)
            await until(lambda: settled(tmp_path / "kestrel.db"), timeout=10)
            answered = answers_in(api, question["ts"])
            assert len(answered) == 1 and "Looking at eu-west" in answered[0]
            for event, _ in sent[1:]:
                said = event["text"].split("> ", 1)[1]
                answered = answers_in(api, event["ts"])
                assert len(answered) == 1 and f"Answered: {said}." in answered[0], said

            # Killed as soon as a run's end is in the store: its answer shows once all the same.
            last = app_mention(REQUESTER, "check the end")
            assert (await sender.event(last)).status == 200
            await until(lambda: ended(tmp_path / "kestrel.db", last["ts"]), interval=0.001)
            assert "Traceback" not in kill(process)
            # Killed between the end and the post (the post takes a few store round trips more
            # than the poll; on a slow machine the case may degrade to an answer shown already).
            process = start_serve(tmp_path, port, env, "slack")
            await wait_healthy(port, process)
            await until(lambda: answers_in(api, last["ts"]), timeout=20)
            await until(lambda: settled(tmp_path / "kestrel.db"), timeout=10)
            answered = answers_in(api, last["ts"])
            assert len(answered) == 1 and "Answered: check the end." in answered[0]
        finally:
            if process.poll() is None:
                err = await stop(process)
                assert "Traceback" not in err, err


async def test_serve_discord_killed_after_taking_a_mention_answers_it_once(
    tmp_path: Path,
) -> None:
    async with FakeOpenAI(SCRIPT) as model, FakeDiscord() as fake:
        config = write_config(tmp_path, model.base_url, extra_config=REPLICA)
        port = free_port()
        env = serve_env(
            config, "http://127.0.0.1:9/api/", DISCORD_TOKEN="t0k3n", DISCORD_API_URL=fake.api_url
        )
        process = start_serve(tmp_path, port, env, "discord")
        try:
            await wait_healthy(port, process)
            mentions = [
                p.message_create(author_id=DISCORD_REQUESTER, content=f"<@{p.BOT_ID}> check {n}")
                for n in range(3)
            ]
            # Discord sends no delivery again: what counts is from its acceptance on.
            database = tmp_path / "kestrel.db"
            for mention, delay in zip(mentions, (20, 5, 0), strict=True):
                await fake.dispatch("MESSAGE_CREATE", mention)
                message_id = str(mention["id"])
                await until(lambda: accepted(database, message_id), interval=0.001)  # noqa: B023
                await asyncio.sleep(delay / 1000)
            assert "Traceback" not in kill(process)

            process = start_serve(tmp_path, port, env, "discord")
            await wait_healthy(port, process)

            def answers(n: int) -> list[str]:
                path = f"/channels/{mentions[n]['id']}/messages"
                texts = [json.dumps(c.json) for c in fake.calls if c.path == path]
                return [t for t in texts if f"Answered: check {n}." in t]

            await until(lambda: all(answers(n) for n in range(3)), timeout=30)
            await until(lambda: settled(tmp_path / "kestrel.db"), timeout=10)
            assert [len(answers(n)) for n in range(3)] == [1, 1, 1]
        finally:
            if process.poll() is None:
                err = await stop(process)
                assert "Traceback" not in err, err
