"""MySQL/MariaDB schema: created and upgraded by `imgw db migrate`, idempotently.

Message tables are sharded by conv_id (`im_message_0000` … `im_message_{N-1}`, shard =
conv_id % N). The shard count is recorded in `im_meta` at the first migration and cannot
change afterwards without moving data: a later migrate with another `--shards` refuses.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Final

import asyncmy
from asyncmy import errors as db_errors

from storage.errors import StoreUnavailable
from storage.mysql.changes import CHANGES_DDL
from storage.mysql.shardmap import (
    MAP_DDL,
    ShardRange,
    masked,
    owners,
    place,
    same_place,
    server_settings,
    split,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from asyncmy.connection import Connection
    from asyncmy.cursors import Cursor

    from storage.mysql.settings import MySQLSettings

# 2: im_conv_seq.recalled_seq; 3: im_outbox, im_node_lease; 4: im_shard_map;
# 5: im_archive, im_archive_sent (storage/archive); 6: im_lease (storage/mysql/lease.py);
# 7: im_media_upload, im_media_ref (storage/media); 8: im_node_lease.conn_floor;
# 9: im_revocation (storage/revocations.py); 10: im_archive_unread (storage/archive);
# 11: im_push_device, im_conv_mute (storage/mysql/push.py); 12: im_hook
# (storage/hooks.py); 13: im_shard_change (storage/mysql/changes.py). Tables are
# CREATE ... IF NOT EXISTS, so versions stack: the highest is recorded and every table
# is created; columns added later are in UPGRADES too.
SCHEMA_VERSION: Final = 13

# Content: clients send at most max_content (2,048 by default) bytes; server-written
# system messages list up to 1,000 uids, hence the larger column.
_TABLES: Final = [
    """CREATE TABLE IF NOT EXISTS im_meta (
        name  VARCHAR(64) NOT NULL PRIMARY KEY,
        value VARCHAR(255) NOT NULL
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE IF NOT EXISTS im_conversation (
        conv_id    BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
        kind       TINYINT UNSIGNED NOT NULL,
        p2p_lo     BIGINT UNSIGNED NULL,
        p2p_hi     BIGINT UNSIGNED NULL,
        title      VARCHAR(256) NOT NULL DEFAULT '',
        owner_uid  BIGINT UNSIGNED NOT NULL DEFAULT 0,
        created_ms BIGINT NOT NULL,
        UNIQUE KEY uq_p2p (kind, p2p_lo, p2p_hi)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE IF NOT EXISTS im_conv_member (
        conv_id    BIGINT UNSIGNED NOT NULL,
        uid        BIGINT UNSIGNED NOT NULL,
        pos        INT NOT NULL,
        joined_seq BIGINT UNSIGNED NOT NULL,
        left_seq   BIGINT UNSIGNED NULL,
        left_ms    BIGINT NULL,
        read_seq   BIGINT UNSIGNED NOT NULL DEFAULT 0,
        updated_ms BIGINT NOT NULL,
        PRIMARY KEY (conv_id, uid),
        KEY k_uid (uid, conv_id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE IF NOT EXISTS im_conv_seq (
        conv_id        BIGINT UNSIGNED NOT NULL PRIMARY KEY,
        reserved_seq   BIGINT UNSIGNED NOT NULL DEFAULT 0,
        max_seq        BIGINT UNSIGNED NOT NULL DEFAULT 0,
        last_active_ms BIGINT NOT NULL,
        recalled_seq   BIGINT UNSIGNED NOT NULL DEFAULT 0
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE IF NOT EXISTS im_delivered (
        uid        BIGINT UNSIGNED NOT NULL,
        device     VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        conv_id    BIGINT UNSIGNED NOT NULL,
        seq        BIGINT UNSIGNED NOT NULL,
        updated_ms BIGINT NOT NULL,
        PRIMARY KEY (uid, device, conv_id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # (sender, client_msg_id) across conversations: the durable idempotency record, so
    # a retry is recognised (or refused as a conflict) even when Redis has lost it.
    """CREATE TABLE IF NOT EXISTS im_send_dedup (
        sender_uid    BIGINT UNSIGNED NOT NULL,
        client_msg_id VARBINARY(64) NOT NULL,
        conv_id       BIGINT UNSIGNED NOT NULL,
        seq           BIGINT UNSIGNED NOT NULL,
        created_ms    BIGINT NOT NULL,
        PRIMARY KEY (sender_uid, client_msg_id),
        KEY k_created (created_ms)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # The transactional outbox (storage/mysql/outbox.py): the fan-out a group commit
    # still owes, written in that commit by the committing node, deleted once delivered.
    # entries: msgpack [[conv_id, lo_seq, hi_seq], ...].
    """CREATE TABLE IF NOT EXISTS im_outbox (
        id         BIGINT UNSIGNED NOT NULL PRIMARY KEY,
        node       VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        entries    BLOB NOT NULL,
        created_ms BIGINT NOT NULL,
        KEY k_node (node, id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # Hook rows (storage/hooks.py): stored messages whose webhooks and push events `node`
    # still owes, written in the message's own commit (so on the server of its shard,
    # where they stay), deleted once delivered.
    """CREATE TABLE IF NOT EXISTS im_hook (
        conv_id    BIGINT UNSIGNED NOT NULL,
        seq        BIGINT UNSIGNED NOT NULL,
        node       VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        created_ms BIGINT NOT NULL,
        PRIMARY KEY (conv_id, seq),
        KEY k_node (node, created_ms)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # One row per node writing the outbox: alive while expires_ms is ahead; a survivor
    # claims a lapsed one (claimed_by) and re-delivers its outbox. conn_floor: the
    # connection ids of the node's current process are above it (gateway/outbox.py).
    """CREATE TABLE IF NOT EXISTS im_node_lease (
        node       VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
        expires_ms BIGINT NOT NULL,
        claimed_by VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
        conn_floor BIGINT UNSIGNED NOT NULL DEFAULT 0,
        KEY k_expires (expires_ms)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # The archive index (storage/archive/index_sqlite.py): one row per archived batch of a
    # conversation, seqs seq_lo..seq_hi in file_key under the archive URL root.
    """CREATE TABLE IF NOT EXISTS im_archive (
        conv_id    BIGINT UNSIGNED NOT NULL,
        seq_lo     BIGINT UNSIGNED NOT NULL,
        seq_hi     BIGINT UNSIGNED NOT NULL,
        root       VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        file_key   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        n_rows     INT UNSIGNED NOT NULL,
        n_bytes    BIGINT UNSIGNED NOT NULL,
        created_ms BIGINT NOT NULL,
        PRIMARY KEY (conv_id, seq_lo)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # Archived client sends still inside the idempotency window (as im_send_dedup, 48 h):
    # a retried SEND whose message was archived finds its original here.
    """CREATE TABLE IF NOT EXISTS im_archive_sent (
        sender_uid    BIGINT UNSIGNED NOT NULL,
        client_msg_id VARBINARY(64) NOT NULL,
        conv_id       BIGINT UNSIGNED NOT NULL,
        seq           BIGINT UNSIGNED NOT NULL,
        msg_id        BIGINT UNSIGNED NOT NULL,
        msg_type      TINYINT UNSIGNED NOT NULL,
        content       VARBINARY(16384) NOT NULL,
        send_ms       BIGINT NOT NULL,
        PRIMARY KEY (sender_uid, client_msg_id),
        KEY k_send_ms (send_ms)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # What unread counts need of each archived batch (storage/archive/index_sqlite.py): per file
    # (by its seq_hi) and sender, the n seqs first_seq..last_seq of the messages that
    # count (seqs: storage/rules.py). Beside the conversation's messages, as im_archive.
    """CREATE TABLE IF NOT EXISTS im_archive_unread (
        conv_id    BIGINT UNSIGNED NOT NULL,
        seq_hi     BIGINT UNSIGNED NOT NULL,
        sender_uid BIGINT UNSIGNED NOT NULL,
        n          INT UNSIGNED NOT NULL,
        first_seq  BIGINT UNSIGNED NOT NULL,
        last_seq   BIGINT UNSIGNED NOT NULL,
        seqs       MEDIUMBLOB NOT NULL,
        PRIMARY KEY (conv_id, seq_hi, sender_uid)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    MAP_DDL,
    CHANGES_DDL,
    # Media by object key (storage/media/index_sqlite.py): uploads whose URL was handed out, and
    # the conversations holding a message that carries the key. Keys only, never URLs.
    """CREATE TABLE IF NOT EXISTS im_media_upload (
        media_key    VARCHAR(96) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
        uid          BIGINT UNSIGNED NOT NULL,
        size         BIGINT UNSIGNED NOT NULL,
        content_type VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        created_ms   BIGINT NOT NULL,
        referenced   TINYINT UNSIGNED NOT NULL DEFAULT 0,
        KEY k_orphan (referenced, created_ms)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    """CREATE TABLE IF NOT EXISTS im_media_ref (
        media_key  VARCHAR(96) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        conv_id    BIGINT UNSIGNED NOT NULL,
        created_ms BIGINT NOT NULL,
        PRIMARY KEY (media_key, conv_id)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # Named leases (storage/mysql/lease.py): the node that holds `name` until expires_ms
    # (the database server's clock) does the job only one node should, e.g. pruning.
    """CREATE TABLE IF NOT EXISTS im_lease (
        name       VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
        owner      VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        expires_ms BIGINT NOT NULL
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # Token revocations (storage/revocations.py): the tokens of uid on device ('*': every
    # device) minted at or before revoked_s are refused until expires_s (Unix seconds);
    # updated_ms (the database's clock) is what the nodes' reads of changes follow.
    """CREATE TABLE IF NOT EXISTS im_revocation (
        uid        BIGINT UNSIGNED NOT NULL,
        device     VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        revoked_s  BIGINT NOT NULL,
        expires_s  BIGINT NOT NULL,
        updated_ms BIGINT NOT NULL,
        PRIMARY KEY (uid, device),
        KEY k_updated (updated_ms),
        KEY k_expires (expires_s)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # Offline push (storage/mysql/push.py): each registered device's address at its push
    # service; a (provider, token) belongs to one device, unique by the token's SHA-256.
    # updated_ms: when it was registered, the newest of a uid the highest.
    """CREATE TABLE IF NOT EXISTS im_push_device (
        uid        BIGINT UNSIGNED NOT NULL,
        device     VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        provider   VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        token      VARBINARY(2048) NOT NULL,
        token_sha  BINARY(32) NOT NULL,
        preview    TINYINT UNSIGNED NOT NULL,
        locale     VARCHAR(35) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        updated_ms BIGINT NOT NULL,
        PRIMARY KEY (uid, device),
        UNIQUE KEY uq_token (provider, token_sha)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
    # No notifications of conv_id to uid's devices until until_ms (storage/push.py).
    """CREATE TABLE IF NOT EXISTS im_conv_mute (
        conv_id  BIGINT UNSIGNED NOT NULL,
        uid      BIGINT UNSIGNED NOT NULL,
        until_ms BIGINT NOT NULL,
        PRIMARY KEY (conv_id, uid)
    ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4""",
]
# Only in the metadata database; every other table of _TABLES is also on each shard
# server, for the conversations of its shards (docs/decisions.md).
_META_ONLY: Final = (
    "im_node_lease", "im_shard_map", "im_lease", "im_media_upload", "im_media_ref",
    "im_revocation", "im_push_device", "im_conv_mute",
)  # fmt: skip

_MESSAGE_TABLE: Final = """CREATE TABLE IF NOT EXISTS {name} (
    id            BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    conv_id       BIGINT UNSIGNED NOT NULL,
    seq           BIGINT UNSIGNED NOT NULL,
    sender_uid    BIGINT UNSIGNED NOT NULL,
    msg_type      TINYINT UNSIGNED NOT NULL,
    content       VARBINARY(16384) NOT NULL,
    client_msg_id VARBINARY(64) NULL,
    send_ms       BIGINT NOT NULL,
    status        BIGINT UNSIGNED NOT NULL DEFAULT 0,
    UNIQUE KEY uq_seq (conv_id, seq),
    UNIQUE KEY uq_dedup (conv_id, sender_uid, client_msg_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""
# status: 0, or the seq of the recall message that recalled this one.
# client_msg_id is NULL for server-written messages (system, recall), so they never
# collide in uq_dedup.


# Columns added after the first release: (table, column, definition). `imgw db migrate`
# adds the ones missing (checked in information_schema: MySQL has no ADD COLUMN IF NOT
# EXISTS). recalled_seq: the highest recalled seq of the conversation; the Redis recent
# cache never answers a page reaching down to it (storage/mysql_redis.py).
UPGRADES: Final = [
    ("im_conv_seq", "recalled_seq", "BIGINT UNSIGNED NOT NULL DEFAULT 0"),
    ("im_node_lease", "conn_floor", "BIGINT UNSIGNED NOT NULL DEFAULT 0"),
]


def message_table(shard: int) -> str:
    return f"im_message_{shard:04d}"


def _is_meta_only(stmt: str) -> bool:
    return any(f"EXISTS {t} " in stmt for t in _META_ONLY)


def ddl(shards: int | Sequence[int], *, meta: bool = True) -> list[str]:
    """The CREATE statements of a database holding message shards `shards` (a count:
    0..n-1); `meta`: it is the metadata database (else a shard server's)."""
    numbers = range(shards) if isinstance(shards, int) else shards
    tables = [t for t in _TABLES if meta or not _is_meta_only(t)]
    return [*tables, *(_MESSAGE_TABLE.format(name=message_table(i)) for i in numbers)]


async def _connect(settings: MySQLSettings) -> Connection:
    try:
        return await asyncmy.connect(
            host=settings.host, port=settings.port, user=settings.user,
            password=settings.password, connect_timeout=settings.timeout_s, autocommit=True,
            charset="utf8mb4",
        )  # fmt: skip
    except (db_errors.OperationalError, OSError) as e:
        raise StoreUnavailable(
            f"cannot connect to MySQL at {settings.host}:{settings.port}: {e}"
        ) from e


async def _check_meta(cur: Cursor, settings: MySQLSettings) -> None:
    """Refuse a database migrated with another shard count, or by a newer imgw."""
    await cur.execute("SHOW TABLES LIKE 'im\\_meta'")
    if await cur.fetchone():
        await cur.execute("SELECT name, value FROM im_meta")
        meta = {k: v for k, v in await cur.fetchall()}
        if "shards" in meta and int(meta["shards"]) != settings.shards:
            raise ValueError(
                f"database {settings.database} has {meta['shards']} message shards; "
                f"refusing to migrate with shards={settings.shards}"
            )
        if int(meta.get("schema_version", 0)) > SCHEMA_VERSION:
            raise ValueError("the database schema is newer than this imgw: upgrade imgw")


async def _tables(cur: Cursor, database: str) -> set[str]:
    await cur.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema=%s", (database,)
    )
    return {str(name) for (name,) in await cur.fetchall()}


async def _create(
    cur: Cursor,
    settings: MySQLSettings,
    shards: Sequence[int],
    *,
    meta: bool,
    existed: set[str] | None = None,
) -> list[str]:
    """Create (or upgrade) one server's database and tables; what it did, first how many
    tables it created of those not in `existed` (default: the tables there now)."""
    done: list[str] = []
    if existed is None:
        existed = await _tables(cur, settings.database)
    await cur.execute("SET SESSION sql_notes = 0")  # no "already exists" warnings
    await cur.execute(
        f"CREATE DATABASE IF NOT EXISTS `{settings.database}` DEFAULT CHARACTER SET utf8mb4"
    )
    await cur.execute(f"USE `{settings.database}`")
    await _check_meta(cur, settings)
    statements = ddl(shards, meta=meta)
    for stmt in statements:
        await cur.execute(stmt)
    names = [stmt.split("EXISTS", 1)[1].split()[0] for stmt in statements]
    created = sum(name not in existed for name in names)
    if not created:
        done.append(f"tables present ({len(shards)} message shards)")
    elif created == len(names):
        done.append(f"created {created} tables ({len(shards)} message shards)")
    else:
        done.append(
            f"created {created} tables, {len(names) - created} were present "
            f"({len(shards)} message shards)"
        )
    for table, column, definition in UPGRADES:
        if not meta and table in _META_ONLY:
            continue  # a shard server has no such table
        await cur.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema=%s "
            "AND table_name=%s AND column_name=%s",
            (settings.database, table, column),
        )
        if await cur.fetchone() is None:
            await cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
            done.append(f"added {table}.{column}")
    await cur.execute(
        "INSERT INTO im_meta (name, value) VALUES ('schema_version', %s), "
        "('shards', %s) ON DUPLICATE KEY UPDATE value=VALUES(value)",
        (str(SCHEMA_VERSION), str(settings.shards)),
    )
    return done


async def read_map(cur: Cursor) -> list[ShardRange]:
    """The shard map of the metadata database `cur` uses (empty: single server)."""
    await cur.execute("SELECT lo, hi, url FROM im_shard_map ORDER BY lo")
    return [ShardRange(int(lo), int(hi), str(url)) for lo, hi, url in await cur.fetchall()]


async def _settle_map(
    cur: Cursor, settings: MySQLSettings, servers: Sequence[str] | None
) -> list[ShardRange]:
    """The shard map after this migrate: as stored, or written from `servers` at the
    first migrate that names them (refused once the metadata database holds
    conversations: moving shards is `imgw db add-server`'s job)."""
    ranges = await read_map(cur)
    if not servers:
        return ranges
    want = split(settings.shards, servers)
    if ranges:
        if [(r.lo, r.hi, place(r.url)) for r in ranges] != [
            (r.lo, r.hi, place(r.url)) for r in want
        ]:
            raise ValueError(
                "the shard map is already set (see `imgw db status`); "
                "change it with `imgw db add-server`"
            )
        # the same servers: only their read replicas (?replica=) may change
        await cur.executemany(
            "UPDATE im_shard_map SET url=%s WHERE lo=%s", [(r.url, r.lo) for r in want]
        )
        return want
    await cur.execute("SELECT 1 FROM im_conversation LIMIT 1")
    if await cur.fetchone() is not None:
        raise ValueError(
            f"database {settings.database} already holds conversations in its own shards; "
            "move shards to another server with `imgw db add-server`"
        )
    await cur.executemany(
        "INSERT INTO im_shard_map (lo, hi, url) VALUES (%s, %s, %s)",
        [(r.lo, r.hi, r.url) for r in want],
    )
    return want


async def migrate(settings: MySQLSettings, servers: Sequence[str] | None = None) -> list[str]:
    """Create the database and tables if missing; record the schema version and shard
    count; with `servers` (mysql:// URLs) at the first migrate, spread the shards over
    them; create every server's shards and colocated tables. Idempotent. Returns what
    it did, for the command's output."""
    done: list[str] = []
    conn = await _connect(settings)
    try:
        async with conn.cursor() as cur:
            existed = await _tables(cur, settings.database)  # before this migrate
            lines = await _create(cur, settings, [], meta=True, existed=existed)
            done += lines[1:]  # columns added, if any
            ranges = await _settle_map(cur, settings, servers)
            if not ranges:  # a single server: every shard in the metadata database
                lines = await _create(
                    cur, settings, range(settings.shards), meta=True, existed=existed
                )
                return done + lines[:1]
            owner = owners(ranges, settings.shards)
            for url in dict.fromkeys(owner):
                s = server_settings(settings, url)
                mine = [i for i, u in enumerate(owner) if u == url]
                where = f"{s.host}:{s.port}/{s.database}"
                if same_place(s, settings):
                    lines = await _create(cur, settings, mine, meta=True, existed=existed)
                else:
                    lines = await _create_on(s, mine)
                done += [f"{where}: {line}" for line in lines]
    finally:
        conn.close()
    return done


async def _create_on(settings: MySQLSettings, shards: Sequence[int]) -> list[str]:
    conn = await _connect(settings)
    try:
        async with conn.cursor() as cur:
            return await _create(cur, settings, shards, meta=False)
    finally:
        conn.close()


async def status(settings: MySQLSettings) -> tuple[list[str], bool]:
    """`imgw db status`: the metadata database's schema and shard count, and the shard
    map with, for each server, whether it answers and holds its shard tables. The
    lines to print, and whether everything is in place."""
    conn = await _connect(settings)
    try:
        async with conn.cursor() as cur:
            try:
                await cur.execute(f"USE `{settings.database}`")
                await cur.execute("SELECT name, value FROM im_meta")
            except db_errors.MySQLError as e:
                raise ValueError(
                    f"{settings.database}: no imgw schema ({e}); run `imgw db migrate`"
                ) from e
            meta = {str(k): str(v) for k, v in await cur.fetchall()}
            shards = int(meta.get("shards", settings.shards))
            version = int(meta.get("schema_version", 0))
            ranges = await read_map(cur) if version >= 4 else []
    finally:
        conn.close()
    here = f"{settings.host}:{settings.port}/{settings.database}"
    lines = [f"metadata database {here}: schema {version}, {shards} message shards"]
    ok = version == SCHEMA_VERSION
    if not ok:
        lines.append(f"  schema {version} is not this imgw's ({SCHEMA_VERSION}): run migrate")
    if not ranges:
        lines.append("shard map: none (every shard in the metadata database)")
        ranges = [ShardRange(0, shards - 1, "")]
    else:
        lines.append("shard map:")
    settings = dataclasses.replace(settings, shards=shards)
    numbered = list(dict.fromkeys(r.url for r in ranges))  # `imgw db promote --server N`
    for r in ranges:
        s = server_settings(settings, r.url) if r.url else settings
        where = masked(r.url) if r.url else f"mysql://{here}"
        if same_place(s, settings):
            where += " (metadata database)"
        state = await _server_state(s, range(r.lo, r.hi + 1))
        ok = ok and state.startswith("ok")
        server = f"  (server {numbered.index(r.url)})" if r.url else ""
        lines.append(f"  {r.lo:04d}-{r.hi:04d}  {where}  {state}{server}")
    return lines, ok


async def _server_state(settings: MySQLSettings, shards: Sequence[int]) -> str:
    try:
        conn = await _connect(settings)
    except StoreUnavailable as e:
        return f"UNREACHABLE: {e}"
    try:
        async with conn.cursor() as cur:
            await cur.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema=%s",
                (settings.database,),
            )
            tables = {str(t) for (t,) in await cur.fetchall()}
    finally:
        conn.close()
    present = sum(message_table(i) in tables for i in shards)
    missing = len(shards) - present
    if missing:
        return f"MISSING {missing} of {len(shards)} shard tables: run `imgw db migrate`"
    return f"ok, {present} shard tables"
