"""MEDIA_UPLOAD's limits (gateway/media.py) answer the codes docs/protocol.md gives:
`content_too_large` over the size limit only; a size of 0 is `bad_request`."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.media import Media, MediaError
from protocol.ops import ErrorCode


def media() -> Media:
    nothing: Any = None  # refused before the index or the objects are asked anything
    return Media(nothing, nothing, max_size=1000, types=("image/*",), url_ttl_s=60,
                 orphan_ms=86_400_000, clock=lambda: 0)  # fmt: skip


@pytest.mark.parametrize(
    ("sha", "size", "ctype", "code"),
    [
        ("a" * 64, 0, "image/png", ErrorCode.BAD_REQUEST),
        ("a" * 64, 1001, "image/png", ErrorCode.CONTENT_TOO_LARGE),
        ("A" * 64, 10, "image/png", ErrorCode.BAD_REQUEST),
        ("a" * 64, 10, "text/html", ErrorCode.FORBIDDEN),
    ],
)
async def test_refusals_have_the_documented_codes(
    sha: str, size: int, ctype: str, code: ErrorCode
) -> None:
    with pytest.raises(MediaError) as e:
        await media().upload(1, sha, size, ctype)
    assert e.value.code == code
