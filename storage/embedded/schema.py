"""SQLite schema of the embedded store. `migrate` is idempotent."""

from __future__ import annotations

import os
import sqlite3
from typing import Final

# 2: im_archive, im_archive_sent, im_meta (storage/archive); 3: unused;
# 4: im_media_upload, im_media_ref (storage/media); 5: im_revocation
# (storage/revocations.py); 6: im_archive_unread (storage/archive); 7: im_push_device,
# im_conv_mute (storage/push.py); 8: im_hook (storage/hooks.py). Every table is CREATE
# ... IF NOT EXISTS, so versions stack: the highest wins and every table is created.
SCHEMA_VERSION: Final = 8

_DDL: Final = """
CREATE TABLE IF NOT EXISTS im_conversation (
    conv_id    INTEGER PRIMARY KEY AUTOINCREMENT,
    kind       INTEGER NOT NULL,
    p2p_lo     INTEGER,
    p2p_hi     INTEGER,
    title      TEXT NOT NULL DEFAULT '',
    owner_uid  INTEGER NOT NULL DEFAULT 0,
    created_ms INTEGER NOT NULL,
    UNIQUE (kind, p2p_lo, p2p_hi)
);
CREATE TABLE IF NOT EXISTS im_conv_member (
    conv_id    INTEGER NOT NULL,
    uid        INTEGER NOT NULL,
    pos        INTEGER NOT NULL,
    joined_seq INTEGER NOT NULL,
    left_seq   INTEGER,
    left_ms    INTEGER,
    read_seq   INTEGER NOT NULL DEFAULT 0,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (conv_id, uid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS im_conv_member_uid ON im_conv_member (uid, conv_id);
CREATE TABLE IF NOT EXISTS im_conv_seq (
    conv_id        INTEGER PRIMARY KEY,
    max_seq        INTEGER NOT NULL DEFAULT 0,
    last_active_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS im_message (
    id            INTEGER PRIMARY KEY,
    conv_id       INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    sender_uid    INTEGER NOT NULL,
    msg_type      INTEGER NOT NULL,
    content       BLOB NOT NULL,
    client_msg_id TEXT NOT NULL,
    send_ms       INTEGER NOT NULL,
    recall_seq    INTEGER NOT NULL DEFAULT 0,
    UNIQUE (conv_id, seq)
);
CREATE UNIQUE INDEX IF NOT EXISTS im_message_dedup
    ON im_message (sender_uid, client_msg_id) WHERE client_msg_id <> '';
CREATE TABLE IF NOT EXISTS im_delivered (
    uid        INTEGER NOT NULL,
    device     TEXT NOT NULL,
    conv_id    INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (uid, device, conv_id)
) WITHOUT ROWID;
-- The archive index (storage/archive/index_sqlite.py): one row per archived batch of a
-- conversation, seqs seq_lo..seq_hi in file_key under the archive URL root.
CREATE TABLE IF NOT EXISTS im_archive (
    conv_id    INTEGER NOT NULL,
    seq_lo     INTEGER NOT NULL,
    seq_hi     INTEGER NOT NULL,
    root       TEXT NOT NULL,
    file_key   TEXT NOT NULL,
    n_rows     INTEGER NOT NULL,
    n_bytes    INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (conv_id, seq_lo)
) WITHOUT ROWID;
-- Archived client sends still inside the idempotency window (48 h), so a retried SEND
-- finds its original; pruned by the store's housekeeping.
CREATE TABLE IF NOT EXISTS im_archive_sent (
    sender_uid    INTEGER NOT NULL,
    client_msg_id TEXT NOT NULL,
    conv_id       INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    msg_id        INTEGER NOT NULL,
    msg_type      INTEGER NOT NULL,
    content       BLOB NOT NULL,
    send_ms       INTEGER NOT NULL,
    PRIMARY KEY (sender_uid, client_msg_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS im_archive_sent_ms ON im_archive_sent (send_ms);
-- What unread counts need of each archived batch: per file (by its seq_hi) and sender,
-- the n seqs first_seq..last_seq of the messages that count (seqs: storage/rules.py).
CREATE TABLE IF NOT EXISTS im_archive_unread (
    conv_id    INTEGER NOT NULL,
    seq_hi     INTEGER NOT NULL,
    sender_uid INTEGER NOT NULL,
    n          INTEGER NOT NULL,
    first_seq  INTEGER NOT NULL,
    last_seq   INTEGER NOT NULL,
    seqs       BLOB NOT NULL,
    PRIMARY KEY (conv_id, seq_hi, sender_uid)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS im_meta (
    name  TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
-- Media by object key (storage/media/index_sqlite.py): uploads whose URL was handed out, and
-- the conversations holding a message that carries the key. Keys only, never URLs.
CREATE TABLE IF NOT EXISTS im_media_upload (
    media_key    TEXT NOT NULL PRIMARY KEY,
    uid          INTEGER NOT NULL,
    size         INTEGER NOT NULL,
    content_type TEXT NOT NULL,
    created_ms   INTEGER NOT NULL,
    referenced   INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS im_media_upload_orphan ON im_media_upload (referenced, created_ms);
CREATE TABLE IF NOT EXISTS im_media_ref (
    media_key  TEXT NOT NULL,
    conv_id    INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (media_key, conv_id)
) WITHOUT ROWID;
-- Token revocations (storage/revocations.py): the tokens of uid on device ('*': every
-- device) minted at or before revoked_s are refused until expires_s (Unix seconds).
CREATE TABLE IF NOT EXISTS im_revocation (
    uid        INTEGER NOT NULL,
    device     TEXT NOT NULL,
    revoked_s  INTEGER NOT NULL,
    expires_s  INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (uid, device)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS im_revocation_updated ON im_revocation (updated_ms);
CREATE INDEX IF NOT EXISTS im_revocation_expires ON im_revocation (expires_s);
-- Offline push (storage/push.py): each registered device's address at its push service
-- (a rowid table: tokens run to 2,048 bytes); a (provider, token) belongs to one device.
-- updated_ms: when it was registered, the newest of a uid the highest.
CREATE TABLE IF NOT EXISTS im_push_device (
    uid        INTEGER NOT NULL,
    device     TEXT NOT NULL,
    provider   TEXT NOT NULL,
    token      TEXT NOT NULL,
    preview    INTEGER NOT NULL,
    locale     TEXT NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (uid, device)
);
CREATE UNIQUE INDEX IF NOT EXISTS im_push_device_token ON im_push_device (provider, token);
-- No notifications of conv_id to uid's devices until until_ms.
CREATE TABLE IF NOT EXISTS im_conv_mute (
    conv_id  INTEGER NOT NULL,
    uid      INTEGER NOT NULL,
    until_ms INTEGER NOT NULL,
    PRIMARY KEY (conv_id, uid)
) WITHOUT ROWID;
-- Hook rows (storage/hooks.py): stored messages whose webhooks and push events `node`
-- still owes, written in the message's own commit, deleted once delivered.
CREATE TABLE IF NOT EXISTS im_hook (
    conv_id    INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    node       TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (conv_id, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS im_hook_node ON im_hook (node, created_ms);
"""


def connect(path: str, busy_timeout_ms: int = 5000) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, synchronous=FULL.
    A lock held by another process longer than `busy_timeout_ms` fails the operation."""
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000
    )
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
    return conn


def open_migrated(path: str, busy_timeout_ms: int = 5000) -> sqlite3.Connection:
    """`connect`, creating the file's folder first, and `migrate`."""
    if path != ":memory:":
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    conn = connect(path, busy_timeout_ms)
    migrate(conn)
    return conn


def migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise RuntimeError(
            f"database schema version {version} is newer than this imgw ({SCHEMA_VERSION}); "
            "upgrade imgw"
        )
    conn.executescript(_DDL)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
