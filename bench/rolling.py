"""A rolling restart loses nothing: replicas of ``kestrel serve`` on PostgreSQL, restarted under
a stream of mentions, and everything counted at the end.

Three real ``kestrel serve slack`` processes (HTTP mode) share one PostgreSQL schema, behind one
fake Slack (in this process) and an instant fake model. Mentions flow at a steady rate; half of
them ask for a gated command, whose approval click goes to a random replica once the card is
out. Slack's side is played as Slack plays it: a delivery that gets no 200 (the replica died,
or refused the connection) is sent again to another replica as a retry; a click that gets no
200 is clicked again (Slack never resends a click). Every ``every`` seconds one replica gets
SIGTERM and another SIGKILL, and both are restarted. Then, once the store is settled, counted:
each mention answered exactly once, each approved command run once, each card posted once and
updated once, no message posted twice; and the time from each mention to its first visible
feedback (Slack's status line or a stream), whose p99 is what the restarts cost.

Discord's run is not written yet (``tests/adapters/discord/test_replicas.py`` covers two
connected replicas and the HTTP interactions endpoint, without restarts).

    python -m bench.rolling [--mentions 200] [--rate 8] [--every 4] [--lease 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import asyncpg
import yaml

from adapters.slack import ids
from bench.latency import percentile
from tests.fakes.processes import KESTREL, ROOT
from tests.fakes.slack_api import Call, FakeSlackApi
from tests.fakes.slack_client import SlackSender, app_mention, block_actions
from tests.fakes.slack_world import APPROVER, REQUESTER, SECRET, button_value, posted_ts

DEFAULT_DSN: Final = "postgresql://postgres@127.0.0.1:5432/test"
FEEDBACK_METHODS: Final = ("assistant.threads.setStatus", "chat.startStream")
RECORD: Final = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
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


@dataclass
class Tally:
    """What the platform shows at the end, and the latencies."""

    mentions: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    executions: Counter[str] = field(default_factory=Counter)
    cards: Counter[str] = field(default_factory=Counter)
    card_updates: Counter[str] = field(default_factory=Counter)  # distinct bodies shown
    card_edits: int = 0  # chat.update calls on cards, repeats included
    duplicate_posts: int = 0
    feedback_ms: list[float] = field(default_factory=list)
    sigterms: int = 0
    sigkills: int = 0
    redelivered: int = 0
    reclicked: int = 0
    problems: list[str] = field(default_factory=list)
    # Replica logs with a traceback (apscheduler logs a job it cancels at shutdown as one).
    tracebacks: list[str] = field(default_factory=list)

    def lines(self, plan: Plan, platform: str) -> list[str]:
        """The figures, as printed."""
        once = sum(1 for n in self.answers.values() if n == 1)
        ran = sum(1 for n in self.executions.values() if n == 1)
        updated = sum(1 for n in self.card_updates.values() if n == 1)
        gated = len(self.cards)
        feedback = sorted(self.feedback_ms)
        return [
            f"Rolling restarts, {platform}: {plan.replicas} `kestrel serve {platform}` on"
            f" PostgreSQL, {self.mentions} mentions at {plan.rate:g}/s, half gated;"
            f" every {plan.every:g} s one SIGTERM + one SIGKILL, both restarted"
            f" (lease_seconds={plan.lease:g})",
            f"  restarts: {self.sigterms} SIGTERM, {self.sigkills} SIGKILL;"
            f" deliveries sent again: {self.redelivered}; clicks made again: {self.reclicked}",
            f"  answered exactly once:   {once}/{self.mentions}",
            f"  approved run once:       {ran}/{gated}",
            f"  cards updated once:      {updated}/{gated} ({self.card_edits} edits sent)",
            f"  duplicate posts:         {self.duplicate_posts}",
            f"  mention -> first feedback: p50 {percentile(feedback, 50):.0f} ms,"
            f" p99 {percentile(feedback, 99):.0f} ms, max {max(feedback, default=0):.0f} ms",
        ]

    def lost_nothing(self) -> bool:
        """Whether every count is exact."""
        exact = all(n == 1 for n in self.answers.values()) and len(self.answers) == self.mentions
        exact = exact and all(n == 1 for n in self.executions.values())
        exact = exact and len(self.executions) == len(self.cards)
        exact = exact and all(n == 1 for n in self.cards.values())
        exact = exact and all(n == 1 for n in self.card_updates.values())
        return exact and self.duplicate_posts == 0 and not self.problems


# --- the replicas ------------------------------------------------------------------------


def write_config(folder: Path, model_url: str, database: str, lease: float) -> Path:
    """kestrel.yaml: one gated command that records its argument, the policy, the store."""
    executions = folder / "executions.txt"
    deploy = {
        "name": "deploy",
        "description": "Deploy something",
        "command": [sys.executable, "-c", RECORD, str(executions), "{name}"],
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
        "policy": {"requesters": ["*"], "approvers": {"*": [APPROVER]}},
        "replica": {"lease_seconds": lease, "poll_seconds": 0.2, "shutdown_grace_seconds": 5},
    }
    path = folder / "kestrel.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def free_ports(count: int) -> list[int]:
    """``count`` ports nobody listens on right now."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [int(sock.getsockname()[1]) for sock in sockets]
    for sock in sockets:
        sock.close()
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
        runs = await conn.fetch("SELECT id, status, owner FROM runs WHERE status <> 'completed'")
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


# --- Slack -------------------------------------------------------------------------------


class SlackSide:
    """Slack and its load balancer: deliveries and clicks to a random live replica."""

    def __init__(self, api: FakeSlackApi, fleet: Fleet, rng: random.Random, lease: float) -> None:
        self.api = api
        self.lease = lease
        self.fleet = fleet
        self.rng = rng
        url = "http://127.0.0.1:{}/slack/events"
        self.senders = [
            SlackSender(url.format(port), SECRET, api=api, timeout=5.0) for port in fleet.ports
        ]

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
        """Once the card is out, click Approve until a replica says 200."""
        thread = mention.key
        cards = await self.api.wait_for(lambda c: _card_in(c, thread), timeout=120)
        card = cards[0]
        value = button_value(card, ids.APPROVE_ONCE)
        payload = block_actions(
            APPROVER,
            ids.APPROVE_ONCE,
            value,
            channel=card.args["channel"],
            message_ts=posted_ts(self.api, card),
            thread_ts=thread,
        )
        ts = payload["container"]["message_ts"]
        while True:
            while not await self._ok(lambda s: s.action(payload)):
                mention.clicks += 1
                tally.reclicked += 1
                await asyncio.sleep(0.2)
            # A person whose card still asks (a refusal, or a replica that died deciding)
            # clicks again once a lease has passed.
            if await self._updated(ts, self.lease + 3.0):
                return
            mention.clicks += 1
            tally.reclicked += 1

    async def _updated(self, ts: str, within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if any(c.ok and c.args.get("ts") == ts for c in self.api.calls_to("chat.update")):
                return True
            await asyncio.sleep(0.1)
        return False

    async def _ok(self, send: Callable[[SlackSender], Awaitable[Any]]) -> bool:
        try:
            response = await send(self.sender())
        except (aiohttp.ClientError, TimeoutError, ConnectionError):
            return False
        return bool(response.status == 200)

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
            if shown:
                tally.feedback_ms.append((min(shown) - mention.sent_at) * 1000)
            else:
                tally.problems.append(f"no feedback in {thread}")
            if not mention.gated:
                continue
            cards = [c for c in ok_posts if _card_in(c, thread)]
            tally.cards[thread] = len(cards)
            if cards:
                ts = posted_ts(self.api, cards[0])
                updates = [
                    c for c in self.api.calls_to("chat.update") if c.ok and c.args.get("ts") == ts
                ]
                # An edit sent again (its replica died before recording it) shows the same.
                tally.card_updates[thread] = len({_blocks(c) for c in updates})
                tally.card_edits += len(updates)


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


# --- a run -------------------------------------------------------------------------------


def serve_env(config: Path, **extra: str) -> dict[str, str]:
    """This environment minus Kestrel's, Slack's and Discord's variables, plus the run's."""
    import os

    prefixes = ("KESTREL_", "SLACK_", "DISCORD_", "OPENAI_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.update(KESTREL_CONFIG=str(config), PYTHONPATH=str(ROOT), **extra)
    return env


async def flow(plan: Plan, send: Callable[[Mention], Awaitable[None]]) -> list[Mention]:
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


async def run_slack(plan: Plan, dsn: str, folder: Path, schema: str) -> Tally:
    """The Slack run; its tally."""
    from tests.fakes.openai_server import FakeOpenAI

    tally = Tally(mentions=plan.mentions)
    async with FakeOpenAI(SCRIPT) as model, FakeSlackApi() as api:
        config = write_config(folder, model.base_url, f"{dsn}?schema={schema}", plan.lease)
        env = serve_env(
            config, SLACK_BOT_TOKEN="xoxb-test", SLACK_SIGNING_SECRET=SECRET, SLACK_API_URL=api.url
        )
        fleet = Fleet(folder, env, "slack", plan.replicas)
        side = SlackSide(api, fleet, random.Random(plan.seed + 1), plan.lease)
        try:
            for index in range(plan.replicas):
                fleet.start(index)
            await asyncio.gather(*(fleet.healthy(i) for i in range(plan.replicas)))

            async def send(mention: Mention) -> None:
                await side.mention(mention, tally)
                if mention.gated:
                    await side.approve(mention, tally)

            done = asyncio.Event()
            rolling = asyncio.create_task(roll(fleet, plan, tally, done))
            mentions = await flow(plan, send)
            answered = await until(
                lambda: all(
                    any(_in(c, m.key) and ids.FEEDBACK in _blocks(c) for c in api.calls)
                    for m in mentions
                ),
                plan.settle_timeout,
                "every mention answered",
                tally,
            )
            done.set()
            await rolling
            if not answered or not await until(
                lambda: settled(dsn, schema), 30, "the store settled", tally
            ):
                tally.problems += await stuck(dsn, schema)
        finally:
            codes = await fleet.stop()
        side.count(mentions, tally)
        tally.executions = Counter((folder / "executions.txt").read_text().splitlines())
        if any(codes):
            tally.problems.append(f"exit codes at the end: {codes}")
        tally.tracebacks = fleet.tracebacks()
    return tally


def measure(platform: str, plan: Plan, dsn: str) -> Tally:
    """One run on a scratch schema and folder."""
    with tempfile.TemporaryDirectory(prefix="kr_") as folder, scratch_schema(dsn) as schema:
        return asyncio.run(run_slack(plan, dsn, Path(folder), schema))


def report(platforms: tuple[str, ...] = ("slack",), plan: Plan | None = None) -> None:
    """Print the figures of each platform."""
    import os

    dsn = os.environ.get("KESTREL_BENCH_POSTGRES_DSN", DEFAULT_DSN)
    for platform in platforms:
        chosen = plan or Plan()
        tally = measure(platform, chosen, dsn)
        for line in tally.lines(chosen, platform):
            print(line)
        print(f"  nothing lost: {'yes' if tally.lost_nothing() else 'NO'}")
        if tally.tracebacks:
            print(f"  replica logs with a traceback: {len(tally.tracebacks)}")
        for problem in tally.problems[:40]:
            print(f"  problem: {problem}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--platform", choices=("slack",), action="append")
    parser.add_argument("--mentions", type=int, default=Plan.mentions)
    parser.add_argument("--rate", type=float, default=Plan.rate)
    parser.add_argument("--every", type=float, default=Plan.every)
    parser.add_argument("--lease", type=float, default=Plan.lease)
    args = parser.parse_args()
    report(
        tuple(args.platform or ("slack",)),
        Plan(mentions=args.mentions, rate=args.rate, every=args.every, lease=args.lease),
    )
