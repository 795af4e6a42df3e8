"""The media tables on MySQL: schema 7, in the metadata database only, added to an
older schema by `imgw db migrate`."""

from __future__ import annotations

import aiomysql

from storage.mysql import MySQLSettings
from storage.mysql.schema import SCHEMA_VERSION, ddl
from tests.support.services import downgrade_then_migrate, drop_mysql, fresh_mysql

MEDIA_TABLES = {"im_media_upload", "im_media_ref"}


def test_the_media_tables_live_in_the_metadata_database_only() -> None:
    def tables(statements: list[str]) -> set[str]:
        return {t for t in MEDIA_TABLES for s in statements if f"EXISTS {t} " in s}

    assert tables(ddl(4, meta=True)) == MEDIA_TABLES
    assert tables(ddl([0, 1], meta=False)) == set()
    assert SCHEMA_VERSION >= 7  # (8 added a column elsewhere)


async def test_migrate_adds_the_media_tables_to_schema_5() -> None:
    url = await fresh_mysql()
    try:
        assert await downgrade_then_migrate(url, 5, "DROP TABLE im_media_upload, im_media_ref")
        s = MySQLSettings.from_url(url)
        conn = await aiomysql.connect(host=s.host, port=s.port, user=s.user,
                                      password=s.password, db=s.database)  # fmt: skip
        try:
            async with conn.cursor() as cur:
                await cur.execute("SHOW TABLES LIKE 'im\\_media%%'")
                assert {r[0] for r in await cur.fetchall()} == MEDIA_TABLES
        finally:
            conn.close()
    finally:
        await drop_mysql(url)
