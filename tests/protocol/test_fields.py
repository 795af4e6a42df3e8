"""Well-framed but unacceptable frames become Invalid and the connection lives on."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import frames as f
from protocol import parsers
from protocol.codec import encode, frame_bytes
from protocol.decoder import FrameDecoder, Side, decode_body
from protocol.ops import MAX_U64, ErrorCode, Op
from tests.support.tiers import examples

UNKNOWN = ErrorCode.UNKNOWN_OP
BAD = ErrorCode.BAD_REQUEST
LOGIN_MAP = {"v": 1, "uid": 42, "device": "ios", "token": "t"}
OK_MAP = {"node": "n", "hb": 30, "idle": 75, "max_frame": 65536, "max_content": 2048, "ts": 1}


def decode(body: list[Any], side: Side = Side.SERVER) -> f.Frame | f.Invalid:
    """Decode one body through a FrameDecoder; it must not raise."""
    decoder = FrameDecoder(side=side)
    [result] = decoder.feed(frame_bytes(msgpack.packb(body, use_bin_type=True)))
    return result


def invalid(body: list[Any], side: Side = Side.SERVER) -> f.Invalid:
    result = decode(body, side)
    assert isinstance(result, f.Invalid), result
    return result


@pytest.mark.parametrize(
    ("body", "rid"),
    [
        ([99, 7], 7),
        ([99, 7, "extra"], 7),
        ([99], 0),
        ([99, "7"], 0),
        ([99, -7], 0),
        ([99, True], 0),
        ([99, 1.5], 0),
        ([99, MAX_U64], MAX_U64),
        ([MAX_U64, 3], 3),
        ([2**32, 3], 3),
    ],
)
def test_unknown_op(body: list[Any], rid: int) -> None:
    result = invalid(body)
    assert (result.op, result.rid, result.code) == (body[0], rid, UNKNOWN)
    assert str(body[0]) in result.text


@pytest.mark.parametrize("frame", [f.Push(9, 1, 2, 3, 1, b"", 1, ""), f.Pong(), f.Ok(4)])
def test_server_op_sent_to_the_server_is_unknown(frame: f.Frame) -> None:
    [result] = FrameDecoder(side=Side.SERVER).feed(encode(frame))
    assert isinstance(result, f.Invalid)
    assert result.code is UNKNOWN and result.op == frame.OP
    assert frame.OP.name in result.text


@pytest.mark.parametrize("frame", [f.Send(4, 9, "c", 1, b""), f.Ping(), f.Read(9, 1)])
def test_client_op_sent_to_a_client_is_unknown(frame: f.Frame) -> None:
    [result] = FrameDecoder(side=Side.CLIENT).feed(encode(frame))
    assert isinstance(result, f.Invalid)
    assert result.code is UNKNOWN and result.op == frame.OP


def test_decoding_goes_on_after_invalid() -> None:
    data = (
        frame_bytes(msgpack.packb([99, 1])) + frame_bytes(msgpack.packb([10, 2])) + encode(f.Ping())
    )
    decoder = FrameDecoder(side=Side.SERVER)
    first, second, third = decoder.feed(data)
    assert isinstance(first, f.Invalid) and first.code is UNKNOWN
    assert isinstance(second, f.Invalid) and second.code is BAD and second.rid == 2
    assert third == f.Ping()
    assert not decoder.failed


SEND_OK = [10, 7, 9, "cmid", 1, b"hi"]


@pytest.mark.parametrize(
    ("body", "rid", "field"),
    [
        ([10], 0, "SEND"),
        ([10, 7, 9, "cmid", 1], 7, "SEND"),
        ([10, 0, 9, "cmid", 1, b"hi"], 0, "SEND.rid"),
        ([10, True, 9, "cmid", 1, b"hi"], 0, "SEND.rid"),
        ([10, "7", 9, "cmid", 1, b"hi"], 0, "SEND.rid"),
        ([10, -7, 9, "cmid", 1, b"hi"], 0, "SEND.rid"),
        ([10, 7, 0, "cmid", 1, b"hi"], 7, "SEND.conv_id"),
        ([10, 7, True, "cmid", 1, b"hi"], 7, "SEND.conv_id"),
        ([10, 7, 9.0, "cmid", 1, b"hi"], 7, "SEND.conv_id"),
        ([10, 7, 9, "", 1, b"hi"], 7, "SEND.client_msg_id"),
        ([10, 7, 9, "x" * 65, 1, b"hi"], 7, "SEND.client_msg_id"),
        ([10, 7, 9, "é" * 33, 1, b"hi"], 7, "SEND.client_msg_id"),
        ([10, 7, 9, b"cmid", 1, b"hi"], 7, "SEND.client_msg_id"),
        ([10, 7, 9, "cmid", False, b"hi"], 7, "SEND.msg_type"),
        ([10, 7, 9, "cmid", -1, b"hi"], 7, "SEND.msg_type"),
        ([10, 7, 9, "cmid", 1, "hi"], 7, "SEND.content"),
        ([10, 7, 9, "cmid", 1, None], 7, "SEND.content"),
        ([21, 9], 0, "DELIVERED"),
        ([21, 0, 1], 0, "DELIVERED.conv_id"),
        ([21, 9, -1], 0, "DELIVERED.seq"),
        ([22, 9, True], 0, "READ.seq"),
        ([22, 9, "1"], 0, "READ.seq"),
        ([24, 0], 0, "TYPING.conv_id"),
        ([24, False], 0, "TYPING.conv_id"),
        ([26, 3, [1, 0]], 3, "PRESENCE.uids"),
        ([26, 3, [1, True]], 3, "PRESENCE.uids"),
        ([26, 3, (1).to_bytes(1, "big")], 3, "PRESENCE.uids"),
        ([26, 3, {"1": 1}], 3, "PRESENCE.uids"),
        ([30, 4, 1.5, 0, 0], 4, "SYNC.since"),
        ([30, 4, 0, None, 0], 4, "SYNC.cursor"),
        ([30, 4, 0, -1, 0], 4, "SYNC.cursor"),
        ([30, 4, 0, 0, -1], 4, "SYNC.limit"),
        ([30, 4, 0, 0, "50"], 4, "SYNC.limit"),
        ([32, 5, 0, 0, 50], 5, "PULL.conv_id"),
        ([32, 5, 9, -1, 50], 5, "PULL.after_seq"),
        ([34, 6, 9, 0, True], 6, "HISTORY.limit"),
        ([40, 7, 9, "11"], 7, "RECALL.seq"),
        ([50, 8, 0], 8, "OPEN_P2P.peer_uid"),
        ([52, 9, b"title", [2]], 9, "GROUP_CREATE.title"),
        ([52, 9, "t", [2, "3"]], 9, "GROUP_CREATE.uids"),
        ([52, 9, "t"], 9, "GROUP_CREATE"),
        ([54, 10, 9, [4], 2], 10, "GROUP_MEMBERS.remove"),
        ([54, 10, 9, [0], []], 10, "GROUP_MEMBERS.add"),
        ([56, 11, -9], 11, "GROUP_INFO.conv_id"),
        ([80, 14, "apns", "t"], 14, "PUSH_REGISTER"),
        ([80, 0, "apns", "t", {}], 0, "PUSH_REGISTER.rid"),
        ([80, 14, "", "t", {}], 14, "PUSH_REGISTER.provider"),
        ([80, 14, "APNS", "t", {}], 14, "PUSH_REGISTER.provider"),
        ([80, 14, "web push", "t", {}], 14, "PUSH_REGISTER.provider"),
        ([80, 14, "p" * 17, "t", {}], 14, "PUSH_REGISTER.provider"),
        ([80, 14, b"apns", "t", {}], 14, "PUSH_REGISTER.provider"),
        ([80, 14, "apns", "", {}], 14, "PUSH_REGISTER.token"),
        ([80, 14, "apns", b"t", {}], 14, "PUSH_REGISTER.token"),
        ([80, 14, "apns", "x" * 2049, {}], 14, "PUSH_REGISTER.token"),
        ([80, 14, "apns", "é" * 1025, {}], 14, "PUSH_REGISTER.token"),
        ([80, 14, "apns", "t", None], 14, "PUSH_REGISTER.opts"),
        ([80, 14, "apns", "t", [True, ""]], 14, "PUSH_REGISTER.opts"),
        ([80, 14, "apns", "t", {"preview": 1}], 14, "PUSH_REGISTER.opts.preview"),
        ([80, 14, "apns", "t", {"preview": None}], 14, "PUSH_REGISTER.opts.preview"),
        ([80, 14, "apns", "t", {"locale": None}], 14, "PUSH_REGISTER.opts.locale"),
        ([80, 14, "apns", "t", {"locale": "x" * 36}], 14, "PUSH_REGISTER.opts.locale"),
        ([80, 14, "apns", "t", {"locale": "en US"}], 14, "PUSH_REGISTER.opts.locale"),
        ([80, 14, "apns", "t", {"locale": b"en"}], 14, "PUSH_REGISTER.opts.locale"),
        ([82], 0, "PUSH_UNREGISTER"),
        ([82, 0], 0, "PUSH_UNREGISTER.rid"),
        ([84, 16, 9], 16, "MUTE"),
        ([84, 16, 0, 5], 16, "MUTE.conv_id"),
        ([84, 16, 9, -1], 16, "MUTE.until_ms"),
        ([84, 16, 9, True], 16, "MUTE.until_ms"),
        ([84, 16, 9, 1.5], 16, "MUTE.until_ms"),
        ([1, 1], 1, "LOGIN"),
        ([1, 0, LOGIN_MAP], 0, "LOGIN.rid"),
        ([1, 1, [1, 42, "ios", "t"]], 1, "LOGIN"),
        ([1, 1, {**LOGIN_MAP, "v": True}], 1, "LOGIN.v"),
        ([1, 1, {**LOGIN_MAP, "v": "1"}], 1, "LOGIN.v"),
        ([1, 1, {**LOGIN_MAP, "uid": 0}], 1, "LOGIN.uid"),
        ([1, 1, {**LOGIN_MAP, "uid": "42"}], 1, "LOGIN.uid"),
        ([1, 1, {**LOGIN_MAP, "device": 1}], 1, "LOGIN.device"),
        ([1, 1, {**LOGIN_MAP, "token": b"t"}], 1, "LOGIN.token"),
        ([1, 1, {k: v for k, v in LOGIN_MAP.items() if k != "token"}], 1, "LOGIN.token"),
        ([1, 1, {k: v for k, v in LOGIN_MAP.items() if k != "v"}], 1, "LOGIN.v"),
        ([1, 1, {**LOGIN_MAP, "caps": "outcome_unknown"}], 1, "LOGIN.caps"),
        ([1, 1, {**LOGIN_MAP, "caps": [1]}], 1, "LOGIN.caps"),
        ([1, 1, {**LOGIN_MAP, "caps": [""]}], 1, "LOGIN.caps"),
        ([1, 1, {**LOGIN_MAP, "caps": ["c"] * 17}], 1, "LOGIN.caps"),
    ],
)
def test_bad_client_fields(body: list[Any], rid: int, field: str) -> None:
    result = invalid(body)
    assert (result.op, result.rid, result.code) == (body[0], rid, BAD)
    assert result.text.startswith(field), result.text


@pytest.mark.parametrize(
    ("body", "rid", "field"),
    [
        ([2, 1, {**OK_MAP, "hb": True}], 1, "LOGIN_OK.hb"),
        ([2, 1, {k: v for k, v in OK_MAP.items() if k != "ts"}], 1, "LOGIN_OK.ts"),
        ([2, 1, {**OK_MAP, "node": b"n"}], 1, "LOGIN_OK.node"),
        ([11, 2, 9, -1, 1, 1], 2, "SEND_ACK.seq"),
        ([20, 9, 1, 2, 3, 1, "hi", 1, ""], 0, "PUSH.content"),
        ([20, 9, 1, 2, 3, 1, b"hi", 1, None], 0, "PUSH.client_msg_id"),
        ([20, 0, 1, 2, 3, 1, b"hi", 1, ""], 0, "PUSH.conv_id"),
        ([20, 9, 1, 2, 3, 1, b"hi", 1], 0, "PUSH"),
        ([23, 9, 0, 1], 0, "READ_NOTIFY.reader_uid"),
        ([27, 3, [[1, "ios"]]], 3, "PRESENCE_RESULT.entries [0]"),
        ([27, 3, [[0, []]]], 3, "PRESENCE_RESULT.entries [0]"),
        ([27, 3, [1]], 3, "PRESENCE_RESULT.entries [0]"),
        ([31, 4, 1, 0, 1, []], 4, "SYNC_RESULT.has_more"),
        ([31, 4, 1, 0, False, [[1, 1, 0, 0, 0, 0, 0, 1]]], 4, "SYNC_RESULT.convs [0].is_member"),
        ([31, 4, 1, 0, False, [[1, 1, 0, 0, 0, 0, 0]]], 4, "SYNC_RESULT.convs [0]"),
        ([31, 4, 1, 0, False, [[0, 1, 0, 0, 0, 0, 0, True]]], 4, "SYNC_RESULT.convs [0].conv_id"),
        ([31, 4, 1.0, 0, False, []], 4, "SYNC_RESULT.next_since"),
        ([33, 5, 9, None, []], 5, "PULL_RESULT.has_more"),
        (
            [33, 5, 9, True, [[1, 2, 3, 1, b"x", 1, ""], [1, 2, 3, 1, "x", 1, ""]]],
            5,
            "PULL_RESULT.msgs [1].content",
        ),
        ([33, 5, 9, True, [[1, 2, 3, 1, b"x", 1]]], 5, "PULL_RESULT.msgs [0]"),
        ([33, 5, 9, True, [[1, 2, -3, 1, b"x", 1, ""]]], 5, "PULL_RESULT.msgs [0].sender_uid"),
        ([33, 5, 9, True, "msgs"], 5, "PULL_RESULT.msgs"),
        ([35, 6, 9, False, [[1, 2, 3, 1, b"x", True, ""]]], 6, "HISTORY_RESULT.msgs [0].server_ms"),
        ([41, 7, 9, "14"], 7, "RECALL_OK.recall_seq"),
        ([51, 0, 9], 0, "CONV_OK.rid"),
        ([55], 0, "OK"),
        ([57, 11, 9, "t", 0, [2]], 11, "GROUP_INFO_RESULT.owner_uid"),
        ([81], 0, "PUSH_REGISTER_OK"),
        ([81, 0], 0, "PUSH_REGISTER_OK.rid"),
        ([60, 1, "", None], 0, "KICK.reconnect_hint"),
        ([60, True, "", ""], 0, "KICK.reason"),
        ([127, -1, 4, ""], 0, "ERROR.rid"),
        ([127, 0, 4, b""], 0, "ERROR.text"),
    ],
)
def test_bad_server_fields(body: list[Any], rid: int, field: str) -> None:
    result = invalid(body, Side.CLIENT)
    assert (result.op, result.rid, result.code) == (body[0], rid, BAD)
    assert result.text.startswith(field), result.text


def test_extra_elements_and_unknown_keys_are_ignored() -> None:
    assert decode([*SEND_OK, "future", [1, 2]]) == f.Send(7, 9, "cmid", 1, b"hi")
    assert decode([3, "future"]) == f.Ping()
    assert decode([21, 9, 5, None]) == f.Delivered(9, 5)
    login = [1, 1, {**LOGIN_MAP, "zone": "eu", 7: 8, b"k": None}, "extra"]
    assert decode(login) == f.Login(1, 1, 42, "ios", "t")
    ok = [2, 1, {**OK_MAP, "region": "eu"}]
    assert decode(ok, Side.CLIENT) == f.LoginOk(1, "n", 30, 75, 65536, 2048, 1)
    pull = [33, 5, 9, False, [[1, 2, 3, 1, b"x", 1, "", "future"]], "extra"]
    assert decode(pull, Side.CLIENT) == f.PullResult(
        5, 9, False, (f.MsgRecord(1, 2, 3, 1, b"x", 1, ""),)
    )
    sync = [31, 4, 1, 0, False, [[1, 1, 0, 0, 0, 0, 0, True, "future"]]]
    assert decode(sync, Side.CLIENT) == f.SyncResult(
        4, 1, 0, False, (f.ConvRecord(1, 1, 0, 0, 0, 0, 0, True),)
    )
    assert decode([27, 3, [[1, ["a"], "x"]]], Side.CLIENT) == f.PresenceResult(3, ((1, ("a",)),))


def test_a_partial_sync_result_carries_its_missing_servers() -> None:
    head = [31, 4, b"S", 0, False, []]
    partial = {"missing": 1, "servers": 3, "future": [1]}
    assert decode([*head, partial, "extra"], Side.CLIENT) == f.SyncResult(
        4, b"S", 0, False, (), f.SyncPartial(1, 3)
    )
    for bad in ([1, 3], {"missing": 1}, {"missing": -1, "servers": 3}):
        result = decode([*head, bad], Side.CLIENT)
        assert isinstance(result, f.Invalid), bad
        assert "partial" in result.text


def test_push_register_opts_default_and_unknown_keys_are_ignored() -> None:
    assert decode([80, 14, "apns", "t", {}]) == f.PushRegister(14, "apns", "t", False, "")
    opts = {"preview": True, "sound": "ping", 7: 8, b"locale": 1}
    assert decode([80, 14, "apns", "t", opts, "extra"]) == f.PushRegister(14, "apns", "t", True)
    assert decode([80, 14, "fcm", "t", {"locale": "pt_BR"}]) == f.PushRegister(
        14, "fcm", "t", False, "pt_BR"
    )


@pytest.mark.parametrize(
    ("provider", "token", "locale"),
    [
        ("a", "x", ""),
        ("p" * 16, "x" * 2048, "x" * 35),
        ("web-push_2", "é" * 1024, "zh-Hant-TW"),
        ("apns", "😀" * 512, "en"),
        ("apns", "a" + "é" * 1023 + "b", "en"),
    ],
)
def test_push_register_bounds(provider: str, token: str, locale: str) -> None:
    body = [80, 14, provider, token, {"locale": locale}]
    assert decode(body) == f.PushRegister(14, provider, token, False, locale)


def test_values_the_gateway_checks_still_decode() -> None:
    # Version, device pattern, msg_type and content size are the gateway's business.
    assert decode([1, 1, {**LOGIN_MAP, "v": 99}]) == f.Login(1, 99, 42, "ios", "t")
    assert decode([1, 1, {**LOGIN_MAP, "v": -1}]) == f.Login(1, -1, 42, "ios", "t")
    assert decode([1, 1, {**LOGIN_MAP, "device": "bad device!"}]) == f.Login(
        1, 1, 42, "bad device!", "t"
    )
    assert decode([10, 7, 9, "c", 5, b"x" * 5000]) == f.Send(7, 9, "c", 5, b"x" * 5000)
    assert decode([50, 8, 8]) == f.OpenP2P(8, 8)


@pytest.mark.parametrize("cmid", ["x", "x" * 64, "é" * 32, "☃" * 21, "😀" * 16, "a" * 17, "é" * 17])
def test_client_msg_id_bounds(cmid: str) -> None:
    assert decode([10, 7, 9, cmid, 1, b""]) == f.Send(7, 9, cmid, 1, b"")


@pytest.mark.parametrize("cmid", ["x" * 65, "é" * 33, "☃" * 22, "😀" * 17, ""])
def test_client_msg_id_too_long(cmid: str) -> None:
    assert invalid([10, 7, 9, cmid, 1, b""]).text.startswith("SEND.client_msg_id")


def test_ints_at_the_u64_edges() -> None:
    assert decode([21, MAX_U64, MAX_U64]) == f.Delivered(MAX_U64, MAX_U64)
    assert decode([21, 1, 0]) == f.Delivered(1, 0)
    assert invalid([21, 1, -(2**63)]).code is BAD


def test_ext_types_are_bad_requests() -> None:
    body = msgpack.packb([21, 9, msgpack.ExtType(5, b"x")])
    [result] = FrameDecoder(side=Side.SERVER).feed(frame_bytes(body))
    assert isinstance(result, f.Invalid) and result.code is BAD


def test_invalid_rid_is_zero_for_ops_without_rid() -> None:
    # DELIVERED's second element is a conv_id, not a rid.
    assert invalid([21, 9, "x"]).rid == 0
    assert invalid([20, 9, 1, 2, 3, 1, "x", 1, ""], Side.CLIENT).rid == 0


def test_decode_body_helper() -> None:
    body = msgpack.packb(SEND_OK, use_bin_type=True)
    assert decode_body(body, Side.SERVER) == f.Send(7, 9, "cmid", 1, b"hi")
    assert isinstance(decode_body(body, Side.CLIENT), f.Invalid)


# --- the hot paths accept exactly what the generic parsers accept -----------------

_value = st.one_of(
    st.integers(-3, 3),
    st.integers(-(2**63), MAX_U64),
    st.booleans(),
    st.none(),
    st.text(max_size=70),
    st.binary(max_size=5),
    st.floats(allow_nan=False),
    st.lists(st.integers(0, 3), max_size=2),
)

_HOT = [
    (Op.SEND, parsers._send, parsers._send_checked, 5),
    (Op.DELIVERED, parsers._delivered, parsers._delivered_checked, 2),
    (Op.READ, parsers._read, parsers._read_checked, 2),
    (Op.PUSH, parsers._push, parsers._push_checked, 8),
]


def _outcome(parse: Any, body: list[Any]) -> object:
    try:
        return parse(body)
    except parsers.FieldError as exc:
        return ("error", str(exc))


@settings(max_examples=examples(500), deadline=None)
@given(st.sampled_from(_HOT), st.lists(_value, max_size=10))
def test_hot_parsers_agree_with_generic(hot: Any, values: list[Any]) -> None:
    op, fast, generic, _ = hot
    body = [op, *values]
    assert _outcome(fast, body) == _outcome(generic, body)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.lists(_value, min_size=6, max_size=8), max_size=4))
def test_msg_records_agree_with_generic(records: list[list[Any]]) -> None:
    assert _outcome(parsers.msg_records, records) == _outcome(parsers._msg_records_checked, records)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.sampled_from(_HOT),
    st.data(),
)
def test_hot_parsers_agree_on_nearly_valid_bodies(hot: Any, data: st.DataObject) -> None:
    # Valid bodies with one field replaced: exercises each check of the fast path.
    op, fast, generic, n = hot
    samples = {
        Op.SEND: [7, 9, "cmid", 1, b"hi"],
        Op.DELIVERED: [9, 5],
        Op.READ: [9, 5],
        Op.PUSH: [9, 1, 2, 0, 6, b"", 1, ""],
    }
    values = list(samples[op])
    i = data.draw(st.integers(0, n - 1))
    values[i] = data.draw(_value)
    body = [op, *values]
    assert _outcome(fast, body) == _outcome(generic, body)
