"""The cost of a run's page: ``GET /runs/{id}`` for a run of 1,000 journal entries.

A SQLite store (written through the store's API) holding one finished run of about 1,000
journal entries: model turns of three calls each, every output a few lines with a redaction
placeholder and a ``<script>`` to escape, every third one long enough to collapse. The pages
are served as ``kestrel serve`` serves them (``adapters.web``, read through ``ChatService``,
aiohttp on localhost, the operators' bearer token). Timed, after a few uncounted requests:

* server time: ``load_run_page`` and ``render_run_page``, what the handler spends besides
  HTTP; and its parts apart: the reads through ``ChatService`` (the run's status, which folds
  its journal, the journal, the audit, the requests), the page's model (``build_run_page``)
  and the templates;
* the whole ``GET /runs/{id}`` over HTTP on localhost, client and server in one event loop;
* a live page's poll that finds nothing new (``/fragment?v=VERSION``: 204).

Target (issue): the page of a run of 1,000 journal entries rendered in under 100 ms.

    python -m bench.web [--entries N] [--requests N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web

from adapters.web.app import web_routes
from adapters.web.auth import WebConfig
from adapters.web.render import load_run_page, load_run_sources, render_run_page
from bot.chat import ChatService
from bot.domain import (
    AssistantTurn,
    Fingerprint,
    RunStatus,
    Session,
    StopReason,
    TerminalResult,
    ToolCall,
    ToolOutcome,
    utcnow,
)
from bot.journal.entries import (
    AssistantTurnEntry,
    Entry,
    RunEnded,
    RunStarted,
    ToolResultEntry,
    UserMessageEntry,
)
from bot.records import RunRecord
from bot.store import Store
from bot.supervisor import Supervisor
from tests.fakes.runtime import make_runtime

ENTRIES: Final = 1_000
REQUESTS: Final = 50
WARMUP: Final = 3
TARGET_MS: Final = 100.0
TOKEN: Final = "bench-token-0123456789"
RUN_ID: Final = "run_bench_page"
SESSION: Final = Session(
    id="slack:T0BENCH:C0BENCH:1700000000.000100",
    platform="slack",
    channel="C0BENCH",
    thread="1700000000.000100",
)
HOSTILE: Final = "<script>alert(1)</script>"


@dataclass(frozen=True)
class Figures:
    """What was measured, in ms: (p50, p99, max) by what was timed."""

    entries: int
    calls: int
    requests: int
    page_bytes: int
    timings: dict[str, tuple[float, float, float]]
    fill_s: float


def journal(entries: int) -> list[Entry]:
    """A finished run of about ``entries`` entries: turns of three calls and their results."""
    out: list[Entry] = [
        RunStarted(
            run_id=RUN_ID,
            session_id=SESSION.id,
            requested_by="U0BENCH",
            fingerprint=Fingerprint(
                provider="bench", model="bench", tools_digest="t", system_prompt_digest="s"
            ),
        ),
        UserMessageEntry(text="why is checkout slow?", by="U0BENCH"),
    ]
    turn = 0
    while len(out) < entries - 2:
        calls = tuple(
            ToolCall(id=f"c{turn}_{n}", name="tail_logs", arguments=f'{{"service": "s{n}"}}')
            for n in range(3)
        )
        out.append(
            AssistantTurnEntry(iteration=turn, turn=AssistantTurn(text=f"turn {turn}", calls=calls))
        )
        for n, call in enumerate(calls):
            lines = 20 if n == 2 else 2
            output = ("x" * 80 + "\n") * lines + f"<EMAIL_ADDRESS> {HOSTILE}"
            out.append(
                ToolResultEntry(
                    call_id=call.id, tool="tail_logs", outcome=ToolOutcome.OK, output=output
                )
            )
        turn += 1
    out.append(AssistantTurnEntry(iteration=turn, turn=AssistantTurn(text="done")))
    result = TerminalResult(
        status=RunStatus.COMPLETED, stop_reason=StopReason.ANSWERED, text="done"
    )
    out.append(RunEnded.of(result, "done"))
    return out


async def fill(chat_store: Store, entries: Sequence[Entry]) -> None:
    """The run and its journal, written as a run writes it (queued in order, then awaited)."""
    record = RunRecord(
        id=RUN_ID, session_id=SESSION.id, prompt="why is checkout slow?", requested_by="U0BENCH"
    )
    await chat_store.create_run(record, "bench", 30.0, SESSION)
    await asyncio.gather(
        *(chat_store.submit(RUN_ID, seq, 1, entry) for seq, entry in enumerate(entries))
    )


async def timed(action: Callable[[], Awaitable[Any]], times: int) -> list[float]:
    """``action``'s wall time in ms, ``times`` times, after ``WARMUP`` uncounted runs."""
    for _ in range(WARMUP):
        await action()
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        await action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


async def run(entries: int, requests: int) -> Figures:
    """Fill a fresh store, serve its pages on localhost, and time them."""
    with tempfile.TemporaryDirectory(prefix="kestrel-bench-web-") as tmp:
        rt, _ = await make_runtime(Path(tmp) / "kestrel.db", [])
        runner = None
        try:
            written = journal(entries)
            started = time.perf_counter()
            await fill(rt.store, written)
            fill_s = time.perf_counter() - started
            chat = ChatService(Supervisor(rt))
            if (await chat.status(RUN_ID)).record.status is not RunStatus.COMPLETED:
                raise RuntimeError("the bench's run did not end as completed")

            async def server_side() -> str:
                page = await load_run_page(chat, RUN_ID)
                return render_run_page(page, now=utcnow())

            async def read() -> None:
                await load_run_sources(chat, RUN_ID)

            sources = await load_run_sources(chat, RUN_ID)

            async def build() -> None:
                sources.page()

            page = sources.page()

            async def render() -> None:
                render_run_page(page, now=utcnow())

            html = await server_side()
            calls = html.count('<li class="call')
            if calls != 3 * ((len(written) - 4) // 4) or HOSTILE in html:
                raise RuntimeError(f"the page shows {calls} calls, or an unescaped script")
            version = sources.version

            runner = web.AppRunner(web_routes(chat, WebConfig(token=TOKEN)), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            url = f"http://127.0.0.1:{runner.addresses[0][1]}/runs/{RUN_ID}"
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with aiohttp.ClientSession(headers=headers) as http:

                async def get(target: str, status: int) -> None:
                    async with http.get(target) as response:
                        await response.read()
                        if response.status != status:
                            raise RuntimeError(f"GET {target}: {response.status}, not {status}")

                samples = {
                    "server": await timed(server_side, requests),
                    "read": await timed(read, requests),
                    "build": await timed(build, requests),
                    "render": await timed(render, requests),
                    "http": await timed(lambda: get(url, 200), requests),
                    "poll": await timed(lambda: get(f"{url}/fragment?v={version}", 204), requests),
                }
        finally:
            if runner is not None:
                await runner.cleanup()
            await rt.store.close()
    return Figures(
        entries=len(written),
        calls=calls,
        requests=requests,
        page_bytes=len(html.encode()),
        timings={
            name: (percentile(values, 50), percentile(values, 99), max(values))
            for name, values in samples.items()
        },
        fill_s=fill_s,
    )


def measure(entries: int = ENTRIES, requests: int = REQUESTS) -> Figures:
    """The figures of one fresh store."""
    return asyncio.run(run(entries, requests))


ROWS: Final = (
    ("server", "server time (load_run_page + render_run_page)", True),
    ("read", "  of which the reads (one journal load, audit, requests)", False),
    ("build", "  of which the page's model (build_run_page)", False),
    ("render", "  of which render_run_page (templates)", False),
    ("http", "GET /runs/{id} over HTTP on localhost", False),
    ("poll", "live poll, nothing new (/fragment?v=, 204)", False),
)


def report(entries: int = ENTRIES, requests: int = REQUESTS) -> None:
    """Print the page's server time, its parts, the HTTP round trip and an idle poll."""
    f = measure(entries, requests)
    print(
        f"Run page on SQLite: one finished run of {f.entries} journal entries, {f.calls} calls,"
        f" {f.page_bytes:,} bytes of HTML (python -m bench.web)"
    )
    print(f"  {f.requests} requests after {WARMUP} uncounted; target: under {TARGET_MS:.0f} ms")
    print(f"  {'':<56}{'p50':>10}{'p99':>10}{'max':>10}")
    for key, label, targeted in ROWS:
        p50, p99, most = f.timings[key]
        line = f"  {label:<56}{p50:>7.1f} ms{p99:>7.1f} ms{most:>7.1f} ms"
        if targeted:
            line += f"  p99 {'ok' if p99 <= TARGET_MS else 'over'}"
        print(line)
    print(f"  (writing the journal took {f.fill_s:.2f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description="The cost of a run's page.")
    parser.add_argument("--entries", type=int, default=ENTRIES)
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    options = parser.parse_args()
    if options.json:
        print(json.dumps(asdict(measure(options.entries, options.requests))))
    else:
        report(options.entries, options.requests)


if __name__ == "__main__":
    main()
