"""``kestrel serve slack`` as a user runs it: a real process, its environment, its port."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from adapters.slack import ids
from bot import __version__
from bot.cli.common import EXIT_TEMPFAIL
from tests.fakes.openai_server import Canned, FakeOpenAI, chat_completion
from tests.fakes.serving import (
    free_port,
    log_records,
    run_serve,
    serve_env,
    start_serve,
    wait_healthy,
)
from tests.fakes.slack_api import Call, FakeSlackApi, events_api_envelope, interactive_envelope
from tests.fakes.slack_client import SlackSender, app_mention, block_actions, event_callback
from tests.fakes.slack_world import (
    APPROVER,
    REQUESTER,
    SECRET,
    button_value,
    disguised_links_script,
    masked_links,
    restart_script,
    write_config,
)
from tests.fakes.waiting import until


def _carrying(action: str) -> Callable[[Call], bool]:
    """A Slack API call whose arguments carry ``action`` (a button's id)."""
    return lambda call: action in json.dumps(call.args)


async def test_serve_slack_runs_a_mention_to_its_answer(tmp_path: Path) -> None:
    async with FakeOpenAI(restart_script()) as model, FakeSlackApi() as api:
        config = write_config(tmp_path, model.base_url)
        port = free_port()
        process = start_serve(tmp_path, port, serve_env(config, api.url), "slack")
        try:
            await wait_healthy(port, process)
            sender = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, api=api)
            mention = app_mention(REQUESTER, "checkout is failing")
            assert (await sender.event(mention)).status == 200
            cards = await api.wait_for(
                lambda c: c.ok is True and ids.APPROVE_ONCE in json.dumps(c.args), timeout=20
            )
            card = cards[0]
            ts = next(m["ts"] for m in api.messages["C0001"] if m.get("bot_id") and m.get("blocks"))
            click = block_actions(
                APPROVER,
                ids.APPROVE_ONCE,
                button_value(card, ids.APPROVE_ONCE),
                channel="C0001",
                message_ts=ts,
                thread_ts=mention["ts"],
            )
            assert (await sender.action(click)).status == 200
            await api.wait_for(lambda c: ids.FEEDBACK in json.dumps(c.args), timeout=20)
            assert (tmp_path / "executions.txt").read_text() == "checkout\n"
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0, err
        assert "slack: workspace T0001" in err
        assert "Traceback" not in err
    # Ours at start, then bolt's on the first request: bolt authorizes with the bot token,
    # through the same API, as it did when it was handed our client.
    assert [c.token for c in api.calls if c.method == "auth.test"] == ["xoxb-test"] * 2


@pytest.mark.parametrize("form", ["json", "text"])
async def test_serve_slack_writes_only_log_records_and_each_notice_once(
    tmp_path: Path, form: str
) -> None:
    # Nobody on call: the policy's notice at start.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", extra_policy={"oncall": []})
    async with FakeSlackApi() as api:
        port = free_port()
        process = start_serve(
            tmp_path, port, serve_env(config, api.url, KESTREL_LOG_FORMAT=form), "slack"
        )
        try:
            await wait_healthy(port, process)
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
    assert process.returncode == 0, err
    records = log_records(err, form)  # every line one record, in JSON one object
    serve = [
        r["message"] for r in records if (r["level"], r["logger"]) == ("info", "kestrel.serve")
    ]
    # Which Kestrel, on what, with which journal: what on-call asks of a replica's log first.
    journal = tmp_path / "kestrel.db"
    said = f" (version {__version__}; platforms: slack; store: {journal})"
    assert serve[0].startswith("kestrel serving as ") and serve[0].endswith(said), serve[0]
    assert "slack: workspace T0001 as <@UBOT>, HTTP at /slack/events" in serve
    assert any(m.startswith(f"http: listening on 127.0.0.1:{port} ") for m in serve), serve
    assert serve[-1] == "stopped: live runs suspended and their leases released"
    oncall = [r for r in records if "policy.oncall is empty" in r["message"]]
    assert [r["level"] for r in oncall] == ["warning"], err
    assert [r for r in records if "will be unused" in r["message"]] == []
    assert [r for r in records if "offline demo model" in r["message"]] == []


def test_serve_slack_without_a_token_says_which_variable(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    env = serve_env(config, "http://127.0.0.1:9/api/")
    del env["SLACK_BOT_TOKEN"]
    done = run_serve(tmp_path, env, "slack", "--port", str(free_port()))
    assert done.returncode == 2
    assert "SLACK_BOT_TOKEN is not set" in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_slack_with_its_api_unreachable_says_what_to_check(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    done = run_serve(
        tmp_path, serve_env(config, "http://127.0.0.1:9/api/"), "slack", "--port", str(free_port())
    )
    assert done.returncode == EXIT_TEMPFAIL  # not answering: worth starting again, unlike 2
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("kestrel: slack: cannot reach http://127.0.0.1:9/api/: "), line
    assert line.endswith("; check SLACK_API_URL"), line


async def test_serve_slack_with_a_refused_token_says_so(tmp_path: Path) -> None:
    async with FakeSlackApi() as api:
        api.refuse("auth.test", "invalid_auth")
        config = write_config(tmp_path, "http://127.0.0.1:9/v1")
        env = serve_env(config, api.url)
        done = await asyncio.to_thread(
            run_serve, tmp_path, env, "slack", "--port", str(free_port())
        )
    assert done.returncode == 2
    assert "auth.test refused SLACK_BOT_TOKEN: invalid_auth" in done.stderr
    assert "Traceback" not in done.stderr


async def test_serve_slack_whose_api_answers_5xx_at_start_exits_to_be_started_again(
    tmp_path: Path,
) -> None:
    # Slack down (or a proxy before it), not the token: a later start gets past it.
    async with FakeSlackApi() as api:
        api.fail("auth.test", error="service_unavailable", status=503, times=None)
        config = write_config(tmp_path, "http://127.0.0.1:9/v1")
        env = serve_env(config, api.url)
        done = await asyncio.to_thread(
            run_serve, tmp_path, env, "slack", "--port", str(free_port())
        )
    assert done.returncode == EXIT_TEMPFAIL, done.stderr
    assert "Traceback" not in done.stderr


async def test_serve_slack_in_socket_mode_takes_a_mention(tmp_path: Path) -> None:
    async with FakeOpenAI(restart_script()) as model, FakeSlackApi() as api:
        config = write_config(tmp_path, model.base_url)
        port = free_port()
        env = serve_env(config, api.url, SLACK_APP_TOKEN="xapp-1-test")
        process = start_serve(tmp_path, port, env, "slack")
        try:
            await wait_healthy(port, process)
            await api.wait_for_socket(timeout=20)
            mention = app_mention(REQUESTER, "checkout is failing")
            envelope = await api.socket_send(events_api_envelope(event_callback(mention)))
            await api.wait_for_ack(envelope)
            cards = await api.wait_for(
                lambda c: c.ok is True and ids.APPROVE_ONCE in json.dumps(c.args), timeout=20
            )
            # Socket Mode clicks are checked against the run's place as HTTP ones are.
            ts = next(m["ts"] for m in api.messages["C0001"] if m.get("bot_id") and m.get("blocks"))
            value = button_value(cards[0], ids.APPROVE_ONCE)
            elsewhere = block_actions(
                APPROVER, ids.APPROVE_ONCE, value, channel="C0OTHER", message_ts=ts,
                thread_ts=mention["ts"],
            )  # fmt: skip
            await api.wait_for_ack(await api.socket_send(interactive_envelope(elsewhere)))
            told = await api.wait_for("chat.postEphemeral", timeout=20)
            assert "another channel" in json.dumps(told[0].args)
            assert not (tmp_path / "executions.txt").exists()
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0, err
        assert "socket mode" in err


async def test_serve_slack_shows_the_target_of_every_link_the_model_hides(tmp_path: Path) -> None:
    async with FakeOpenAI(disguised_links_script()) as model, FakeSlackApi() as api:
        config = write_config(tmp_path, model.base_url)
        port = free_port()
        process = start_serve(tmp_path, port, serve_env(config, api.url), "slack")
        try:
            await wait_healthy(port, process)
            sender = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, api=api)
            for ask in ("approve the restart", "ask me", "tell me"):
                assert (await sender.event(app_mention(REQUESTER, ask))).status == 200
            posted = [
                (await api.wait_for(_carrying(i), timeout=20))[0]
                for i in (ids.APPROVE_ONCE, ids.ANSWER, ids.FEEDBACK)
            ]
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
        assert process.returncode == 0, err
    card, question, answer = (json.dumps(call.args, ensure_ascii=False) for call in posted)
    assert "Why:*\\n>Pay at https://bank.example (https://evil.example); see docs" in card
    assert "*Question:* Pay at https://bank.example (https://evil.example)" in question
    assert "the bank (https://evil.example/b)" in answer
    assert "<https://bank.example> (https://evil.example/x)" in answer
    assert [c.method for c in api.calls if masked_links(json.dumps(c.args))] == []


async def test_serve_runs_a_call_the_model_sent_twice_with_its_id_once(tmp_path: Path) -> None:
    # One model reply holding the same gated call twice (same id, tool and arguments): one
    # card, one approval, one execution, one answer.
    twice = chat_completion(
        calls=[
            ("call_0", "restart_service", '{"service": "checkout"}'),
            ("call_0", "restart_service", '{"service":"checkout"}'),
        ]
    )
    canned = [Canned(status=200, body=twice)]
    async with FakeOpenAI(restart_script()[1:], canned=canned) as model, FakeSlackApi() as api:
        config = write_config(tmp_path, model.base_url)
        port = free_port()
        process = start_serve(tmp_path, port, serve_env(config, api.url), "slack")
        try:
            await wait_healthy(port, process)
            sender = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, api=api)
            mention = app_mention(REQUESTER, "checkout is failing")
            assert (await sender.event(mention)).status == 200
            cards = await api.wait_for(
                lambda c: c.ok is True and ids.APPROVE_ONCE in json.dumps(c.args), timeout=20
            )
            ts = next(m["ts"] for m in api.messages["C0001"] if m.get("bot_id") and m.get("blocks"))
            click = block_actions(
                APPROVER,
                ids.APPROVE_ONCE,
                button_value(cards[0], ids.APPROVE_ONCE),
                channel="C0001",
                message_ts=ts,
                thread_ts=mention["ts"],
            )
            assert (await sender.action(click)).status == 200
            await api.wait_for(lambda c: ids.FEEDBACK in json.dumps(c.args), timeout=20)
        finally:
            process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(process.communicate, timeout=30)
    posted = [c for c in api.calls if c.method == "chat.postMessage" and c.ok]
    assert len([c for c in posted if ids.APPROVE_ONCE in json.dumps(c.args)]) == 1
    assert (tmp_path / "executions.txt").read_text() == "checkout\n"
    answered = [m for m in model.requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in answered] == ["call_0"]


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        ("invalid_auth", ""),
        # An app-level token created without the scope: it was "Slack failing", tried for ever.
        ("missing_scope", " (an app-level token needs the connections:write scope: "),
    ],
)
async def test_serve_slack_with_an_app_token_slack_refuses_says_so_and_exits_2(
    tmp_path: Path, error: str, hint: str
) -> None:
    # A wrong SLACK_APP_TOKEN: the socket client asked again every 10 s forever, two errors a
    # time, while nothing listened on /healthz; the unit never failed, the pod never said why.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    async with FakeSlackApi() as api:
        api.refuse("apps.connections.open", error)
        env = serve_env(config, api.url, SLACK_APP_TOKEN="xapp-wrong-4e8c2a")
        done = await asyncio.to_thread(run_serve, tmp_path, env, "slack", "--port", "0")
        asked = api.calls_to("apps.connections.open")
    assert done.returncode == 2, done.stderr
    assert [call.token for call in asked] == ["xapp-wrong-4e8c2a"]  # the app's, not the bot's
    said = f"kestrel: slack: apps.connections.open refused SLACK_APP_TOKEN: {error}{hint}"
    assert done.stderr.splitlines()[-1].startswith(said), done.stderr
    assert "xapp-wrong-4e8c2a" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("status", [200, 503])
async def test_serve_slack_in_socket_mode_serves_its_port_while_slack_is_down(
    tmp_path: Path, status: int
) -> None:
    # Slack down at start: serve asked for a socket for ever before it opened its port, so
    # /healthz never answered and the startup probe killed the pod, again and again.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    async with FakeSlackApi() as api:
        api.fail("apps.connections.open", error="internal_error", status=status, times=None)

        async def heal() -> None:
            await until(lambda: api.count("apps.connections.open") >= 3, timeout=20)
            api.clear_faults("apps.connections.open")

        err = await _socket_mode_unready(tmp_path, config, api, heal)
    # One line for the problem, however many times it was asked; one when it ends.
    said = [line for line in err.splitlines() if "internal_error" in line]
    assert len(said) == 2, err
    assert "cannot connect yet" in said[0] and "Socket Mode connected after" in said[1], err
    assert "Traceback" not in err and "xapp-1-test" not in err


async def test_serve_slack_in_socket_mode_serves_its_port_while_slack_limits_it(
    tmp_path: Path,
) -> None:
    # Replicas started together, or one restarted in a loop: apps.connections.open is Tier 1.
    # Serve waited out Slack's Retry-After twice before its port opened (a minute for 30 s),
    # and the startup probe killed it first, which asked again, and was limited again.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    async with FakeSlackApi() as api:
        api.fail("apps.connections.open", retry_after=30, times=None)  # 429, ratelimited
        err = await _socket_mode_unready(tmp_path, config, api)
    assert "cannot connect yet: apps.connections.open said ratelimited" in err, err
    assert "Traceback" not in err


async def test_serve_slack_in_socket_mode_serves_its_port_while_its_socket_cannot_open(
    tmp_path: Path,
) -> None:
    # Behind a firewall that lets the Web API through and not the socket's host: the socket
    # client tried the URL every 10 s for ever inside serve's start, whose port never opened.
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    async with FakeSlackApi() as api:
        closed = f"ws://127.0.0.1:{free_port()}/socket?ticket=TICKET-7f3a"
        api.set_handler("apps.connections.open", lambda call: {"ok": True, "url": closed})

        async def heal() -> None:
            api.set_handler("apps.connections.open", None)  # a new socket, which opens

        err = await _socket_mode_unready(tmp_path, config, api, heal)
    said = [line for line in err.splitlines() if "did not open" in line]
    assert len(said) == 2, err
    assert "cannot connect yet: the socket at 127.0.0.1 did not open within 10 s" in said[0]
    assert "Socket Mode connected after" in said[1], err
    assert "Traceback" not in err and "TICKET-7f3a" not in err


async def _socket_mode_unready(
    tmp_path: Path,
    config: Path,
    api: FakeSlackApi,
    heal: Callable[[], Awaitable[None]] | None = None,
) -> str:
    """``kestrel serve slack`` in Socket Mode while ``api`` gives it no socket: its port
    answers (the first try may take the socket's 10 s) and ``/readyz`` says Slack reconnects;
    after ``heal``, given, a socket opens and it is ready. What it said, stopped with 0."""
    port = free_port()
    env = serve_env(config, api.url, SLACK_APP_TOKEN="xapp-1-test")
    process = start_serve(tmp_path, port, env, "slack")
    try:
        await until(lambda: _readyz_status(port, process), timeout=60)
        status, body = await _readyz(port)
        assert status == 503 and body["problems"] == {"slack": "not connected (reconnecting)"}
        if heal is not None:
            await heal()
            await api.wait_for_socket(timeout=60)
            await until(lambda: _ready(port), timeout=20)
    finally:
        process.send_signal(signal.SIGTERM)
        _out, err = await asyncio.to_thread(process.communicate, timeout=30)
    assert process.returncode == 0, err
    return err


async def _readyz_status(port: int, process: Any) -> int:
    """``/readyz``'s status once the port answers (0 before); fails if serve ended."""
    assert process.poll() is None, process.communicate()[1]
    try:
        return (await _readyz(port))[0]
    except aiohttp.ClientError:
        return 0


async def _readyz(port: int) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/readyz") as response,
    ):
        body: dict[str, Any] = await response.json()
        return response.status, body


async def _ready(port: int) -> bool:
    status, _body = await _readyz(port)
    return status == 200


async def test_serve_slack_whose_app_token_is_revoked_while_slack_was_down_says_so(
    tmp_path: Path,
) -> None:
    # Tried again in the background: a refusal then is no outage to wait out. Said once as an
    # error, and /readyz says Slack is no longer tried (a restart with a new token mends it).
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    async with FakeSlackApi() as api:
        api.refuse("apps.connections.open", "internal_error")
        port = free_port()
        env = serve_env(config, api.url, SLACK_APP_TOKEN="xapp-1-revoked")
        process = start_serve(tmp_path, port, env, "slack")
        try:
            await wait_healthy(port, process)
            await until(lambda: api.count("apps.connections.open") >= 2, timeout=20)
            api.clear_faults("apps.connections.open")
            api.refuse("apps.connections.open", "token_revoked")
            gave_up = {"slack": "not connected (no longer trying)"}
            await until(lambda: _problems(port, gave_up), timeout=20)
            asked = api.count("apps.connections.open")
        finally:
            process.send_signal(signal.SIGTERM)
            _out, err = await asyncio.to_thread(process.communicate, timeout=30)
    assert process.returncode == 0, err
    assert api.count("apps.connections.open") == asked  # not asked again
    said = [line for line in err.splitlines() if "token_revoked" in line]
    assert len(said) == 1 and " ERROR kestrel.slack: " in said[0], err
    assert "SLACK_APP_TOKEN" in said[0] and "xapp-1-revoked" not in err, err


async def _problems(port: int, problems: dict[str, str]) -> bool:
    _status, body = await _readyz(port)
    return bool(body["problems"] == problems)
