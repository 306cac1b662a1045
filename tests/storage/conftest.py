"""Store fixtures: every contract test runs once per backend, on a fresh database.

To add a backend, write an async context manager factory like ``_sqlite_backend`` (it gets
``tmp_path`` and the test clock and yields an opener of new store instances on one fresh
database) and register it in ``BACKENDS``. The tests never name a backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.store import Store
from storage.sqlite import SqliteStore

Opener = Callable[[], Awaitable[Store]]
BackendFactory = Callable[[Path, "FakeClock"], AbstractAsyncContextManager[Opener]]


class FakeClock:
    """A wall clock that moves only when told to."""

    def __init__(self, start: datetime = datetime(2030, 1, 1, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += timedelta(seconds=seconds)


@asynccontextmanager
async def _sqlite_backend(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Opener]:
    path = tmp_path / "kestrel.db"

    async def open_store() -> Store:
        store = SqliteStore(path, clock=clock)
        await store.migrate()
        return store

    yield open_store


BACKENDS: dict[str, BackendFactory] = {"sqlite": _sqlite_backend}


@dataclass
class Backend:
    """One fresh database of one backend; ``open()`` gives another store instance on it."""

    name: str
    opener: Opener
    opened: list[Store] = field(default_factory=list)

    async def open(self) -> Store:
        """A new, migrated store instance on the same database (closed after the test)."""
        store = await self.opener()
        self.opened.append(store)
        return store


@pytest.fixture
def clock() -> FakeClock:
    """The clock every store of the test reads."""
    return FakeClock()


@pytest.fixture(params=sorted(BACKENDS))
async def backend(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[Backend]:
    """A fresh database of each registered backend."""
    async with BACKENDS[request.param](tmp_path, clock) as opener:
        backend = Backend(request.param, opener)
        try:
            yield backend
        finally:
            for store in reversed(backend.opened):
                await store.close()


@pytest.fixture
async def store(backend: Backend) -> Store:
    """A migrated store on a fresh database."""
    return await backend.open()
