"""Self-tests of the Slack fakes against the real slack_sdk / slack_bolt pieces."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler
from slack_bolt.async_app import AsyncAck, AsyncApp, AsyncRespond, AsyncSay
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.web.async_client import AsyncWebClient

from tests.fakes.slack_api import (
    Call,
    FakeSlackApi,
    events_api_envelope,
    interactive_envelope,
    slash_command_envelope,
)
from tests.fakes.slack_client import (
    SlackSender,
    app_mention,
    block_actions,
    event_callback,
    message,
    slash_command,
    view_submission,
)

SECRET = "test-signing-secret"
TOKEN = "xoxb-test"


@pytest.fixture
async def api() -> AsyncIterator[FakeSlackApi]:
    async with FakeSlackApi() as fake:
        yield fake


@pytest.fixture
def client(api: FakeSlackApi) -> AsyncWebClient:
    return AsyncWebClient(token=TOKEN, base_url=api.url)


# ------------------------------------------------------------------ Web API


async def test_post_update_replies_permalink_delete(
    api: FakeSlackApi, client: AsyncWebClient
) -> None:
    parent = api.add_message("C1", user="U1", text="<@UBOT> hi")
    metadata = {"event_type": "kestrel_turn", "event_payload": {"run": "r1"}}
    posted = await client.chat_postMessage(
        channel="C1", text="working", thread_ts=parent["ts"], metadata=metadata
    )
    ts = posted["ts"]
    assert posted["ok"] and posted["channel"] == "C1"
    assert ts > parent["ts"] and posted["message"]["user"] == "UBOT"
    assert posted["message"]["bot_id"] == "B0001"

    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "done"}}]
    updated = await client.chat_update(channel="C1", ts=ts, text="done", blocks=blocks)
    assert updated["message"]["blocks"] == blocks
    assert api.message("C1", ts) is not None
    assert api.message("C1", ts)["text"] == "done"  # type: ignore[index]

    plain = await client.conversations_replies(channel="C1", ts=parent["ts"])
    assert [m["ts"] for m in plain["messages"]] == [parent["ts"], ts]
    assert plain["messages"][0]["reply_count"] == 1
    assert "metadata" not in plain["messages"][1]
    full = await client.conversations_replies(
        channel="C1", ts=parent["ts"], include_all_metadata=True
    )
    assert full["messages"][1]["metadata"] == metadata

    link = await client.chat_getPermalink(channel="C1", message_ts=ts)
    assert link["permalink"] == f"https://test.slack.com/archives/C1/p{ts.replace('.', '')}"

    await client.chat_delete(channel="C1", ts=ts)
    assert api.message("C1", ts) is None
    with pytest.raises(SlackApiError) as missing:
        await client.chat_update(channel="C1", ts=ts, text="again")
    assert missing.value.response["error"] == "message_not_found"

    # Which wire format slack_sdk used for each method.
    verbs = {c.method: (c.verb, c.headers.get("content-type", "")) for c in api.calls}
    assert verbs["chat.postMessage"][1].startswith("application/json")
    assert verbs["conversations.replies"][0] == "GET"
    # params= methods POST an empty form body and put their arguments in the query string
    (delete,) = api.calls_to("chat.delete")
    assert delete.verb == "POST" and delete.query == {"channel": "C1", "ts": ts}
    assert all(c.token == TOKEN for c in api.calls)


async def test_form_bodies_decode_json_fields(api: FakeSlackApi, client: AsyncWebClient) -> None:
    blocks = [{"type": "divider"}]
    await client.api_call(
        "chat.postMessage", data={"channel": "C1", "text": "x", "blocks": json.dumps(blocks)}
    )
    (call,) = api.calls_to("chat.postMessage")
    assert call.args["blocks"] == blocks
    assert call.headers["content-type"].startswith("application/x-www-form-urlencoded")


async def test_ephemeral_unknown_method_and_ok_methods(
    api: FakeSlackApi, client: AsyncWebClient
) -> None:
    eph = await client.chat_postEphemeral(channel="C1", user="U1", text="psst")
    assert eph["message_ts"] and api.ephemerals[0]["text"] == "psst"
    with pytest.raises(SlackApiError) as unknown:
        await client.api_call("nope.nothing")
    assert unknown.value.response["error"] == "unknown_method"
    status = await client.assistant_threads_setStatus(
        channel_id="D1", thread_ts="1.2", status="thinking"
    )
    assert status["ok"]


async def test_streaming(api: FakeSlackApi, client: AsyncWebClient) -> None:
    parent = api.add_message("C1", user="U1", text="question")
    stream = await client.chat_stream(
        channel="C1",
        thread_ts=parent["ts"],
        recipient_team_id="T0001",
        recipient_user_id="U1",
        buffer_size=1,
    )
    await stream.append(markdown_text="hello ")
    await stream.append(markdown_text="world")
    blocks = [{"type": "context", "elements": [{"type": "mrkdwn", "text": "via kestrel"}]}]
    await stream.stop(blocks=blocks)
    assert [c.method for c in api.calls] == [
        "chat.startStream",
        "chat.appendStream",
        "chat.stopStream",
    ]
    assert stream.ts is not None
    stored = api.message("C1", stream.ts)
    assert stored is not None
    assert stored["text"] == "hello world"
    assert stored["streaming"] is False and stored["blocks"] == blocks
    assert stored["thread_ts"] == parent["ts"] and stored["recipient_user_id"] == "U1"
    # chunks arrive as JSON lists, not strings
    assert api.calls_to("chat.startStream")[0].args["chunks"] == [
        {"type": "markdown_text", "text": "hello "}
    ]
    with pytest.raises(SlackApiError) as late:
        await client.chat_appendStream(channel="C1", ts=stream.ts, markdown_text="more")
    assert late.value.response["error"] == "message_not_in_streaming_state"


async def test_refused_streaming(api: FakeSlackApi, client: AsyncWebClient) -> None:
    api.refuse("chat.startStream")
    stream = await client.chat_stream(channel="C1", thread_ts="1.1", buffer_size=1)
    for _ in range(2):
        with pytest.raises(SlackApiError) as refused:
            await stream.append(markdown_text="x")
        assert refused.value.response.status_code == 200
        assert refused.value.response["error"] == "not_allowed_token_type"
    assert api.messages == {}


async def test_blocks_over_slacks_limits_are_refused(
    api: FakeSlackApi, client: AsyncWebClient
) -> None:
    def section(text: str) -> dict[str, Any]:
        return {"type": "section", "text": {"type": "mrkdwn", "text": text}}

    button = {"type": "button", "action_id": "a", "text": {"type": "plain_text", "text": "b" * 76}}
    refused: list[tuple[dict[str, Any], str]] = [
        ({"blocks": [section("x")] * 51}, "invalid_blocks"),
        ({"blocks": [section("x" * 3001)]}, "invalid_blocks"),
        ({"blocks": [{"type": "actions", "elements": [button]}]}, "invalid_blocks"),
        ({"text": "x" * 40_001}, "msg_too_long"),
    ]
    for args, error in refused:
        with pytest.raises(SlackApiError) as caught:
            await client.chat_postMessage(channel="C1", **({"text": "t"} | args))
        assert caught.value.response["error"] == error
    assert api.messages == {}
    fits = [section("x" * 3000)] * 50
    posted = await client.chat_postMessage(channel="C1", text="t", blocks=fits)
    with pytest.raises(SlackApiError):
        await client.chat_update(
            channel="C1", ts=posted["ts"], text="t", blocks=[section("x")] * 51
        )


async def test_rate_limit_is_retried_by_the_sdk_handler(api: FakeSlackApi) -> None:
    api.fail("chat.postMessage", retry_after=0)
    retrying = AsyncWebClient(
        token=TOKEN,
        base_url=api.url,
        retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)],
    )
    posted = await retrying.chat_postMessage(channel="C1", text="hi")
    first, second = api.calls_to("chat.postMessage")
    assert (first.status, first.response) == (429, {"ok": False, "error": "ratelimited"})
    assert second.status == 200 and posted["ts"] == second.response["ts"]  # type: ignore[index]

    api.fail("chat.postMessage", retry_after=7)
    with pytest.raises(SlackApiError) as limited:
        await AsyncWebClient(token=TOKEN, base_url=api.url).chat_postMessage(channel="C1", text="x")
    assert limited.value.response.status_code == 429
    assert limited.value.response.headers["Retry-After"] == "7"


async def test_users_groups_views(api: FakeSlackApi, client: AsyncWebClient) -> None:
    api.users["U2"] = {"team_id": "T0002", "name": "guest", "profile": {"email": "g@x.org"}}
    guest = (await client.users_info(user="U2"))["user"]
    assert (guest["id"], guest["team_id"], guest["name"], guest["is_bot"]) == (
        "U2",
        "T0002",
        "guest",
        False,
    )
    assert guest["profile"]["email"] == "g@x.org"
    member = (await client.users_info(user="U9"))["user"]
    assert member["team_id"] == "T0001" and member["profile"]["display_name"] == "u9"

    api.usergroups["S1"] = ["U1", "U2"]
    assert (await client.usergroups_users_list(usergroup="S1"))["users"] == ["U1", "U2"]
    await client.usergroups_users_list(usergroup="S1")
    assert api.count("usergroups.users.list") == 2
    with pytest.raises(SlackApiError):
        await client.usergroups_users_list(usergroup="S404")

    view = {"type": "modal", "callback_id": "approve", "title": {"type": "plain_text", "text": "t"}}
    opened = await client.views_open(trigger_id="trig.1", view=view)
    view_id = opened["view"]["id"]
    assert view_id.startswith("V") and opened["view"]["callback_id"] == "approve"
    updated = await client.views_update(view_id=view_id, view={**view, "callback_id": "b"})
    assert updated["view"]["id"] == view_id and api.views[view_id]["callback_id"] == "b"
    home = {"type": "home", "blocks": []}
    first = await client.views_publish(user_id="U1", view=home)
    again = await client.views_publish(user_id="U1", view=home)
    assert first["view"]["id"] == again["view"]["id"]


async def test_delay_and_wait_for(api: FakeSlackApi, client: AsyncWebClient) -> None:
    api.delay("chat.postMessage", 0.3)
    task = asyncio.create_task(client.chat_postMessage(channel="C1", text="slow"))
    (pending,) = await api.wait_for("chat.postMessage", timeout=2)
    assert pending.status is None  # recorded on arrival, not answered yet
    await api.wait_for_answered("chat.postMessage", timeout=2)
    assert (await task)["ok"]

    def to_c9(call: Call) -> bool:
        return call.args.get("channel") == "C9"

    with pytest.raises(AssertionError, match=r"to_c9.*chat.postMessage"):
        await api.wait_for(to_c9, timeout=0.05)


# ------------------------------------------------------------------ HTTP app


@dataclass
class Seen:
    items: list[Any] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, item: Any) -> None:
        self.items.append(item)
        self.event.set()

    async def wait(self, timeout: float = 5.0) -> list[Any]:
        async with asyncio.timeout(timeout):
            await self.event.wait()
        return self.items


@pytest.fixture
async def http_app(api: FakeSlackApi) -> AsyncIterator[tuple[AsyncApp, str]]:
    app = AsyncApp(signing_secret=SECRET, client=AsyncWebClient(token=TOKEN, base_url=api.url))
    runner = web.AppRunner(app.web_app(path="/slack/events"), shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield app, f"http://127.0.0.1:{port}/slack/events"
    finally:
        await runner.cleanup()


async def test_http_app_mention_says_into_the_fake(
    api: FakeSlackApi, http_app: tuple[AsyncApp, str]
) -> None:
    app, url = http_app
    headers = Seen()

    @app.event("app_mention")
    async def on_mention(event: dict[str, Any], say: AsyncSay, request: AsyncBoltRequest) -> None:
        headers.add(request.headers)
        await say(text=f"hi <@{event['user']}>", thread_ts=event["ts"])

    sender = SlackSender(url, SECRET, api=api)
    mention = app_mention("U1", "hello there")
    assert mention["text"] == "<@UBOT> hello there"
    response = await sender.event(mention, retry_num=1)
    assert response.status == 200

    (post,) = await api.wait_for("chat.postMessage")
    # bolt's per-request client adds the workspace's team_id to every call (default_params)
    assert post.args == {
        "channel": "C0001",
        "text": "hi <@U1>",
        "thread_ts": mention["ts"],
        "team_id": "T0001",
    }
    assert api.count("auth.test") == 1
    (seen,) = await headers.wait()
    assert seen["x-slack-retry-num"] == ["1"] and seen["x-slack-retry-reason"] == ["http_timeout"]
    # the sender stored the user's message, so the thread reads like Slack's
    thread = api.thread("C0001", mention["ts"])
    assert [m["user"] for m in thread] == ["U1", "UBOT"]

    assert (await sender.bad_signature()).status == 401
    assert (await sender.stale()).status == 401
    assert (await sender.raw(b"{}", {"Content-Type": "application/json"}, sign=False)).status == 401
    verification = await sender.url_verification("abc")
    assert verification.status == 200 and verification.json == {"challenge": "abc"}


async def test_http_actions_commands_views(
    api: FakeSlackApi, http_app: tuple[AsyncApp, str]
) -> None:
    app, url = http_app
    clicks, submissions = Seen(), Seen()

    @app.action("approve")
    async def on_click(ack: AsyncAck, body: dict[str, Any], respond: AsyncRespond) -> None:
        await ack()
        clicks.add(body)
        await respond(text="approved", replace_original=False)

    @app.view("approve_modal")
    async def on_submit(ack: AsyncAck, view: dict[str, Any]) -> None:
        await ack()
        submissions.add(view)

    @app.command("/kestrel")
    async def on_command(ack: AsyncAck, command: dict[str, Any]) -> None:
        await ack(text=f"got {command['text']}")

    sender = SlackSender(url, SECRET, api=api)
    payload = block_actions(
        "U2", "approve", "run-1", channel="C1", message_ts="1700000000.000200", user_team="T0002"
    )
    assert (await sender.action(payload)).status == 200
    (body,) = await clicks.wait()
    assert body["user"]["team_id"] == "T0002" and body["actions"][0]["value"] == "run-1"
    (post,) = await api.wait_for("response_url")
    assert post.args["text"] == "approved" and post.path.startswith("/response_url/")

    values = {"reason": {"text": "because"}}
    submit = view_submission("U1", "approve_modal", '{"run": "r1"}', values)
    assert (await sender.action(submit)).status == 200
    (view,) = await submissions.wait()
    assert view["state"]["values"]["reason"]["text"]["value"] == "because"
    assert view["private_metadata"] == '{"run": "r1"}'

    answer = await sender.command(slash_command("U1", "status"))
    # ack(text=...) alone answers text/plain, not JSON
    assert answer.status == 200 and answer.text == "got status" and answer.json is None


# ------------------------------------------------------------------ Socket Mode


@contextlib.asynccontextmanager
async def socket_mode(app: AsyncApp) -> AsyncIterator[AsyncSocketModeHandler]:
    """The real aiohttp Socket Mode handler, connected (to ``app.client``'s base_url)."""
    handler = AsyncSocketModeHandler(app, app_token="xapp-test")
    await handler.connect_async()  # type: ignore[no-untyped-call]
    try:
        yield handler
    finally:
        await handler.close_async()  # type: ignore[no-untyped-call]


async def test_socket_mode_handler_gets_envelopes_and_acks(api: FakeSlackApi) -> None:
    app = AsyncApp(client=AsyncWebClient(token=TOKEN, base_url=api.url))
    mentions, commands = Seen(), Seen()

    @app.event("app_mention")
    async def on_mention(event: dict[str, Any], request: AsyncBoltRequest) -> None:
        mentions.add((event, request.headers))

    @app.event("message")
    async def on_message() -> None:
        pass

    @app.command("/kestrel")
    async def on_command(ack: AsyncAck, command: dict[str, Any]) -> None:
        await ack(text="ok")
        commands.add(command)

    @app.action("approve")
    async def on_click(ack: AsyncAck) -> None:
        await ack()

    async with socket_mode(app):
        await api.wait_for_socket()
        (opened,) = api.calls_to("apps.connections.open")
        assert opened.token == "xapp-test"

        mention = app_mention("U1", "over the socket")
        first = events_api_envelope(event_callback(mention))
        await api.socket_send(first)
        assert await api.wait_for_ack(first["envelope_id"]) == {"envelope_id": first["envelope_id"]}
        ((event, headers),) = await mentions.wait()
        assert event["text"] == "<@UBOT> over the socket"
        # bolt 1.30 mirrors retry_attempt/retry_reason even on a first delivery
        assert headers["x-slack-retry-num"] == ["0"] and headers["x-slack-retry-reason"] == [""]

        retry = events_api_envelope(
            event_callback(message("U1", "again")), retry_attempt=2, retry_reason="timeout"
        )
        await api.socket_send(retry)
        await api.wait_for_ack(retry["envelope_id"])

        command = slash_command_envelope(slash_command("U1", "status"))
        await api.socket_send(command)
        ack = await api.wait_for_ack(command["envelope_id"])
        assert ack["payload"] == {"text": "ok"}
        (got,) = await commands.wait()
        assert got["text"] == "status"

        click = interactive_envelope(
            block_actions("U1", "approve", "v", channel="C1", message_ts="1.2")
        )
        await api.socket_send(click)
        await api.wait_for_ack(click["envelope_id"])


def _methods(calls: Sequence[Call]) -> list[str]:
    return [c.method for c in calls]


async def test_socket_disconnect_reconnects(api: FakeSlackApi) -> None:
    app = AsyncApp(client=AsyncWebClient(token=TOKEN, base_url=api.url))
    async with socket_mode(app):
        await api.wait_for_socket()
        await api.socket_disconnect()
        await api.wait_for_socket(connections=2)
        assert _methods(api.calls).count("apps.connections.open") == 2
