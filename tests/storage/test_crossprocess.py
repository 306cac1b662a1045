"""Two OS processes deciding the same requests on one database: one winner per request."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

from bot.domain import Request, RequestKind, Session
from bot.records import RunRecord
from bot.store import Store
from tests.storage.conftest import Backend

REPO = Path(__file__).resolve().parents[2]
NAMES = ("alpha", "beta")

# Each child opens its own store on the address it is given (a SQLite file, or a PostgreSQL
# DSN with ?schema=), says it is ready and waits for the start line on stdin. Then it decides
# the hot request 10 times at once, and sweeps the other requests in its own order (alpha
# forwards, beta backwards, so they meet and contend in the middle). It prints how many hot
# decisions it won and which swept requests.
CHILD = textwrap.dedent(
    """
    import asyncio, json, sys

    from bot.cli.compose import postgres_schema
    from bot.domain import (Decision, DecisionKind, RequestStatus,)

    async def open_address(address):
        if address.startswith("postgresql://"):
            from storage.postgres import open_postgres
            dsn, schema = postgres_schema(address)
            return await open_postgres(dsn, schema=schema)
        from storage.sqlite import open_sqlite
        return await open_sqlite(address)

    async def main(address: str, name: str, hot: str, ids: list[str]) -> None:
        store = await open_address(address)
        try:
            print("ready", flush=True)
            sys.stdin.readline()
            decide = lambda rid: store.decide(
                Decision(request_id=rid, kind=DecisionKind.APPROVE, by=name),
                RequestStatus.ANSWERED,
            )
            hot_wins = sum(await asyncio.gather(*(decide(hot) for _ in range(10))))
            order = ids if name == "alpha" else ids[::-1]
            won = [rid for rid in order if await decide(rid)]
            print(json.dumps({"hot": hot_wins, "won": won}))
        finally:
            await store.close()

    asyncio.run(main(*sys.argv[1:4], json.loads(sys.argv[4])))
    """
)


async def test_two_processes_decide_each_request_once(backend: Backend) -> None:
    store = await backend.open()
    hot, *ids = await _open_requests(store, count=41)
    reports = await _race(backend.address, hot, ids)

    assert sum(report["hot"] for report in reports.values()) == 1
    alpha, beta = (set(reports[name]["won"]) for name in NAMES)
    assert alpha.isdisjoint(beta)
    assert alpha | beta == set(ids)
    _, _, hot_decision = await store.get_request(hot)
    assert hot_decision is not None
    assert reports[hot_decision.by]["hot"] == 1
    for rid in ids:
        _, _, decision = await store.get_request(rid)
        assert decision is not None
        assert decision.by == ("alpha" if rid in alpha else "beta")


async def _open_requests(store: Store, count: int) -> list[str]:
    await store.ensure_session(Session(id="s1"))
    await store.create_run(RunRecord(id="run_1", session_id="s1"), "w1", 30)
    requests = [
        Request(run_id="run_1", kind=RequestKind.WAIT_APPROVAL, call_id=f"call_{i}", tool="t")
        for i in range(count)
    ]
    for request in requests:
        await store.open_request(request)
    return [request.id for request in requests]


async def _race(address: str, hot: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Start both children, release them together, and return their reports by name."""
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath}
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            address,
            name,
            hot,
            json.dumps(ids),
            cwd=REPO,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for name in NAMES
    ]
    try:
        await asyncio.wait_for(asyncio.gather(*(_ready(child) for child in children)), 60)
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"go\n")
        outputs = await asyncio.wait_for(
            asyncio.gather(*(child.communicate() for child in children)), timeout=60
        )
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    for child, (_, stderr) in zip(children, outputs, strict=True):
        assert child.returncode == 0, stderr.decode()
    return {name: json.loads(stdout) for name, (stdout, _) in zip(NAMES, outputs, strict=True)}


async def _ready(child: asyncio.subprocess.Process) -> None:
    assert child.stdout is not None
    line = await child.stdout.readline()
    if line != b"ready\n":
        _, stderr = await child.communicate()
        raise AssertionError(f"child failed to start: {stderr.decode()}")
