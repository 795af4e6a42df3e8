"""MEDIA_UPLOAD and MEDIA_GET (docs/protocol.md, Media), and the check a media SEND
makes before it is queued (gateway/media.py does the work)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.handlers.base import RequestError, require_member
from gateway.media import Media, MediaError
from protocol.frames import MediaGet, MediaUpload, MediaUrl
from protocol.ops import ErrorCode

if TYPE_CHECKING:
    from gateway.ports import Services, Session

_DISABLED = "media is not enabled on this server"


def _media(node: Services) -> Media:
    if node.media is None:
        raise RequestError(ErrorCode.FORBIDDEN, _DISABLED)
    return node.media


def _refused(node: Services, op: str, e: MediaError) -> RequestError:
    node.metrics.media.labels(op=op, result=e.code.name.lower()).inc()
    return RequestError(e.code, e.text)


async def media_upload(node: Services, conn: Session, f: MediaUpload) -> None:
    media = _media(node)
    try:
        signed = await media.upload(conn.uid, f.sha256, f.size, f.content_type)
    except MediaError as e:
        raise _refused(node, "upload", e) from None
    node.metrics.media.labels(op="upload", result="ok").inc()
    conn.send(MediaUrl(f.rid, signed.key, signed.url, signed.expires_ms))


async def media_get(node: Services, conn: Session, f: MediaGet) -> None:
    media = _media(node)

    async def may_read(conv_id: int) -> bool:
        m = await node.store.get_membership(conv_id, conn.uid)
        return m is not None and m.active

    try:
        signed = await media.download(f.key, may_read)
    except MediaError as e:
        raise _refused(node, "get", e) from None
    node.metrics.media.labels(op="get", result="ok").inc()
    conn.send(MediaUrl(f.rid, signed.key, signed.url, signed.expires_ms))


async def check_media_send(node: Services, uid: int, conv_id: int, key: str) -> None:
    """A SEND carrying `key`: the sender must be a member and the key its stored upload;
    the conversation's reference is recorded (RequestError otherwise)."""
    media = _media(node)
    await require_member(node, conv_id, uid)
    try:
        await media.check_reference(uid, conv_id, key)
    except MediaError as e:
        raise _refused(node, "send", e) from None
    node.metrics.media.labels(op="send", result="ok").inc()
