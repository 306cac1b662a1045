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

Then a run of 100,000 entries (``--long N``), written in bulk (one ``create_run`` with its
journal), served in a fresh process as ``kestrel serve`` serves it, and measured there:

* server time of its page (the newest page of the timeline) and of a live poll that finds
  nothing new, p50 and p99, the first page after the process starts apart (target 200 ms:
  a finished run's header comes from its end, not from adding up its whole journal);
* the RSS the serving process grew by, at its peak, while pages and polls are fetched;
* the event loop's longest block meanwhile: a probe that sleeps 5 ms and measures how late it
  wakes up (what ``/healthz``, Slack and Discord would wait);
* ``kestrel runs export --html`` of the run (``write_export`` to a file): its time and the
  peak RSS its process grew by.

Targets (issue 20): a page in at most 200 ms of server time, RSS growth at most 50 MiB, the
loop never blocked over 50 ms; the same for the export (bounded memory).

    python -m bench.web [--entries N] [--requests N] [--long N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import subprocess
import sys
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
from adapters.web.export import write_export
from adapters.web.render import load_run_page, load_run_sources, render_run_page
from bot.chat.service import ChatService
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
from bot.run.supervisor import Supervisor
from bot.store import Store
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
    result = TerminalResult(  # as the loop ends it: the outcomes of every call
        status=RunStatus.COMPLETED,
        stop_reason=StopReason.ANSWERED,
        text="done",
        outcomes={"ok": 3 * turn},
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
            if not calls or HOSTILE in html:
                raise RuntimeError(f"the page shows {calls} calls, or an unescaped script")
            version = page.version

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
    ("server", "server time (load_run_page + render_run_page, newest page)", True),
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
    parser.add_argument("--long", type=int, default=LONG_ENTRIES, help="0: skip the long run.")
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    options = parser.parse_args()
    if options.json:
        figures: dict[str, Any] = {"page": asdict(measure(options.entries, options.requests))}
        if options.long:
            figures["long"] = asdict(measure_long(options.long, options.requests))
        print(json.dumps(figures))
        return
    report(options.entries, options.requests)
    if options.long:
        report_long(options.long, options.requests)


# -- a run of 100,000 entries ----------------------------------------------------------------

LONG_ENTRIES: Final = 100_000
LONG_TARGET_MS: Final = 200.0
RSS_TARGET_MIB: Final = 50.0
BLOCK_TARGET_MS: Final = 50.0
PROBE_S: Final = 0.005


@dataclass(frozen=True)
class LongFigures:
    """What was measured on the long run: ms as (p50, p99, max); RSS growth in MiB."""

    entries: int
    fill_s: float
    first_page_ms: float
    timings: dict[str, tuple[float, float, float]]
    page_bytes: int
    rss_growth_mib: float
    longest_block_ms: float
    export_s: float
    export_bytes: int
    export_rss_growth_mib: float


def _rss_kib(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process, in KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    """Start the peak RSS (``VmHWM``) afresh from the current RSS (Linux)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


class LoopProbe:
    """How late a task sleeping PROBE_S wakes: the loop's longest block while it runs."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._probe())

    async def stop(self) -> float:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return self.longest * 1000

    async def _probe(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(PROBE_S)
            self.longest = max(self.longest, time.perf_counter() - started - PROBE_S)


async def _fill_long(db: Path, entries: int) -> float:
    """The long run written in bulk: its row and journal in one transaction."""
    rt, _ = await make_runtime(db, [])
    try:
        written = journal(entries)
        record = RunRecord(
            id=RUN_ID, session_id=SESSION.id, prompt="why is checkout slow?", requested_by="U0B"
        )
        started = time.perf_counter()
        await rt.store.create_run(record, "bench", 30.0, SESSION, written)
        return time.perf_counter() - started
    finally:
        await rt.store.close()


async def _serve_long(db: Path, requests: int, entries: int) -> dict[str, Any]:
    """In a fresh process: serve the pages over ``db``, fetch them, measure."""
    rt, _ = await make_runtime(db, [])
    chat = ChatService(Supervisor(rt))
    app = web_routes(chat, WebConfig(token=TOKEN))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/runs/{RUN_ID}"
    gc.freeze()  # as ``kestrel serve`` does once started
    probe = LoopProbe()
    try:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:

            async def get(target: str, status: int) -> str:
                async with http.get(target) as response:
                    body = await response.text()
                    if response.status != status:
                        raise RuntimeError(f"GET {target}: {response.status}, not {status}")
                    return body

            baseline = _rss_kib("VmRSS")
            _reset_peak()
            probe.start()
            started = time.perf_counter()
            html = await get(url, 200)
            first = (time.perf_counter() - started) * 1000
            version = html.split('data-version="', 1)[1].split('"', 1)[0]
            samples = {
                "page": await timed(lambda: get(url, 200), requests),
                "older": await timed(lambda: get(f"{url}?before={entries // 2}", 200), 10),
                "poll": await timed(lambda: get(f"{url}/fragment?v={version}", 204), requests),
            }
            longest = await probe.stop()
            grown = (_rss_kib("VmHWM") - baseline) / 1024
    finally:
        await runner.cleanup()
        await rt.store.close()
    return {
        "first": first,
        "samples": samples,
        "page_bytes": len(html.encode()),
        "rss": grown,
        "longest": longest,
    }


async def _export_long(db: Path) -> dict[str, Any]:
    """In a fresh process: ``runs export --html`` of the long run, timed, its peak RSS."""
    rt, _ = await make_runtime(db, [])
    chat = ChatService(Supervisor(rt))
    out = db.with_name("export.html")
    try:
        baseline = _rss_kib("VmRSS")
        _reset_peak()
        started = time.perf_counter()
        with out.open("w", encoding="utf-8") as file:
            await write_export(chat, RUN_ID, file.write)
        took = time.perf_counter() - started
        grown = (_rss_kib("VmHWM") - baseline) / 1024
    finally:
        await rt.store.close()
    calls = out.read_text(encoding="utf-8").count('<li class="call')
    return {"s": took, "bytes": out.stat().st_size, "rss": grown, "calls": calls}


def _in_process(target: str, db: Path, *args: int) -> dict[str, Any]:
    """``target`` (``_serve_long`` or ``_export_long``) in a fresh interpreter."""
    code = (
        "import asyncio, json, sys; from pathlib import Path; import bench.web as b;"
        f" print(json.dumps(asyncio.run(b.{target}(Path(sys.argv[1]), *map(int, sys.argv[2:])))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(db), *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{target} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure_long(entries: int = LONG_ENTRIES, requests: int = REQUESTS) -> LongFigures:
    """The long run's figures: written here, served and exported in fresh processes."""
    with tempfile.TemporaryDirectory(prefix="kestrel-bench-web-long-") as tmp:
        db = Path(tmp) / "kestrel.db"
        fill_s = asyncio.run(_fill_long(db, entries))
        served = _in_process("_serve_long", db, requests, entries)
        exported = _in_process("_export_long", db)
    if exported["calls"] != 3 * ((entries - 4) // 4):
        raise RuntimeError(f"the export shows {exported['calls']} calls")
    return LongFigures(
        entries=entries,
        fill_s=fill_s,
        first_page_ms=served["first"],
        timings={
            name: (percentile(values, 50), percentile(values, 99), max(values))
            for name, values in served["samples"].items()
        },
        page_bytes=served["page_bytes"],
        rss_growth_mib=served["rss"],
        longest_block_ms=served["longest"],
        export_s=exported["s"],
        export_bytes=exported["bytes"],
        export_rss_growth_mib=exported["rss"],
    )


LONG_ROWS: Final = (
    ("page", "GET /runs/{id}, the newest page (HTTP on localhost)"),
    ("older", "GET /runs/{id}?before=N, an older page (10 requests)"),
    ("poll", "live poll, nothing new (/fragment?v=, 204)"),
)


def report_long(entries: int = LONG_ENTRIES, requests: int = REQUESTS) -> None:
    """Print the long run's figures against the targets."""
    f = measure_long(entries, requests)

    def verdict(ok: bool) -> str:
        return "ok" if ok else "over"

    print(
        f"A run of {f.entries:,} journal entries (written in bulk in {f.fill_s:.1f} s), served in"
        f" a fresh process; pages of {f.page_bytes:,} bytes"
    )
    print(f"  {'':<56}{'p50':>10}{'p99':>10}{'max':>10}")
    for key, label in LONG_ROWS:
        p50, p99, most = f.timings[key]
        line = f"  {label:<56}{p50:>7.1f} ms{p99:>7.1f} ms{most:>7.1f} ms"
        print(line + f"  p99 {verdict(p99 <= LONG_TARGET_MS)}")
    print(f"  first page after the process starts: {f.first_page_ms:.0f} ms")
    print(
        f"  serving process RSS growth at peak: {f.rss_growth_mib:.1f} MiB"
        f" ({verdict(f.rss_growth_mib <= RSS_TARGET_MIB)});"
        f" event loop's longest block: {f.longest_block_ms:.1f} ms"
        f" ({verdict(f.longest_block_ms <= BLOCK_TARGET_MS)})"
    )
    print(
        f"  runs export --html: {f.export_s:.1f} s, {f.export_bytes / 2**20:.0f} MiB of HTML,"
        f" RSS growth at peak {f.export_rss_growth_mib:.1f} MiB"
        f" ({verdict(f.export_rss_growth_mib <= RSS_TARGET_MIB)})"
    )


if __name__ == "__main__":
    main()
