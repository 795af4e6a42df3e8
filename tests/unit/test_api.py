"""The server API's pieces that need no gateway: ids in and out of JSON, the session a
call runs as, the broadcast budget, and the kick envelope."""

from __future__ import annotations

import asyncio

import pytest

from gateway import envelope
from gateway.http.api import STATUS, ApiError, Call, as_id, content_of
from gateway.http.jsonout import JSON_SAFE_MAX, out_id
from gateway.ratelimit import Bucket
from protocol.frames import Error, Ok
from protocol.ops import ErrorCode, KickReason


def test_ids_are_numbers_or_decimal_strings_both_ways() -> None:
    assert as_id(7, "uid") == 7
    assert as_id("18446744073709551615", "uid") == 2**64 - 1
    assert as_id(0, "sender_uid", zero=True) == 0
    fullwidth_one = "\uff11"  # a digit to str.isdigit, not to an id
    for bad in (0, -1, 2**64, True, 1.0, "0x10", " 5", fullwidth_one, None, "1" * 21):
        with pytest.raises(ApiError) as e:
            as_id(bad, "uid")
        assert e.value.code == ErrorCode.BAD_REQUEST and e.value.status == 400
    assert out_id(JSON_SAFE_MAX) == JSON_SAFE_MAX
    assert out_id(JSON_SAFE_MAX + 1) == str(JSON_SAFE_MAX + 1)


def test_content_is_text_or_base64_never_both() -> None:
    assert content_of({"text": "hé"}) == "hé".encode()
    assert content_of({"content_b64": "AAE="}) == b"\x00\x01"
    for body in ({}, {"text": "a", "content_b64": "AA=="}, {"content_b64": "!!"}, {"text": 5}):
        with pytest.raises(ApiError):
            content_of(body)


def test_every_error_code_has_a_status() -> None:
    assert set(STATUS) >= set(ErrorCode) - {
        ErrorCode.BAD_FRAME,
        ErrorCode.FRAME_TOO_LARGE,
        ErrorCode.NOT_LOGGED_IN,
        ErrorCode.VERSION_UNSUPPORTED,
    }
    assert STATUS[ErrorCode.UNAVAILABLE] == STATUS[ErrorCode.OUTCOME_UNKNOWN] == 503


async def test_a_call_keeps_its_first_reply() -> None:
    call = Call(asyncio.get_running_loop(), 5, "api")
    assert (call.uid, call.device, call.active) == (5, "api", True)
    call.error(1, ErrorCode.NOT_MEMBER, "no")
    call.send(Ok(1))
    assert await call.reply == Error(1, int(ErrorCode.NOT_MEMBER), "no")


def test_the_broadcast_budget_takes_all_or_nothing() -> None:
    now = [0.0]
    bucket = Bucket(10, 2.0, lambda: now[0])
    assert bucket.take(7)
    assert not bucket.take(4)  # 3 left: nothing taken
    assert bucket.take(3)
    now[0] += 2.0  # 4 more
    assert not bucket.take(5)
    assert bucket.take(4)
    now[0] += 100.0
    assert bucket.take(10) and not bucket.take(1)  # never above the burst


def test_a_kick_envelope_carries_its_reason_and_text() -> None:
    kind, items = envelope.unpack(envelope.kick_as([3, 4], KickReason.SHUTDOWN, "bye"))
    assert kind == envelope.KICK_AS
    [(conn_ids, payload)] = items
    assert conn_ids == [3, 4]
    assert envelope.kick_reason(payload) == (KickReason.SHUTDOWN, "bye")
    with pytest.raises(ValueError):
        envelope.kick_reason(envelope.unpack(envelope.kick([1]))[1][0][1] or b"\x90")
