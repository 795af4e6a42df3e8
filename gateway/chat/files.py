"""`imgw chat`'s files: `/send PATH` asks the gateway for an upload URL (MEDIA_UPLOAD),
PUTs the file there over HTTP and sends a media message carrying the key; a media
message that arrives is shown with the download URL the gateway signs for it
(MEDIA_GET). The PUT goes through aiohttp, to the URL exactly as signed (not re-quoted:
its signature covers the query)."""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
import os
from typing import Final

import aiohttp
from yarl import URL

from gateway.client import Client
from protocol.frames import SendAck
from protocol.mediakeys import key_of_content, media_content
from protocol.ops import MsgType

UPLOAD_TIMEOUT_S: Final = 300.0


def _read(path: str) -> tuple[bytes, str, str]:
    with open(path, "rb") as fh:
        data = fh.read()
    ctype = mimetypes.guess_type(path)[0] or "application/octet-stream"
    return data, hashlib.sha256(data).hexdigest(), ctype


def msg_type_of(content_type: str) -> MsgType:
    major = content_type.split("/", 1)[0]
    return {"image": MsgType.IMAGE, "audio": MsgType.VOICE}.get(major, MsgType.FILE)


async def send_file(client: Client, conv_id: int, path: str) -> tuple[SendAck, str]:
    """Upload the file at `path` and send it to `conv_id`; the ack and the key. Raises
    OSError (the file, the upload) or ClientError (the gateway refused)."""
    data, sha256, ctype = await asyncio.to_thread(_read, path)
    signed = await client.media_upload(sha256, len(data), ctype)
    if signed.url:  # "": stored already
        status, text = await _put(signed.url, data, ctype)
        if status >= 300:
            raise OSError(f"upload refused: HTTP {status} {text.strip()}")
    content = media_content(signed.key, name=os.path.basename(path), size=len(data), type=ctype)
    ack = await client.send(conv_id, content, msg_type_of(ctype))
    return ack, signed.key


async def _put(url: str, data: bytes, ctype: str) -> tuple[int, str]:
    """PUT `data` to a signed upload URL; the status and the answer's text."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=UPLOAD_TIMEOUT_S)) as http,
            http.put(
                URL(url, encoded=True),
                data=data,
                headers={"Content-Type": ctype},
                allow_redirects=False,
            ) as reply,
        ):
            return reply.status, (await reply.read()).decode("utf-8", "replace")
    except (aiohttp.ClientError, TimeoutError) as e:
        raise OSError(f"upload failed: {str(e) or repr(e)}") from e


def media_key_in(msg_type: int, content: bytes) -> str | None:
    """The key a media message carries, if it is one."""
    if msg_type not in (MsgType.IMAGE, MsgType.VOICE, MsgType.FILE):
        return None
    return key_of_content(content)
