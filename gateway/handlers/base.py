"""What every handler shares: the request error and the membership checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol.ops import ErrorCode
from storage.models import Membership

if TYPE_CHECKING:
    from gateway.ports import Services


class RequestError(Exception):
    """Raised by a handler to answer the request with ERROR `code`."""

    def __init__(self, code: ErrorCode, text: str = "") -> None:
        super().__init__(text or code.name.lower())
        self.code = code
        self.text = text or code.name.lower()


async def require_member(node: Services, conv_id: int, uid: int) -> Membership:
    """The caller's current membership, or not_member / no_such_conversation."""
    m = await node.store.get_membership(conv_id, uid)
    if m is not None and m.active:
        return m
    raise await membership_error(node, conv_id)


async def require_reader(node: Services, conv_id: int, uid: int) -> Membership:
    """Membership allowing reads: current members, and former members up to the message
    that removed them (so a removed member can fetch its own removal)."""
    m = await node.store.get_membership(conv_id, uid)
    if m is not None:
        return m
    raise await membership_error(node, conv_id)


async def membership_error(node: Services, conv_id: int) -> RequestError:
    if await node.store.get_conversation(conv_id) is None:
        return RequestError(ErrorCode.NO_SUCH_CONVERSATION, f"no conversation {conv_id}")
    return RequestError(ErrorCode.NOT_MEMBER, f"not a member of conversation {conv_id}")


def page_limit(requested: int, default: int, cap: int) -> int:
    """`limit` 0 means the default; every limit is capped."""
    return default if requested == 0 else min(requested, cap)
