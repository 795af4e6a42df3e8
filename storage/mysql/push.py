"""Offline push registrations and mutes of a MySQL store: `im_push_device` and
`im_conv_mute` (schema 11) in its metadata database, on the store's own pool. They are
keyed by uid, no commit reads them, and the delivery path reads both for a
conversation's offline members at once: one server answers both, and moving a shard
(storage/mysql/move.py) leaves them alone. The rules are storage/push.py's.

A (provider, token) is unique through the SHA-256 of the token (`token_sha`): index
entries of 32 bytes where tokens run to 2,048."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from storage.models import PushDevice
from storage.mysql.transactions import rowcount
from storage.push import chunks, mute_until, muted_sql, pair_chunks, plan_register, token_digest

if TYPE_CHECKING:
    from storage.mysql.transactions import Cursor, Transactions

_COLS: Final = "uid, device, provider, token, preview, locale, updated_ms"


class MySQLPushRegistry:
    """The push part of the store port (storage/ports.py, ChatStore.push_*, set_mute,
    muted) in a MySQL store's metadata database."""

    def __init__(self, db: Transactions, clock: Callable[[], int]) -> None:
        self._db = db
        self._clock = clock

    async def register(
        self,
        uid: int,
        device: str,
        provider: str,
        token: str,
        *,
        preview: bool,
        locale: str,
        max_devices: int,
    ) -> list[tuple[int, str]]:
        sha = token_digest(token)

        async def body(cur: Cursor) -> list[tuple[int, str]]:
            # Locking reads: a concurrent registration of the same token or uid waits
            # (or deadlocks and is retried), so neither limit is overshot.
            await cur.execute(
                "SELECT uid, device FROM im_push_device WHERE provider=%s AND token_sha=%s "
                "FOR UPDATE",
                (provider, sha),
            )
            moved = [(int(u), str(d)) for u, d in await cur.fetchall()]
            moved = [h for h in moved if h != (uid, device)]
            await cur.execute(
                "SELECT device, updated_ms FROM im_push_device WHERE uid=%s FOR UPDATE", (uid,)
            )
            mine = [(str(d), int(ms)) for d, ms in await cur.fetchall() if (uid, d) not in moved]
            plan = plan_register(mine, device, self._clock(), max_devices=max_devices)
            gone = [*moved, *((uid, d) for d in plan.evicted)]
            drop = [*gone, (uid, device)]  # its own row is written anew
            await cur.execute(
                "DELETE FROM im_push_device WHERE "
                + " OR ".join(["(uid=%s AND device=%s)"] * len(drop)),
                [v for key in drop for v in key],
            )
            await cur.execute(
                f"INSERT INTO im_push_device ({_COLS}, token_sha) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (uid, device, provider, token.encode(), int(preview), locale, plan.stamp_ms, sha),
            )
            return gone

        return await self._db.run(body)

    async def unregister(self, uid: int, device: str) -> bool:
        async def body(cur: Cursor) -> bool:
            await cur.execute(
                "DELETE FROM im_push_device WHERE uid=%s AND device=%s", (uid, device)
            )
            return rowcount(cur) > 0

        return await self._db.run(body, tx=False)  # one statement, committed on its own

    async def delete_token(self, provider: str, token: str) -> bool:
        async def body(cur: Cursor) -> bool:
            await cur.execute(
                "DELETE FROM im_push_device WHERE provider=%s AND token_sha=%s",
                (provider, token_digest(token)),
            )
            return rowcount(cur) > 0

        return await self._db.run(body, tx=False)

    async def devices(self, uids: Sequence[int]) -> dict[int, list[PushDevice]]:
        parts = chunks(uids)
        if not parts:
            return {}

        async def q(cur: Cursor) -> dict[int, list[PushDevice]]:
            found: dict[int, list[PushDevice]] = {}
            for part in parts:
                await cur.execute(
                    f"SELECT {_COLS} FROM im_push_device "
                    f"WHERE uid IN ({','.join(['%s'] * len(part))}) "
                    "ORDER BY uid, updated_ms DESC",
                    tuple(part),
                )
                for u, d, p, t, preview, locale, ms in await cur.fetchall():
                    row = PushDevice(
                        int(u), str(d), str(p), bytes(t).decode(), bool(preview), str(locale),
                        int(ms),
                    )  # fmt: skip
                    found.setdefault(row.uid, []).append(row)
            return found

        return await self._db.run(q, tx=False)

    async def set_mute(self, conv_id: int, uid: int, until_ms: int) -> None:
        until = mute_until(until_ms, self._clock())

        async def body(cur: Cursor) -> None:
            if until is None:
                await cur.execute(
                    "DELETE FROM im_conv_mute WHERE conv_id=%s AND uid=%s", (conv_id, uid)
                )
                return
            await cur.execute(
                "INSERT INTO im_conv_mute (conv_id, uid, until_ms) VALUES (%s, %s, %s) "
                "ON DUPLICATE KEY UPDATE until_ms=VALUES(until_ms)",
                (conv_id, uid, until),
            )

        await self._db.run(body, tx=False)

    async def muted(self, pairs: Sequence[tuple[int, int]], now_ms: int) -> set[tuple[int, int]]:
        parts = pair_chunks(pairs)
        if not parts:
            return set()

        async def q(cur: Cursor) -> set[tuple[int, int]]:
            found: set[tuple[int, int]] = set()
            for part in parts:
                await cur.execute(
                    muted_sql(len(part), "%s"), (*(v for pair in part for v in pair), now_ms)
                )
                found.update((int(c), int(u)) for c, u in await cur.fetchall())
            return found

        return await self._db.run(q, tx=False)
