"""One sample of every frame with the body docs/protocol.md (Ops) gives it, and strategies.

`SAMPLES` pairs each frame with its expected body written out from the spec's table,
independently of the codec, so that a field order mistake in `protocol.frames`
shows up as a wire difference.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from protocol import frames as f
from protocol.ops import MAX_U64, ErrorCode, KickReason

CMID = "c3a1f6e0-1b2c-4d5e-8f90-123456789abc"
SHA = "ab" * 32  # a SHA-256 in hex
BIG = 2**63 + 5  # above 2^53 and 2^63: JavaScript BigInt territory, msgpack uint64
MSG = f.MsgRecord(7, BIG, 0, 6, b"\x83\xa5event", 1_700_000_000_000, "")
MSG2 = f.MsgRecord(8, 99, 42, 1, b"hi", 1_700_000_000_001, CMID)
CONV = f.ConvRecord(BIG, 2, 10, 8, 9, 1, 1_700_000_000_000, True)
CONV2 = f.ConvRecord(3, 1, 0, 0, 0, 0, 0, False)

SAMPLES: list[tuple[f.Frame, list[Any]]] = [
    # client to server
    (
        f.Login(1, 1, 42, "ios-1", "v1.k.42.ios-1.9.sig"),
        [1, 1, {"v": 1, "uid": 42, "device": "ios-1", "token": "v1.k.42.ios-1.9.sig"}],
    ),
    (
        f.Login(1, 1, 42, "ios-1", "t", ("outcome_unknown", "later")),
        [
            1,
            1,
            {
                "v": 1,
                "uid": 42,
                "device": "ios-1",
                "token": "t",
                "caps": ["outcome_unknown", "later"],
            },
        ],
    ),
    (f.Ping(), [3]),
    (f.Send(2, BIG, CMID, 1, b"\x00hello"), [10, 2, BIG, CMID, 1, b"\x00hello"]),
    (f.Delivered(5, 6), [21, 5, 6]),
    (f.Read(5, 0), [22, 5, 0]),
    (f.Typing(5), [24, 5]),
    (f.Presence(3, (1, 2, BIG)), [26, 3, [1, 2, BIG]]),
    (f.Sync(4, 0, 0, 0), [30, 4, 0, 0, 0]),
    (f.Sync(4, "since", b"\x01cursor", 100), [30, 4, "since", b"\x01cursor", 100]),
    (f.Pull(5, 9, 10, 50), [32, 5, 9, 10, 50]),
    (f.History(6, 9, 0, 20), [34, 6, 9, 0, 20]),
    (f.Recall(7, 9, 11), [40, 7, 9, 11]),
    (f.OpenP2P(8, 77), [50, 8, 77]),
    (f.GroupCreate(9, "team ☃", (2, 3)), [52, 9, "team ☃", [2, 3]]),
    (f.GroupCreate(9, "", ()), [52, 9, "", []]),
    (f.GroupMembers(10, 9, (4,), (2, 3)), [54, 10, 9, [4], [2, 3]]),
    (f.GroupInfo(11, 9), [56, 11, 9]),
    (f.Logout(), [62]),
    (f.MediaUpload(12, SHA, 1234, "image/png"), [70, 12, SHA, 1234, "image/png"]),
    (f.MediaGet(13, "media/42/" + SHA), [72, 13, "media/42/" + SHA]),
    (
        f.PushRegister(14, "apns", "ab" * 32, True, "pt-BR"),
        [80, 14, "apns", "ab" * 32, {"preview": True, "locale": "pt-BR"}],
    ),
    (f.PushRegister(14, "fcm", "t☃"), [80, 14, "fcm", "t☃", {"preview": False, "locale": ""}]),
    (f.PushUnregister(15), [82, 15]),
    (f.Mute(16, BIG, 1_700_000_000_000), [84, 16, BIG, 1_700_000_000_000]),
    (f.Mute(16, 9, 0), [84, 16, 9, 0]),
    # server to client
    (
        f.LoginOk(1, "gw-1", 30, 75, 65_536, 2_048, 1_700_000_000_000),
        [
            2,
            1,
            {
                "node": "gw-1",
                "hb": 30,
                "idle": 75,
                "max_frame": 65_536,
                "max_content": 2_048,
                "ts": 1_700_000_000_000,
            },
        ],
    ),
    (f.Pong(), [4]),
    (f.SendAck(2, 9, 12, BIG, 1_700_000_000_000), [11, 2, 9, 12, BIG, 1_700_000_000_000]),
    (
        f.Push(9, 12, BIG, 42, 1, b"hi", 1_700_000_000_000, CMID),
        [20, 9, 12, BIG, 42, 1, b"hi", 1_700_000_000_000, CMID],
    ),
    (f.Push(9, 13, 5, 0, 6, b"", 1, ""), [20, 9, 13, 5, 0, 6, b"", 1, ""]),
    (f.ReadNotify(9, 42, 12), [23, 9, 42, 12]),
    (f.TypingNotify(9, 42), [25, 9, 42]),
    (
        f.PresenceResult(3, ((1, ("ios", "web")), (2, ()))),
        [27, 3, [[1, ["ios", "web"]], [2, []]]],
    ),
    (
        f.SyncResult(4, 17, 0, False, (CONV, CONV2)),
        [31, 4, 17, 0, False, [list(CONV), list(CONV2)]],
    ),
    (f.SyncResult(4, "s", b"c", True, ()), [31, 4, "s", b"c", True, []]),
    (
        f.SyncResult(4, b"s", b"c", False, (CONV,), f.SyncPartial(1, 2)),
        [31, 4, b"s", b"c", False, [list(CONV)], {"missing": 1, "servers": 2}],
    ),
    (f.PullResult(5, 9, True, (MSG, MSG2)), [33, 5, 9, True, [list(MSG), list(MSG2)]]),
    (f.HistoryResult(6, 9, False, (MSG,)), [35, 6, 9, False, [list(MSG)]]),
    (f.SyncHint(), [36]),
    (f.Notice(100, b"hi", 1700000000000), [37, 100, b"hi", 1700000000000]),
    (f.RecallOk(7, 9, 14), [41, 7, 9, 14]),
    (f.ConvOk(8, 9), [51, 8, 9]),
    (f.Ok(10), [55, 10]),
    (f.GroupInfoResult(11, 9, "team", 2, (2, 3, 4)), [57, 11, 9, "team", 2, [2, 3, 4]]),
    (
        f.MediaUrl(12, "media/42/x", "http://h/m?sig=s", 1_700_000_000_000),
        [71, 12, "media/42/x", "http://h/m?sig=s", 1_700_000_000_000],
    ),
    (f.PushRegisterOk(14), [81, 14]),
    (f.Kick(KickReason.DRAINING, "", "gw-2:7000"), [60, 2, "", "gw-2:7000"]),
    (f.Error(0, ErrorCode.BAD_REQUEST, "READ.conv_id"), [127, 0, 4, "READ.conv_id"]),
]

CLIENT_SAMPLES = [frame for frame, _ in SAMPLES if isinstance(frame, f.CLIENT_FRAME_TYPES)]
SERVER_SAMPLES = [frame for frame, _ in SAMPLES if isinstance(frame, f.SERVER_FRAME_TYPES)]


# --- hypothesis strategies of valid frames -----------------------------------------

u64 = st.integers(0, MAX_U64)
ids = st.integers(1, MAX_U64)
opaque = st.one_of(u64, st.text(max_size=20), st.binary(max_size=20))
cmid = st.text(min_size=1, max_size=64).filter(lambda s: len(s.encode()) <= 64)
id_tuples = st.lists(ids, max_size=5).map(tuple)
msg_records = st.builds(
    f.MsgRecord, u64, u64, u64, u64, st.binary(max_size=30), u64, st.text(max_size=10)
)
conv_records = st.builds(f.ConvRecord, ids, u64, u64, u64, u64, u64, u64, st.booleans())

_FIELD: dict[str, st.SearchStrategy[Any]] = {
    "rid": ids,
    "v": st.integers(-(2**63), MAX_U64),
    "uid": ids,
    "device": st.text(max_size=40),
    "token": st.text(max_size=80),
    "caps": st.lists(st.text(min_size=1, max_size=32), max_size=16).map(tuple),
    "conv_id": ids,
    "client_msg_id": cmid,
    "msg_type": u64,
    "content": st.binary(max_size=100),
    "seq": u64,
    "uids": id_tuples,
    "since": opaque,
    "cursor": opaque,
    "limit": u64,
    "after_seq": u64,
    "before_seq": u64,
    "peer_uid": ids,
    "title": st.text(max_size=20),
    "add": id_tuples,
    "remove": id_tuples,
    "node": st.text(max_size=20),
    "hb": u64,
    "idle": u64,
    "max_frame": u64,
    "max_content": u64,
    "ts": u64,
    "msg_id": u64,
    "server_ms": u64,
    "sender_uid": u64,
    "reader_uid": ids,
    "entries": st.lists(
        st.tuples(ids, st.lists(st.text(max_size=8), max_size=3).map(tuple)), max_size=4
    ).map(tuple),
    "next_since": opaque,
    "next_cursor": opaque,
    "has_more": st.booleans(),
    "convs": st.lists(conv_records, max_size=4).map(tuple),
    "partial": st.none() | st.builds(f.SyncPartial, u64, u64),
    "msgs": st.lists(msg_records, max_size=4).map(tuple),
    "recall_seq": u64,
    "owner_uid": ids,
    "reason": u64,
    "text": st.text(max_size=30),
    "reconnect_hint": st.text(max_size=30),
    "code": u64,
    "sha256": st.text(max_size=70),
    "size": u64,
    "content_type": st.text(max_size=30),
    "key": st.text(max_size=100),
    "url": st.text(max_size=100),
    "expires_ms": u64,
    "provider": st.from_regex(r"[a-z0-9_-]{1,16}", fullmatch=True),
    "preview": st.booleans(),
    "locale": st.from_regex(r"[A-Za-z0-9_-]{0,35}", fullmatch=True),
    "until_ms": u64,
}
_OVERRIDE: dict[tuple[type, str], st.SearchStrategy[Any]] = {
    (f.Push, "client_msg_id"): st.text(max_size=64),  # "" for server-written messages
    (f.Error, "rid"): u64,  # 0 for frames without rid
    (f.PushRegister, "token"): st.text(min_size=1, max_size=600).filter(
        lambda s: len(s.encode()) <= 2048
    ),
}


def frames_of(cls: type[f.Frame]) -> st.SearchStrategy[f.Frame]:
    fields = {name: _OVERRIDE.get((cls, name), _FIELD[name]) for name in cls.__match_args__}
    return st.builds(cls, **fields)


client_frames = st.one_of(*(frames_of(cls) for cls in f.CLIENT_FRAME_TYPES))
server_frames = st.one_of(*(frames_of(cls) for cls in f.SERVER_FRAME_TYPES))
