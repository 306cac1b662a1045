"""SqliteStore's connections: the settings each is opened with."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from storage.sqlite import open_sqlite


def _setting(conn: sqlite3.Connection, name: str) -> object:
    return conn.execute(f"PRAGMA {name}").fetchone()[0]


async def test_the_writer_keeps_a_small_page_cache_and_durable_commits(tmp_path: Path) -> None:
    store = await open_sqlite(tmp_path / "k.db")
    try:
        names = ("cache_size", "journal_mode", "synchronous", "foreign_keys")
        found = await store._writer().transact(lambda c: [_setting(c, n) for n in names])
        ((reader_cache,),) = await store._reader().fetchall("PRAGMA cache_size", ())
    finally:
        await store.close()
    assert found == [-512, "wal", 2, 1]  # 512 KiB; WAL; synchronous FULL; keys enforced
    assert reader_cache == -2000  # SQLite's default: reads of whole journals stay cached
