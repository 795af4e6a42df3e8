"""`imgw db migrate` says what it did: the tables it created on a fresh database, then,
run again, that they are present."""

from __future__ import annotations

import asyncio
import contextlib
import io
import secrets

from gateway.cli import main
from storage.mysql.schema import ddl
from tests.support.services import MYSQL_HOST, MYSQL_PORT, drop_mysql, require_port


async def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(list(argv))

    rc = await asyncio.to_thread(run)
    return rc, out.getvalue(), err.getvalue()


async def test_migrate_says_it_created_the_tables_then_that_they_are_present() -> None:
    require_port(MYSQL_PORT, "MariaDB")
    name = f"imgw_t_{secrets.token_hex(6)}"
    url = f"mysql://root:@{MYSQL_HOST}:{MYSQL_PORT}/{name}?shards=2"
    try:
        rc, out, err = await cli("db", "migrate", "--store", url)
        assert rc == 0, err
        assert out == f"{name}: created {len(ddl(2))} tables (2 message shards)\n"
        rc, out, err = await cli("db", "migrate", "--store", url)
        assert rc == 0, err
        assert out == f"{name}: tables present (2 message shards)\n"
    finally:
        await drop_mysql(url)
