"""A statement of Kestrel's held in PostgreSQL until the test ends its backend there.

``HeldBackend(admin, app)`` on the test's own connection (its ``search_path`` the schema under
test): ``hold(table, when)`` makes every insert into ``table`` whose row matches ``when`` (SQL
over ``NEW``) wait, in the server, on an advisory lock the test takes; ``terminate()`` waits
for a backend of ``app`` (the ``application_name`` Kestrel's DSN names) to wait on it, ends
that backend with ``pg_terminate_backend`` (a failover, a pooler restarting, an operator), and
lets the lock go. The database is shared: only the backend of ``app`` found waiting is ended.
"""

from __future__ import annotations

import uuid

import asyncpg

from tests.fakes.waiting import until

_WAITING = (
    "SELECT pid FROM pg_locks JOIN pg_stat_activity USING (pid) WHERE NOT granted"
    " AND locktype = 'advisory' AND classid = 0 AND objid::bigint = $2::bigint"
    " AND application_name = $1"
)


class HeldBackend:
    """Holds matching inserts of one schema, and terminates the backend that waits."""

    def __init__(self, admin: asyncpg.Connection, app: str) -> None:
        self._admin = admin
        self._app = app
        # Advisory locks are the database's: a key of this test's own.
        self._key = int.from_bytes(uuid.uuid4().bytes[:4], "big") >> 1

    async def hold(self, table: str, when: str = "true") -> None:
        """Make inserts into ``table`` matching ``when`` wait on the test's lock."""
        await self._admin.execute(f"""
            CREATE FUNCTION held() RETURNS trigger AS $$
            BEGIN PERFORM pg_advisory_xact_lock({self._key}); RETURN NEW; END
            $$ LANGUAGE plpgsql;
            CREATE TRIGGER held BEFORE INSERT ON {table} FOR EACH ROW
              WHEN ({when}) EXECUTE FUNCTION held();
            SELECT pg_advisory_lock({self._key});
        """)

    async def terminate(self) -> None:
        """End the backend of ``app`` that waits on the lock, once one does; then let it go."""
        pid = await until(lambda: self._admin.fetchval(_WAITING, self._app, self._key))
        assert await self._admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        await self._admin.execute(f"SELECT pg_advisory_unlock({self._key})")
