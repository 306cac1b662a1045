"""A rolling restart loses nothing: replicas of ``kestrel serve`` on PostgreSQL, restarted under
a stream of mentions, and everything counted at the end.

Three real ``kestrel serve PLATFORM`` processes share one PostgreSQL schema, behind one fake
platform (in this process) and an instant fake model. Mentions flow at a steady rate; half of
them ask for a gated command, whose approval click is made once the card is out. Every
``every`` seconds one replica gets SIGTERM and another SIGKILL, and both are restarted. Then,
once the store is settled, counted: each mention answered exactly once, each approved command
run once, each card posted once and updated once, no message posted twice; and the time from
each mention to its first visible feedback, whose p99 is what the restarts cost.

Each platform is played as it behaves:

* Slack (HTTP mode): each delivery and click goes to a random replica, as a load balancer
  sends it; a delivery that gets no 200 (the replica died, or refused the connection) is sent
  again to another replica as Slack's retry; a click that gets no 200 is clicked again (Slack
  never resends a click). First feedback: the status line or a stream.
* Discord: every replica is connected to one fake gateway, which sends every event to every
  session connected at that moment (a killed replica's session is gone, and Discord sends it
  nothing more; a restarted one identifies anew). A mention is answered by the replica that
  holds it first in the store; if that one dies, another replica's work taker takes it up once
  a lease old. A click goes to every session (or, with ``--interactions http``, to a random
  replica's ``/discord/interactions``, signed as Discord signs it, given 3 s to answer). First
  feedback: the thread's creation (the adapter's first act), typing, or a message.

Either way, a person whose card still asks a lease and 3 s after their click (the replica that
took it died before deciding, or Discord showed them the interaction failed) clicks again, as
a new interaction; how often that happened is reported.

    python -m bench.rolling [--platform slack|discord]... [--interactions gateway|http]
                            [--mentions 200] [--rate 8] [--every 4] [--lease 2]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

import aiohttp
import asyncpg
import yaml

from adapters.slack import ids
from bench.latency import percentile
from tests.fakes import discord_payloads as dp
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.discord_http import InteractionPoster
from tests.fakes.processes import KESTREL, ROOT
from tests.fakes.serving import free_port
from tests.fakes.slack_api import Call, FakeSlackApi
from tests.fakes.slack_client import SlackSender, app_mention, block_actions
from tests.fakes.slack_world import APPROVER, REQUESTER, SECRET, button_value, posted_ts

DEFAULT_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"
EXECUTIONS: Final = "executions.txt"  # a line per run of the gated command: its argument
FEEDBACK_METHODS: Final = ("assistant.threads.setStatus", "chat.startStream")
# The gated command: records its argument, then takes ``argv[3]`` seconds (a deploy's time,
# during which a replica's death leaves its outcome uncertain).
RECORD: Final = (
    "import sys, time; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n');"
    " time.sleep(float(sys.argv[3]))"
)
# A mention "deploy mNNN" asks for the gated command (its argument is the whole prompt);
# any other is answered at once.
SCRIPT: Final[list[Any]] = [
    {
        "one_of": [
            {
                "match": "^deploy m",
                "text": "Deploying.",
                "calls": [{"name": "deploy", "arguments": {"name": "$PROMPT"}}],
            },
            {"match": "(?P<said>.+)", "text": "Answered: {said}."},
        ]
    },
    {"text": "Deployed."},
]
DISCORD_REQUESTER: Final = "1001"
DISCORD_APPROVER: Final = "1002"


@dataclass
class Plan:
    """How hard to push: mentions, their rate, how often to restart, the lease."""

    mentions: int = 200
    replicas: int = 3
    rate: float = 8.0  # mentions per second
    every: float = 4.0  # seconds between restart rounds
    lease: float = 2.0
    seed: int = 7
    settle_timeout: float = 120.0
    interactions: str = "gateway"  # Discord's clicks: over the gateway, or "http"
    rounds: int = 0  # at least this many restart rounds before the end
    command_seconds: float = 0.0  # how long the gated command takes


@dataclass
class Mention:
    """One mention sent, and what came of it."""

    index: int
    text: str
    gated: bool
    key: str = ""  # the thread (Slack's ts, Discord's message id)
    sent_at: float = 0.0
    deliveries: int = 0
    clicks: int = 0
    # Retries on-call chose: each asks for approval again on a card of its own (the approval
    # was used up by the start whose outcome was lost), which the approver approves.
    retried: int = 0

    @property
    def answer(self) -> str:
        """What the fake model answers it (``SCRIPT``)."""
        return "Deployed." if self.gated else f"Answered: {self.text}."


@dataclass
class Tally:
    """What the platform shows at the end, and the latencies."""

    mentions: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    executions: Counter[str] = field(default_factory=Counter)
    # Per thread: its approval cards, less those a Retry asked again (``Mention.retried``).
    cards: Counter[str] = field(default_factory=Counter)
    card_updates: Counter[str] = field(default_factory=Counter)  # per card: bodies shown
    card_edits: int = 0  # chat.update calls on cards, repeats included
    duplicate_posts: int = 0
    feedback_ms: list[float] = field(default_factory=list)
    sigterms: int = 0
    sigkills: int = 0
    redelivered: int = 0  # Slack: deliveries sent again
    taken_over: int = 0  # Discord: mentions another replica's work taker took up
    reclicked: int = 0  # refused clicks and clicks whose card still asked
    undecided: int = 0  # clicks taken whose card still asked a lease + 3 s later
    # Cards of a command whose replica died after starting it and before recording its end:
    # on-call decided each as a person would (``on_call``).
    uncertain: int = 0
    problems: list[str] = field(default_factory=list)
    # Replica logs with a traceback (apscheduler logs a job it cancels at shutdown as one).
    tracebacks: list[str] = field(default_factory=list)

    def lines(self, plan: Plan, platform: str) -> list[str]:
        """The figures, as printed."""
        once = sum(1 for n in self.answers.values() if n == 1)
        ran = sum(1 for n in self.executions.values() if n == 1)
        updated = sum(1 for n in self.card_updates.values() if n == 1)
        gated = len(self.cards)
        asked = len(self.card_updates)
        feedback = sorted(self.feedback_ms)
        return [
            f"Rolling restarts, {platform}: {plan.replicas} `kestrel serve {platform}` on"
            f" PostgreSQL, {self.mentions} mentions at {plan.rate:g}/s, half gated;"
            f" every {plan.every:g} s one SIGTERM + one SIGKILL, both restarted"
            f" (lease_seconds={plan.lease:g})",
            f"  restarts: {self.sigterms} SIGTERM, {self.sigkills} SIGKILL;"
            f" {self._again(plan, platform)}",
            f"  uncertain effects on-call decided: {self.uncertain}",
            f"  answered exactly once:   {once}/{self.mentions}",
            f"  approved run once:       {ran}/{gated}",
            f"  cards updated once:      {updated}/{asked} ({self.card_edits} edits sent)",
            f"  duplicate posts:         {self.duplicate_posts}",
            f"  mention -> first feedback: p50 {percentile(feedback, 50):.0f} ms,"
            f" p99 {percentile(feedback, 99):.0f} ms, max {max(feedback, default=0):.0f} ms",
        ]

    def _again(self, plan: Plan, platform: str) -> str:
        if platform == "slack":
            return f"deliveries sent again: {self.redelivered}; clicks made again: {self.clicks()}"
        return (
            f"mentions taken up by another replica: {self.taken_over};"
            f" clicks ({plan.interactions}) made again: {self.clicks()}"
        )

    def clicks(self) -> str:
        return f"{self.reclicked} ({self.undecided} because the card still asked)"

    def lost_nothing(self) -> bool:
        """Whether every count is exact."""
        exact = all(n == 1 for n in self.answers.values()) and len(self.answers) == self.mentions
        exact = exact and all(n == 1 for n in self.executions.values())
        exact = exact and len(self.executions) == len(self.cards)
        exact = exact and all(n == 1 for n in self.cards.values())
        exact = exact and all(n == 1 for n in self.card_updates.values())
        return exact and self.duplicate_posts == 0 and not self.problems


# --- the replicas ------------------------------------------------------------------------


def write_config(
    folder: Path,
    model_url: str,
    database: str,
    lease: float,
    approver: str = APPROVER,
    command_seconds: float = 0.0,
) -> Path:
    """kestrel.yaml: one gated command that records its argument, the policy, the store."""
    executions = folder / EXECUTIONS
    deploy = {
        "name": "deploy",
        "description": "Deploy something",
        "command": [sys.executable, "-c", RECORD, str(executions), "{name}", f"{command_seconds}"],
        "parameters": {
            "type": "object",
            "properties": {"name": {"type": "string", "pattern": "^[a-z0-9 -]+$"}},
            "required": ["name"],
            "additionalProperties": False,
        },
        "confirm": True,
        "idempotent": False,
        "timeout": 10,
    }
    (folder / "catalog.yaml").write_text(yaml.safe_dump({"tools": [deploy]}))
    config = {
        "database": database,
        "model": {"provider": "openai", "name": "fake", "timeout": 10, "max_retries": 0},
        "openai_base_url": model_url,
        "openai_api_key": "sk-test",
        "tools": ["catalog.yaml"],
        "pii": {"mode": "off"},
        "policy": {"requesters": ["*"], "approvers": {"*": [approver]}, "oncall": [approver]},
        "replica": {"lease_seconds": lease, "poll_seconds": 0.2, "shutdown_grace_seconds": 5},
    }
    path = folder / "kestrel.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def free_ports(count: int) -> list[int]:
    """``count`` different ports nobody listens on right now (``free_port``'s)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


class Fleet:
    """The replicas: each on its own port, restarted in place; their stderr in files."""

    def __init__(self, folder: Path, env: dict[str, str], platform: str, count: int) -> None:
        self.folder = folder
        self.env = env
        self.platform = platform
        self.ports = free_ports(count)
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * count
        self.starts = 0

    def start(self, index: int) -> subprocess.Popen[bytes]:
        """Start replica ``index`` (again)."""
        self.starts += 1
        log = (self.folder / f"replica{index}.{self.starts}.log").open("wb")
        argv = [*KESTREL, "serve", self.platform, "--port", str(self.ports[index])]
        process = subprocess.Popen(
            argv, env=self.env, cwd=self.folder, stdout=subprocess.DEVNULL, stderr=log
        )
        log.close()
        self.processes[index] = process
        return process

    async def healthy(self, index: int, timeout: float = 60.0) -> None:
        """Until replica ``index`` answers ``/healthz``."""
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.ports[index]}/healthz"
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                process = self.processes[index]
                if process is not None and process.poll() is not None:
                    raise RuntimeError(f"replica {index} ended: {self.tail(index)}")
                try:
                    async with session.get(url) as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError(f"replica {index} never became healthy")

    def tail(self, index: int) -> str:
        """The end of replica ``index``'s newest log."""
        logs = sorted(self.folder.glob(f"replica{index}.*.log"), key=lambda p: p.stat().st_mtime)
        return logs[-1].read_text()[-2000:] if logs else ""

    def kill(self, index: int) -> None:
        """SIGKILL replica ``index`` and reap it."""
        process = self.processes[index]
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    async def terminate(self, index: int) -> int:
        """SIGTERM replica ``index``; its exit code."""
        process = self.processes[index]
        if process is None:
            return 0
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(process.wait, 30)
        except subprocess.TimeoutExpired:
            process.kill()
            return await asyncio.to_thread(process.wait)

    async def stop(self) -> list[int]:
        """SIGTERM every replica; their exit codes."""
        return list(await asyncio.gather(*(self.terminate(i) for i in range(len(self.ports)))))

    def tracebacks(self) -> list[str]:
        """Logs that hold a traceback (none may)."""
        return [p.name for p in self.folder.glob("replica*.log") if "Traceback" in p.read_text()]


async def roll(fleet: Fleet, plan: Plan, tally: Tally, done: asyncio.Event) -> None:
    """Every ``plan.every`` s: SIGTERM one replica, SIGKILL another, restart both."""
    rng = random.Random(plan.seed)
    while not done.is_set():
        try:
            await asyncio.wait_for(done.wait(), plan.every)
            return
        except TimeoutError:
            pass
        gentle, brutal = rng.sample(range(len(fleet.ports)), 2)
        fleet.kill(brutal)
        tally.sigkills += 1
        fleet.start(brutal)
        code = await fleet.terminate(gentle)
        tally.sigterms += 1
        if code != 0:
            tally.problems.append(f"a replica ended {code} on SIGTERM")
        fleet.start(gentle)
        await asyncio.gather(fleet.healthy(brutal), fleet.healthy(gentle))


# --- the store ---------------------------------------------------------------------------


@contextmanager
def scratch_schema(dsn: str) -> Iterator[str]:
    """A schema of this run alone, dropped afterwards."""
    name = f"rolling_{random.randrange(16**10):010x}"
    try:
        yield name
    finally:
        asyncio.run(_drop(dsn, name))


async def _drop(dsn: str, name: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    finally:
        await conn.close()


async def settled(dsn: str, schema: str) -> bool:
    """Nothing left to do: no work, no run going or waiting, no message waiting to be shown."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        work = await conn.fetchval("SELECT COUNT(*) FROM work WHERE done_at IS NULL")
        runs = await conn.fetchval("SELECT COUNT(*) FROM runs WHERE status <> 'completed'")
        due = await conn.fetchval("SELECT COUNT(*) FROM outbox WHERE version > delivered_version")
    finally:
        await conn.close()
    return bool(work == 0 and runs == 0 and due == 0)


async def until(
    check: Callable[[], Awaitable[bool] | bool], timeout: float, what: str, tally: Tally
) -> bool:
    """Poll ``check`` until true; after ``timeout``, a problem naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if not isinstance(value, bool):
            value = await value
        if value:
            return True
        await asyncio.sleep(0.1)
    tally.problems.append(f"not within {timeout:g} s: {what}")
    return False


async def stuck(dsn: str, schema: str) -> list[str]:
    """What the store holds undone: work, runs, messages (for a problem's report)."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        work = await conn.fetch(
            "SELECT id, kind, taken_by, payload FROM work WHERE done_at IS NULL"
        )
        runs = await conn.fetch(
            "SELECT id, status, stop_reason, owner, epoch, lease_expires,"
            " (SELECT string_agg(j.epoch || ':' || (j.body::json->>'kind'), ' ' ORDER BY j.seq)"
            "  FROM journal AS j WHERE j.run_id = runs.id) AS journal"
            " FROM runs WHERE status <> 'completed'"
        )
        due = await conn.fetch(
            "SELECT key, claimed_by, claim_expires, attempts, error FROM outbox"
            " WHERE version > delivered_version"
        )
    finally:
        await conn.close()
    return (
        [f"work {dict(r)}" for r in work]
        + [f"run {dict(r)}" for r in runs]
        + [f"outbox {dict(r)}" for r in due]
    )


# --- the platforms ---------------------------------------------------------------------


class Side(Protocol):
    """A platform as people and its servers use it: mentions, clicks, and what it shows."""

    approver: str

    def env(self) -> dict[str, str]:
        """The variables a replica needs to reach this platform."""
        ...

    def attach(self, fleet: Fleet) -> None:
        """Know where the replicas listen."""
        ...

    async def ready(self, replicas: int) -> None:
        """Until every replica is connected, where the platform connects them."""
        ...

    async def mention(self, mention: Mention, tally: Tally) -> None:
        """Send ``mention`` as the platform delivers it."""
        ...

    async def approve(self, mention: Mention, tally: Tally) -> None:
        """Once its card is out, approve it until the card shows the decision."""
        ...

    def approval_cards(self, mention: Mention) -> list[str]:
        """The approval cards shown in ``mention``'s thread, in order (an id each)."""
        ...

    async def approve_card(self, mention: Mention, card: str, tally: Tally) -> None:
        """Click the approval card's Approve until it shows the decision."""
        ...

    def effect_cards(self, mention: Mention) -> list[str]:
        """The uncertain-effect cards shown in ``mention``'s thread (an id each)."""
        ...

    async def settle_effect(self, mention: Mention, card: str, ran: bool, tally: Tally) -> None:
        """Click the effect card's Mark done (``ran``) or Retry until it shows the decision."""
        ...

    def answered(self, mention: Mention) -> bool:
        """Whether the answer to ``mention`` is shown."""
        ...

    def count(self, mentions: list[Mention], tally: Tally) -> None:
        """What the platform shows at the end, per thread."""
        ...


async def click_until_decided(
    click: Callable[[], Awaitable[bool]],
    decided: Callable[[float], Awaitable[bool]],
    lease: float,
    mention: Mention,
    tally: Tally,
) -> None:
    """Click until a click is taken (``click`` says True) and the card shows a decision: a
    person whose card still asks (a refusal, or a replica that died deciding) clicks again once
    a lease has passed."""
    while True:
        while not await click():
            mention.clicks += 1
            tally.reclicked += 1
            await asyncio.sleep(0.2)
        if await decided(lease + 3.0):
            return
        mention.clicks += 1
        tally.reclicked += 1
        tally.undecided += 1


async def polled(check: Callable[[], bool], within: float) -> bool:
    """Whether ``check`` comes true within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.1)
    return False


# --- Slack -------------------------------------------------------------------------------


class SlackSide:
    """Slack and its load balancer: deliveries and clicks to a random live replica."""

    approver = APPROVER

    def __init__(self, api: FakeSlackApi, rng: random.Random, lease: float) -> None:
        self.api = api
        self.lease = lease
        self.rng = rng
        self.senders: list[SlackSender] = []

    def env(self) -> dict[str, str]:
        return {
            "SLACK_BOT_TOKEN": "xoxb-test",
            "SLACK_SIGNING_SECRET": SECRET,
            "SLACK_API_URL": self.api.url,
        }

    def attach(self, fleet: Fleet) -> None:
        url = "http://127.0.0.1:{}/slack/events"
        self.senders = [
            SlackSender(url.format(port), SECRET, api=self.api, timeout=5.0) for port in fleet.ports
        ]

    async def ready(self, replicas: int) -> None:  # noqa: ARG002 (one side's signature)
        return  # HTTP mode: healthy is ready

    def sender(self) -> SlackSender:
        return self.rng.choice(self.senders)

    async def mention(self, mention: Mention, tally: Tally) -> None:
        """Deliver the mention until a replica says 200 (later tries are Slack's retries)."""
        event = app_mention(REQUESTER, f"<@{self.api.bot_user}> {mention.text}")
        mention.key = str(event["ts"])
        event_id = f"Ev{mention.index:06d}"
        mention.sent_at = time.monotonic()
        while not await self._ok(
            lambda s: s.event(event, event_id=event_id, retry_num=mention.deliveries or None)
        ):
            mention.deliveries += 1
            tally.redelivered += 1
            await asyncio.sleep(0.2)

    async def approve(self, mention: Mention, tally: Tally) -> None:
        """Once the card is out, click Approve until a replica says 200 and the card shows it."""
        thread = mention.key
        cards = await self.api.wait_for(lambda c: _card_in(c, thread), timeout=120)
        await self._click(cards[0], ids.APPROVE_ONCE, mention, tally)

    def approval_cards(self, mention: Mention) -> list[str]:
        posted = self.api.calls_to("chat.postMessage")
        return [posted_ts(self.api, c) for c in posted if _card_in(c, mention.key)]

    async def approve_card(self, mention: Mention, card: str, tally: Tally) -> None:
        await self._click(self._posted(card), ids.APPROVE_ONCE, mention, tally)

    def effect_cards(self, mention: Mention) -> list[str]:
        posted = self.api.calls_to("chat.postMessage")
        return [
            posted_ts(self.api, c)
            for c in posted
            if c.ok and _in(c, mention.key) and ids.EFFECT_DONE in _blocks(c)
        ]

    async def settle_effect(self, mention: Mention, card: str, ran: bool, tally: Tally) -> None:
        action = ids.EFFECT_DONE if ran else ids.EFFECT_RETRY
        await self._click(self._posted(card), action, mention, tally)

    def _posted(self, card: str) -> Call:
        """The post that showed ``card`` (its ts)."""
        (shown,) = [
            c
            for c in self.api.calls_to("chat.postMessage")
            if c.ok and posted_ts(self.api, c) == card
        ]
        return shown

    async def _click(self, card: Call, action: str, mention: Mention, tally: Tally) -> None:
        """Click the card's button ``action`` until a replica says 200 and the card shows it."""
        payload = block_actions(
            APPROVER,
            action,
            button_value(card, action),
            channel=card.args["channel"],
            message_ts=posted_ts(self.api, card),
            thread_ts=mention.key,
        )
        ts = payload["container"]["message_ts"]

        def updated() -> bool:
            return any(c.ok and c.args.get("ts") == ts for c in self.api.calls_to("chat.update"))

        await click_until_decided(
            lambda: self._ok(lambda s: s.action(payload)),
            lambda within: polled(updated, within),
            self.lease,
            mention,
            tally,
        )

    async def _ok(self, send: Callable[[SlackSender], Awaitable[Any]]) -> bool:
        try:
            response = await send(self.sender())
        except (aiohttp.ClientError, TimeoutError, ConnectionError):
            return False
        return bool(response.status == 200)

    def answered(self, mention: Mention) -> bool:
        return any(_in(c, mention.key) and ids.FEEDBACK in _blocks(c) for c in self.api.calls)

    def count(self, mentions: list[Mention], tally: Tally) -> None:
        """What Slack shows, per thread."""
        ok_posts = [c for c in self.api.calls_to("chat.postMessage") if c.ok]
        keys = Counter(json.dumps(c.args.get("metadata"), sort_keys=True) for c in ok_posts)
        tally.duplicate_posts = sum(n - 1 for k, n in keys.items() if k != "null" and n > 1)
        for mention in mentions:
            thread = mention.key
            answers = [c for c in ok_posts if _in(c, thread) and ids.FEEDBACK in _blocks(c)]
            tally.answers[thread] = len(answers)
            shown = [
                c.at
                for c in self.api.calls
                if c.method in FEEDBACK_METHODS and c.args.get("thread_ts") == thread
            ]
            feedback(mention, shown, tally)
            if not mention.gated:
                continue
            cards = [c for c in ok_posts if _card_in(c, thread)]
            tally.cards[thread] = len(cards) - mention.retried
            for card in cards:
                ts = posted_ts(self.api, card)
                updates = [
                    c for c in self.api.calls_to("chat.update") if c.ok and c.args.get("ts") == ts
                ]
                # An edit sent again (its replica died before recording it) shows the same, as
                # does one of a post found again (its replica died before recording the post):
                # only a change of what the card shows counts, and each body shown once.
                tally.card_updates[ts] = changes(_blocks(card), [_blocks(c) for c in updates])
                tally.card_edits += len(updates)


@asynccontextmanager
async def slack_side(plan: Plan) -> AsyncIterator[SlackSide]:
    """The fake Slack, played as Slack and a load balancer play it."""
    async with FakeSlackApi() as api:
        yield SlackSide(api, random.Random(plan.seed + 1), plan.lease)


def feedback(mention: Mention, shown: list[float], tally: Tally) -> None:
    """Note the time from ``mention`` to the first thing shown of it (``shown``: when)."""
    if shown:
        tally.feedback_ms.append((min(shown) - mention.sent_at) * 1000)
    else:
        tally.problems.append(f"no feedback in {mention.key}")


def changes(posted: str, edits: list[str]) -> int:
    """How many different bodies a message posted as ``posted`` was edited to show, in order:
    an edit to what it shows already changes nothing; one back to a body it showed before
    (a decided card shown open again) counts."""
    shown, changed = posted, set[str]()
    for body in edits:
        if body != shown:
            changed.add(body)
        shown = body
    return len(changed)


def _in(call: Call, thread: str) -> bool:
    return call.args.get("thread_ts") == thread


def _blocks(call: Call) -> str:
    return json.dumps(call.args.get("blocks") or [])


def _card_in(call: Call, thread: str) -> bool:
    return (
        call.method == "chat.postMessage"
        and bool(call.ok)
        and _in(call, thread)
        and ids.APPROVE_ONCE in _blocks(call)
    )


# --- Discord -----------------------------------------------------------------------------

APPROVE_ID: Final = "kestrel:approve:"
EFFECT_DONE_ID: Final = "kestrel:effect:done:"
EFFECT_RETRY_ID: Final = "kestrel:effect:retry:"
# Discord waits 3 s for an interaction's answer, then shows the person it failed.
INTERACTION_SECONDS: Final = 3.0


class DiscordSide:
    """Discord: every event to every session connected now; clicks over the gateway (to every
    session) or to a random replica's HTTP interactions endpoint."""

    approver = DISCORD_APPROVER

    def __init__(self, fake: FakeDiscord, rng: random.Random, plan: Plan) -> None:
        self.fake = fake
        self.rng = rng
        self.lease = plan.lease
        self.http = plan.interactions == "http"
        self.poster = InteractionPoster(fake)
        self.urls: list[str] = []
        self.clicks: list[str] = []  # the id of every interaction sent
        self.reached: list[int] = []  # how many sessions each mention reached

    def env(self) -> dict[str, str]:
        extra = {"DISCORD_TOKEN": "t0k3n", "DISCORD_API_URL": self.fake.api_url}
        if self.http:
            extra["DISCORD_PUBLIC_KEY"] = self.poster.public_key
        return extra

    def attach(self, fleet: Fleet) -> None:
        self.urls = [f"http://127.0.0.1:{port}/discord/interactions" for port in fleet.ports]

    async def ready(self, replicas: int) -> None:
        await self.fake.wait_until(
            lambda: self.fake.sessions_connected >= replicas, 60, "every replica connected"
        )

    async def mention(self, mention: Mention, tally: Tally) -> None:  # noqa: ARG002
        """The mention, to every session connected now (a dead replica's gets nothing)."""
        message = dp.message_create(
            author_id=DISCORD_REQUESTER, content=f"<@{dp.BOT_ID}> {mention.text}"
        )
        mention.key = str(message["id"])  # the thread started from it takes its id
        mention.sent_at = time.monotonic()
        self.reached.append(self.fake.sessions_connected)
        await self.fake.dispatch("MESSAGE_CREATE", message, 60, every=True)

    async def approve(self, mention: Mention, tally: Tally) -> None:
        """Once the card is out, click Approve (each click a new interaction) until the card
        shows the decision."""
        thread = mention.key

        def posted() -> list[Any]:
            return [c for c in self.fake.calls if _discord_card(c, thread)]

        if not await polled(lambda: bool(posted()), 120):
            tally.problems.append(f"no card in {thread}")
            return
        await self._click(thread, dict(posted()[0].response), APPROVE_ID, mention, tally)

    def approval_cards(self, mention: Mention) -> list[str]:
        thread = mention.key
        # A post sent again with its nonce returns the message the first made: one id each.
        shown = [str(c.response["id"]) for c in self.fake.calls if _discord_card(c, thread)]
        return list(dict.fromkeys(shown))

    async def approve_card(self, mention: Mention, card: str, tally: Tally) -> None:
        await self._click(mention.key, self._shown(mention, card), APPROVE_ID, mention, tally)

    def effect_cards(self, mention: Mention) -> list[str]:
        thread = mention.key
        return [
            str(c.response["id"])
            for c in self.fake.calls
            if _posted_in(c, thread) and EFFECT_DONE_ID in json.dumps(c.json)
        ]

    async def settle_effect(self, mention: Mention, card: str, ran: bool, tally: Tally) -> None:
        verb = EFFECT_DONE_ID if ran else EFFECT_RETRY_ID
        await self._click(mention.key, self._shown(mention, card), verb, mention, tally)

    def _shown(self, mention: Mention, card: str) -> dict[str, Any]:
        """The message ``card`` (its id) as its first post showed it."""
        return next(
            dict(c.response)
            for c in self.fake.calls
            if _posted_in(c, mention.key) and str(c.response["id"]) == card
        )

    async def _click(
        self, thread: str, card: dict[str, Any], prefix: str, mention: Mention, tally: Tally
    ) -> None:
        """Click the card's button whose custom id starts with ``prefix`` (each click a new
        interaction) until the card shows the decision."""
        custom_id = next(
            c["custom_id"]
            for row in card["components"]
            for c in row["components"]
            if str(c.get("custom_id", "")).startswith(prefix)
        )

        async def click() -> bool:
            where = copy.deepcopy(self.fake.channels[thread])
            payload = dp.interaction_button(
                channel=where, user_id=DISCORD_APPROVER, custom_id=custom_id, message=card
            )
            self.clicks.append(str(payload["id"]))
            if not self.http:
                await self.fake.dispatch("INTERACTION_CREATE", payload, 60, every=True)
                return True
            url = self.rng.choice(self.urls)
            try:
                status, _ = await asyncio.wait_for(
                    self.poster.post(url, payload), INTERACTION_SECONDS
                )
            except (aiohttp.ClientError, OSError, TimeoutError):
                return False
            return status == 200

        def decided() -> bool:
            shown = self.fake.message(thread, str(card["id"]))
            return shown is not None and custom_id not in json.dumps(shown["components"])

        await click_until_decided(
            click, lambda within: polled(decided, within), self.lease, mention, tally
        )

    def answered(self, mention: Mention) -> bool:
        return any(m["content"] == mention.answer for m in self.fake.bot_messages(mention.key))

    def count(self, mentions: list[Mention], tally: Tally) -> None:
        """What Discord shows, per thread: the bot's messages as stored, and the edits."""
        for mention in mentions:
            thread = mention.key
            shown = self.fake.bot_messages(thread)
            # A card asked again after a Retry (an approval; an effect cut once more) looks, once
            # decided, as the thread's first does (its title, no buttons), though it is another
            # request's: it is left out here, and an approval card posted twice shows in
            # ``Tally.cards``.
            again = {*self.approval_cards(mention)[1:], *self.effect_cards(mention)[1:]}
            looks = Counter(_look(m) for m in shown if m["id"] not in again)
            tally.duplicate_posts += sum(n - 1 for n in looks.values() if n > 1)
            tally.answers[thread] = sum(1 for m in shown if m["content"] == mention.answer)
            started = self.fake.calls_to("POST", rf"/channels/\d+/messages/{thread}/threads")
            if sum(1 for c in started if c.status == 201) != 1:
                tally.problems.append(f"thread {thread} started {len(started)} times")
            if self.fake.calls_to("GET", rf"/channels/\d+/messages/{thread}"):
                tally.taken_over += 1  # only a handling by another replica fetches it
            firsts = [c.at for c in started]
            firsts += [c.at for c in self.fake.calls_to("POST", rf"/channels/{thread}/.*")]
            feedback(mention, firsts, tally)
            self._unexpected(mention, shown, tally)
            if mention.gated:
                self._card(mention, shown, tally)
        for click in self.clicks:
            answers = self.fake.interactions.get(click, {}).get("responses", [])
            if len(answers) > 1:
                tally.problems.append(f"interaction {click} answered {len(answers)} times")

    def _card(self, mention: Mention, shown: list[dict[str, Any]], tally: Tally) -> None:
        thread = mention.key
        posted = {
            str(c.response["id"])
            for c in self.fake.calls_to("POST", rf"/channels/{thread}/messages")
            if _discord_card(c, thread)
        }
        # A post sent again with its nonce returns the message the first made: count what shows.
        cards = [m for m in shown if m["id"] in posted]
        tally.cards[thread] = len(cards) - mention.retried
        for card in cards:
            edits = [
                c
                for c in self.fake.calls_to("PATCH", rf"/channels/{thread}/messages/{card['id']}")
                if c.status == 200
            ]
            bodies = {json.dumps(c.json, sort_keys=True) for c in edits}
            tally.card_updates[card["id"]] = len(bodies)
            tally.card_edits += len(edits)

    def _unexpected(self, mention: Mention, shown: list[dict[str, Any]], tally: Tally) -> None:
        """Messages that are neither the card, the status line nor the answer."""
        for message in shown:
            content = str(message["content"])
            if message["embeds"] or content.startswith("Working…") or content == mention.answer:
                continue
            tally.problems.append(f"unexpected message in {mention.key}: {content[:80]!r}")


def _posted_in(call: Any, thread: str) -> bool:
    return bool(
        call.method == "POST" and call.path == f"/channels/{thread}/messages" and call.status == 200
    )


def _discord_card(call: Any, thread: str) -> bool:
    return _posted_in(call, thread) and APPROVE_ID in json.dumps(call.json)


def _look(message: dict[str, Any]) -> str:
    """What a message shows (its text, embed titles, component ids), as the transport's
    lookup compares it: two messages that look alike are one posted twice."""
    titles = [e.get("title", "") for e in message.get("embeds") or []]
    parts = [
        c.get("custom_id") or c.get("url")
        for row in message.get("components") or []
        for c in row.get("components") or []
    ]
    return json.dumps([message.get("content", ""), titles, parts])


@asynccontextmanager
async def discord_side(plan: Plan) -> AsyncIterator[DiscordSide]:
    """The fake Discord: its REST API and the gateway every replica connects to."""
    async with FakeDiscord() as fake:
        yield DiscordSide(fake, random.Random(plan.seed + 1), plan)


SIDES: Final[dict[str, Callable[[Plan], AbstractAsyncContextManager[Side]]]] = {
    "slack": slack_side,
    "discord": discord_side,
}


# --- a run -------------------------------------------------------------------------------


def serve_env(config: Path, **extra: str) -> dict[str, str]:
    """This environment minus Kestrel's, Slack's and Discord's variables, plus the run's."""
    import os

    prefixes = ("KESTREL_", "SLACK_", "DISCORD_", "OPENAI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(KESTREL_CONFIG=str(config), PYTHONPATH=str(ROOT), **extra)
    return env


async def flow(plan: Plan, send: Callable[[Mention], Coroutine[Any, Any, None]]) -> list[Mention]:
    """Send ``plan.mentions`` mentions at ``plan.rate``, each handled by ``send``."""
    mentions = [
        Mention(i, f"deploy m{i:03d}" if i % 2 == 0 else f"check m{i:03d}", i % 2 == 0)
        for i in range(plan.mentions)
    ]
    tasks: list[asyncio.Future[None]] = []
    for mention in mentions:
        tasks.append(asyncio.ensure_future(send(mention)))
        await asyncio.sleep(1 / plan.rate)
    await asyncio.gather(*tasks)
    return mentions


async def on_call(side: Side, mentions: list[Mention], executions: Path, tally: Tally) -> None:
    """On-call, until cancelled: the card of an uncertain effect (its replica died between
    starting the command and recording its end, and Kestrel will not run it again unasked) is
    decided as a person would, by what the command itself left: Mark done if it ran, else
    Retry. A retry asks for approval again, on a new card, which the approver approves as they
    did the first."""
    seen: set[str] = set()
    settling: list[asyncio.Task[None]] = []
    try:
        while True:
            ran = executed(executions)
            for mention in mentions:
                for card in side.effect_cards(mention):
                    if card not in seen:
                        seen.add(card)
                        tally.uncertain += 1
                        done = mention.text in ran
                        if not done:
                            mention.retried += 1
                        settle = side.settle_effect(mention, card, done, tally)
                        settling.append(asyncio.create_task(settle))
                # The first is the one ``Side.approve`` clicked.
                for card in side.approval_cards(mention)[1:]:
                    if card not in seen:
                        seen.add(card)
                        again = side.approve_card(mention, card, tally)
                        settling.append(asyncio.create_task(again))
            await asyncio.sleep(0.2)
    finally:
        for task in settling:
            task.cancel()


def executed(executions: Path) -> Counter[str]:
    """How many times the gated command ran with each argument (``EXECUTIONS``)."""
    return Counter(executions.read_text().splitlines() if executions.exists() else [])


async def run(platform: str, plan: Plan, dsn: str, folder: Path, schema: str) -> Tally:
    """One run on ``platform`` ("slack" or "discord"); its tally."""
    from tests.fakes.openai_server import FakeOpenAI

    tally = Tally(mentions=plan.mentions)
    async with FakeOpenAI(SCRIPT) as model, SIDES[platform](plan) as side:
        database = f"{dsn}?schema={schema}"
        config = write_config(
            folder, model.base_url, database, plan.lease, side.approver, plan.command_seconds
        )
        fleet = Fleet(folder, serve_env(config, **side.env()), platform, plan.replicas)
        side.attach(fleet)
        try:
            for index in range(plan.replicas):
                fleet.start(index)
            await asyncio.gather(*(fleet.healthy(i) for i in range(plan.replicas)))
            await side.ready(plan.replicas)

            async def send(mention: Mention) -> None:
                await side.mention(mention, tally)
                if mention.gated:
                    await side.approve(mention, tally)

            done = asyncio.Event()
            rolling = asyncio.create_task(roll(fleet, plan, tally, done))
            mentions = await flow(plan, send)
            oncall = asyncio.create_task(on_call(side, mentions, folder / EXECUTIONS, tally))
            answered = await until(
                lambda: all(side.answered(m) for m in mentions),
                plan.settle_timeout,
                "every mention answered",
                tally,
            )
            oncall.cancel()
            await until(lambda: tally.sigkills >= plan.rounds, 60, "the restart rounds", tally)
            done.set()
            await rolling
            if not answered or not await until(
                lambda: settled(dsn, schema), 30, "the store settled", tally
            ):
                tally.problems += await stuck(dsn, schema)
        finally:
            codes = await fleet.stop()
        side.count(mentions, tally)
    tally.executions = executed(folder / EXECUTIONS)
    if any(codes):
        tally.problems.append(f"exit codes at the end: {codes}")
    tally.tracebacks = fleet.tracebacks()
    return tally


def measure(platform: str, plan: Plan, dsn: str, keep: Path | None = None) -> Tally:
    """One run on a scratch schema and folder (with ``keep``: in that folder, and the schema
    left in place, both named, to look into)."""
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        schema = f"rolling_{random.randrange(16**10):010x}"
        print(f"  replicas' logs in {keep}, the store in schema {schema}")
        return asyncio.run(run(platform, plan, dsn, keep, schema))
    with tempfile.TemporaryDirectory(prefix="kr_") as folder, scratch_schema(dsn) as schema:
        return asyncio.run(run(platform, plan, dsn, Path(folder), schema))


def report(
    platforms: tuple[str, ...] = ("slack",), plan: Plan | None = None, keep: Path | None = None
) -> None:
    """Print the figures of each platform."""
    import os

    dsn = os.environ.get("KESTREL_BENCH_POSTGRES_DSN", DEFAULT_DSN)
    for platform in platforms:
        chosen = plan or Plan()
        tally = measure(platform, chosen, dsn, keep and keep / platform)
        for line in tally.lines(chosen, platform):
            print(line)
        print(f"  nothing lost: {'yes' if tally.lost_nothing() else 'NO'}")
        if tally.tracebacks:
            print(f"  replica logs with a traceback: {len(tally.tracebacks)}")
        for problem in tally.problems[:40]:
            print(f"  problem: {problem}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--platform", choices=tuple(SIDES), action="append")
    parser.add_argument("--interactions", choices=("gateway", "http"), default="gateway")
    parser.add_argument("--mentions", type=int, default=Plan.mentions)
    parser.add_argument("--rate", type=float, default=Plan.rate)
    parser.add_argument("--every", type=float, default=Plan.every)
    parser.add_argument("--lease", type=float, default=Plan.lease)
    parser.add_argument("--seed", type=int, default=Plan.seed)
    parser.add_argument("--command-seconds", type=float, default=Plan.command_seconds)
    parser.add_argument("--keep", type=Path, help="keep the logs here, and the schema")
    args = parser.parse_args()
    report(
        tuple(args.platform or ("slack",)),
        Plan(
            mentions=args.mentions,
            rate=args.rate,
            every=args.every,
            lease=args.lease,
            seed=args.seed,
            interactions=args.interactions,
            command_seconds=args.command_seconds,
        ),
        args.keep,
    )
