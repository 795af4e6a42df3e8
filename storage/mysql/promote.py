"""`imgw db promote --server N --to URL`: a shard server's replica takes over its shards
after the server died.

1. On the replica, the I/O thread stops (it was retrying the dead primary), and the SQL
   thread applies everything the replica received (`MASTER_GTID_WAIT` on the received
   GTID position). With semi-synchronous replication every commit the primary
   acknowledged was received by the replica before the acknowledgement, so it is then
   applied: no acked message is lost, and the seq rows are those of the last commits,
   so no seq is handed out twice. Without semi-sync the commits the replica had not
   received when the primary died are lost, and their seqs are handed out again.
2. Replication is reset and the replica made writable (`read_only=OFF`).
3. In the metadata database, every range of the map that server N held names URL, in
   one statement. Every store reads the map each second (storage/mysql/store.py): within
   about a second the gateways send to the replica. Until then the sends of those shards
   fail against the dead server and are answered `unavailable`; clients retry them with
   the same client_msg_id.

A replica an external tool already promoted (no replication configured) is only made
writable, and the map updated. The metadata database itself cannot be promoted this
way: it holds the map (docs/deployment.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from storage.mysql.schema import _connect, read_map
from storage.mysql.settings import MySQLSettings
from storage.mysql.shardmap import check_url, masked, same_place, server_settings

WAIT_S: Final = 60.0  # at most this long for the replica to apply what it received


def servers(urls: list[str]) -> list[str]:
    """The map's servers, numbered in map order (as `imgw db status` shows them)."""
    return list(dict.fromkeys(urls))


async def promote(
    meta: MySQLSettings,
    server: int,
    to_url: str,
    *,
    wait_s: float = WAIT_S,
    log: Callable[[str], None] = lambda line: None,
) -> list[str]:
    """Promote `to_url`, a replica of map server `server`, in its place; the lines to
    print. Raises ValueError for a server or URL that cannot be, RuntimeError when the
    replica did not apply what it received within `wait_s`."""
    check_url(to_url)
    conn = await _connect(meta)
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"USE `{meta.database}`")
            ranges = await read_map(cur)
    finally:
        conn.close()
    numbered = servers([r.url for r in ranges])
    if not 0 <= server < len(numbered):
        raise ValueError(
            f"no server {server} in the shard map (it has {len(numbered)}: imgw db status)"
        )
    old = numbered[server]
    if same_place(server_settings(meta, old), meta):
        raise ValueError(f"server {server} holds the metadata database: it cannot be promoted")
    new = server_settings(meta, to_url)
    if same_place(new, server_settings(meta, old)):
        raise ValueError(f"{masked(to_url)} is server {server} itself")

    replica = await _connect(new)
    try:
        async with replica.cursor() as cur:
            await cur.execute("SHOW SLAVE STATUS")
            row = await cur.fetchone()
            if row is not None:
                await cur.execute("STOP SLAVE IO_THREAD")
                await cur.execute("SHOW SLAVE STATUS")
                names = [d[0] for d in cur.description]
                status = dict(zip(names, await cur.fetchone(), strict=True))
                received = str(status.get("Gtid_IO_Pos") or "")
                log(f"{masked(to_url)}: applying what it received ({received or 'nothing'})")
                if received:
                    await cur.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (received, wait_s))
                    (waited,) = await cur.fetchone()
                    if int(waited) != 0:
                        raise RuntimeError(
                            f"the replica did not apply {received} within {wait_s:g} s; "
                            "nothing was changed but its I/O thread (START SLAVE to resume)"
                        )
                await cur.execute("STOP SLAVE")
                await cur.execute("RESET SLAVE ALL")
            await cur.execute("SET GLOBAL read_only=OFF")
    finally:
        replica.close()

    conn = await _connect(meta)
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"USE `{meta.database}`")
            await cur.execute("UPDATE im_shard_map SET url=%s WHERE url=%s", (to_url, old))
            moved = cur.rowcount
    finally:
        conn.close()
    held = [f"{r.lo:04d}-{r.hi:04d}" for r in ranges if r.url == old]
    return [
        f"server {server} ({masked(old)}) replaced by {masked(to_url)}: shards "
        f"{', '.join(held)} ({moved} map rows); gateways follow within about a second"
    ]
