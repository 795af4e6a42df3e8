"""The server API's contract, an OpenAPI 3.1 document built from the route table
(`gateway.http.api.ROUTES`): served at GET /api/v1/openapi.json and kept as
docs/openapi.json (`python -m gateway.http.openapi > docs/openapi.json`; a test checks
that they agree).

Each route has a hand-written entry in CALLS: its parameters (the body's keys, or a
GET's query parameters) with their JSON Schemas, the 200 answer's schema, and the error
statuses it can answer. `document()` refuses to build when a route and its entry name
different keys, so a key added to a call without its schema fails the tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Final

from gateway.handlers.conversations import GROUP_MAX_MEMBERS, TITLE_MAX_BYTES
from gateway.handlers.messaging import MSG_LIMIT_DEFAULT, MSG_LIMIT_MAX
from gateway.handlers.receipts import PRESENCE_MAX_UIDS
from gateway.handlers.sync import CONV_LIMIT_DEFAULT, CONV_LIMIT_MAX
from gateway.http import api
from gateway.http.jsonout import JSON_SAFE_MAX
from gateway.http.keys import KEY_SCOPES
from protocol.ops import CLIENT_MSG_ID_MAX_BYTES, CLIENT_MSG_TYPES, MAX_U64, KickReason

Schema = dict[str, Any]

# The admin listener's limits on a request body (gateway/http/admin.py imports this
# module, so the figures are repeated here; a test holds them equal).
MAX_BODY_KIB: Final = 256
BODY_TIMEOUT_S: Final = 10


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(props: Mapping[str, Schema], optional: Iterable[str] = ()) -> Schema:
    """A JSON object with these keys and no others, each required but the `optional`."""
    schema: Schema = {"type": "object", "properties": dict(props), "additionalProperties": False}
    required = sorted(set(props) - set(optional))
    if required:
        schema["required"] = required
    return schema


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _limit(default: int, cap: int) -> Schema:
    return {"type": "integer", "minimum": 1, "maximum": cap, "default": default}


_DIGITS: Final = "^[0-9]{1,20}$"
_DEVICE: Final = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,32}$"}
_TEXT: Final = {"type": "string", "description": "sent as its UTF-8 bytes"}
_CONTENT_B64: Final = {
    "type": "string",
    "description": "standard base64, padded",
    "pattern": "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
}
_MSG_TYPE: Final = {
    "description": "a client message type: 1 text, 2 image, 3 voice, 4 file, 100-127 the app's",
    "anyOf": [{"type": "integer", "minimum": lo, "maximum": hi} for lo, hi in CLIENT_MSG_TYPES],
    "default": 1,
}

SCHEMAS: Final[dict[str, Schema]] = {
    "Id": {
        "description": "An id in 1..2^64-1: a JSON integer, or a decimal string (ids above "
        "2^53-1 lose precision as JSON numbers in many languages).",
        "oneOf": [
            {"type": "integer", "minimum": 1, "maximum": MAX_U64},
            {"type": "string", "pattern": "^0*[1-9][0-9]*$", "maxLength": 20},
        ],
    },
    "IdOrZero": {
        "description": "An id or 0, as Id.",
        "oneOf": [
            {"type": "integer", "minimum": 0, "maximum": MAX_U64},
            {"type": "string", "pattern": _DIGITS},
        ],
    },
    "OutId": {
        "description": "An id, seq or uid in an answer: a JSON integer up to 2^53-1, a "
        "decimal string above.",
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": JSON_SAFE_MAX},
            {"type": "string", "pattern": "^[0-9]+$"},
        ],
    },
    "Message": {
        "description": "A stored message: content_b64 always, text for a client type whose "
        "content is UTF-8, event (the decoded map) for a system message (msg_type 6).",
        **_object(
            {
                "seq": _ref("OutId"),
                "msg_id": {"type": "string", "pattern": "^[0-9]+$"},
                "sender_uid": _ref("OutId"),
                "msg_type": {"type": "integer", "minimum": 0},
                "content_b64": _CONTENT_B64,
                "server_ms": {"type": "integer"},
                "client_msg_id": {"type": "string"},
                "text": {"type": "string"},
                "event": {"type": "object"},
            },
            optional=("text", "event"),
        ),
    },
    "UserConversation": _object(
        {
            "conv_id": _ref("OutId"),
            "kind": {"enum": ["group", "p2p"]},
            "max_seq": _ref("OutId"),
            "read_seq": _ref("OutId"),
            "delivered_seq": _ref("OutId"),
            "unread": {"type": "integer", "minimum": 0},
            "last_active_ms": {"type": "integer"},
            "is_member": {"type": "boolean"},
        }
    ),
    "Error": _object(
        {
            "error": _object(
                {
                    "code": {
                        "description": "the protocol's error name (docs/protocol.md)",
                        "type": "string",
                        "pattern": "^[a-z_]+$",
                    },
                    "message": {"type": "string", "description": "for people"},
                }
            )
        }
    ),
}

# The error answers: status -> (description, the codes it carries, headers).
ERRORS: Final[dict[int, tuple[str, tuple[str, ...], tuple[str, ...]]]] = {
    400: (
        "A malformed request: a body that is no JSON object, an unknown key or query "
        "parameter, a bad id, limit or cursor, a missing key; bad_msg_type for a reserved "
        "msg_type.",
        ("bad_request", "bad_msg_type"),
        (),
    ),
    401: ("No credentials, or unknown ones.", ("auth_failed",), ("WWW-Authenticate",)),
    403: (
        "forbidden: the API key lacks the call's scope, or the uid may not do this (not the "
        "owner, in max_conversations already); not_member: the uid is not a member; "
        "recall_denied; content_denied: the content check refused the message.",
        ("forbidden", "not_member", "recall_denied", "content_denied"),
        (),
    ),
    404: (
        "No such conversation or message; unknown_op: the path is no call.",
        ("no_such_conversation", "no_such_message", "unknown_op"),
        (),
    ),
    405: (
        "A known path with another method: Allow lists the methods it takes.",
        ("bad_request",),
        ("Allow",),
    ),
    408: (f"The body did not arrive within {BODY_TIMEOUT_S} s.", ("bad_request",), ()),
    409: (
        "The client_msg_id was used for another message (conversation, type or content).",
        ("idempotency_conflict",),
        (),
    ),
    413: (
        f"The content is over max_content bytes, or the body over {MAX_BODY_KIB} KiB.",
        ("content_too_large",),
        (),
    ),
    429: ("A budget is spent: retry later.", ("rate_limited",), ()),
    503: (
        "The node is draining (every call but GET), a backend is unavailable, or the call "
        "timed out: retry, a send with the same client_msg_id (outcome_unknown: it may be "
        "stored; the retry tells).",
        ("unavailable", "outcome_unknown"),
        (),
    ),
}
HEADERS: Final[dict[str, str]] = {
    "Allow": "the methods the path takes, comma-separated",
    "WWW-Authenticate": "Bearer",
}


@dataclass(frozen=True)
class Call:
    """What the document says of one route."""

    summary: str
    params: dict[str, Schema]  # the body's keys, or a GET's query parameters
    ok: Schema  # the 200 answer
    required: tuple[str, ...] = ()
    errors: tuple[int, ...] = ()  # beyond those every call can answer
    description: str = ""
    example: dict[str, Any] = field(default_factory=dict)
    body_rules: Schema = field(default_factory=dict)  # more of the body's schema


_CONV_ID: Final = {"conv_id": _ref("OutId")}
_MEMBERS: Final = {"members": {"type": "array", "items": _ref("OutId")}}
_NEXT_CURSOR: Final = {"next_cursor": _nullable({"type": "string"})}
_ONE_CONTENT: Final = {
    "oneOf": [{"required": ["text"]}, {"required": ["content_b64"]}],
}
_UIDS: Final = {"type": "array", "items": _ref("Id")}
_ANY_DEVICE: Final = {
    **_nullable(_DEVICE),
    "description": "one device's sessions; null or left out: every device's",
}
_KICKED: Final = _object({"kicked": {"type": "integer", "minimum": 0}})

CALLS: Final[dict[tuple[str, str], Call]] = {
    ("POST", "conversations/{id}/messages"): Call(
        "Send a message as a uid, or a system message (sender_uid 0)",
        {
            "sender_uid": _ref("IdOrZero"),
            "client_msg_id": {
                "type": "string",
                "minLength": 1,
                "maxLength": CLIENT_MSG_ID_MAX_BYTES,
                "description": f"1..{CLIENT_MSG_ID_MAX_BYTES} UTF-8 bytes: the idempotency "
                "key, one namespace per sender with the keys its devices use",
            },
            "msg_type": _MSG_TYPE,
            "text": _TEXT,
            "content_b64": _CONTENT_B64,
            "data": {"description": "a system message's data: any JSON, nested at most 32 deep"},
        },
        _object(
            {
                **_CONV_ID,
                "seq": _ref("OutId"),
                "msg_id": {"type": "string", "pattern": "^[0-9]+$"},
                "server_ms": {"type": "integer"},
            }
        ),
        required=("sender_uid", "client_msg_id"),
        errors=(404, 409, 413, 429),
        description="SEND as sender_uid, answered after the commit; the same client_msg_id "
        "again gets the original answer. Give text or content_b64. A system message "
        "(sender_uid 0) takes text and optionally data, no msg_type nor content_b64.",
        example={"sender_uid": 1001, "client_msg_id": "crm-4711", "text": "Your order shipped"},
        body_rules=_ONE_CONTENT,
    ),
    ("GET", "conversations/{id}/messages"): Call(
        "A page of history",
        {
            "limit": _limit(MSG_LIMIT_DEFAULT, MSG_LIMIT_MAX),
            "before_seq": {"type": "integer", "minimum": 0, "maximum": MAX_U64},
            "after_seq": {"type": "integer", "minimum": 0, "maximum": MAX_U64},
            "as_uid": {"type": "integer", "minimum": 0, "maximum": MAX_U64},
            "cursor": {"type": "string", "pattern": "^[ab][0-9]{1,20}$"},
        },
        _object(
            {
                **_CONV_ID,
                "has_more": {"type": "boolean"},
                **_NEXT_CURSOR,
                "messages": {"type": "array", "items": _ref("Message")},
            }
        ),
        errors=(404,),
        description="The last limit messages before before_seq (0: the newest), or with "
        "after_seq the first limit after it, ascending by seq; cursor (a page's "
        "next_cursor) goes on from where that page ended; give at most one of before_seq, "
        "after_seq and cursor. With as_uid, as that member reads it over TCP (HISTORY, "
        "PULL); else the whole conversation.",
    ),
    ("GET", "conversations/{id}"): Call(
        "A conversation: kind, title, owner, members",
        {},
        _object(
            {
                **_CONV_ID,
                "kind": {"enum": ["group", "p2p"]},
                "title": {"type": "string"},
                "owner_uid": _ref("OutId"),
                "created_ms": {"type": "integer"},
                **_MEMBERS,
            }
        ),
        errors=(404,),
        description="A p2p conversation has owner 0 and no title.",
    ),
    ("GET", "conversations/{id}/members"): Call(
        "The members in uid order, a page at a time",
        {
            "limit": _limit(api.MEMBERS_LIMIT_DEFAULT, api.MEMBERS_LIMIT_MAX),
            "cursor": {"type": "string", "pattern": "^u[0-9]{1,20}$"},
        },
        _object({**_CONV_ID, **_MEMBERS, **_NEXT_CURSOR}),
        errors=(404,),
    ),
    ("POST", "conversations/{id}/members"): Call(
        "Add and remove a group's members",
        {"add": _UIDS, "remove": _UIDS, "by_uid": _ref("Id")},
        _object({**_CONV_ID, **_MEMBERS}),
        errors=(404,),
        description="GROUP_MEMBERS as by_uid (the group's owner if absent): only the owner "
        "adds or removes others, anyone may remove themselves. The answer lists the members "
        f"after the change (at most {GROUP_MAX_MEMBERS}).",
        example={"add": [1004], "remove": [1002]},
    ),
    ("PUT", "conversations/{id}/title"): Call(
        "Set a group's title",
        {
            "title": {"type": "string", "description": f"at most {TITLE_MAX_BYTES} UTF-8 bytes"},
            "by_uid": _ref("Id"),
        },
        _object({**_CONV_ID, "seq": _ref("OutId")}),
        required=("title",),
        errors=(404,),
        description="As by_uid (the group's owner if absent; anyone else is forbidden): "
        "the change is a system message pushed to every member, whose seq the answer has.",
        example={"title": "core team"},
    ),
    ("POST", "conversations/{id}/recall"): Call(
        "Recall a message",
        {"uid": _ref("Id"), "seq": _ref("Id")},
        _object({**_CONV_ID, "seq": _ref("OutId"), "recall_seq": _ref("OutId")}),
        required=("uid", "seq"),
        errors=(404,),
        description="RECALL of message seq as uid: its sender within the recall window, or "
        "the group's owner.",
    ),
    ("POST", "conversations/{id}/read"): Call(
        "Move a uid's read position",
        {"uid": _ref("Id"), "seq": _ref("IdOrZero")},
        _object({**_CONV_ID, "uid": _ref("OutId"), "seq": _ref("OutId")}),
        required=("uid", "seq"),
        errors=(404,),
        description="READ as uid: its read position moves up to seq (never back), and the "
        "members are told.",
    ),
    ("GET", "users/{id}/push-devices"): Call(
        "The devices a uid registered for offline push",
        {},
        _object(
            {
                "uid": _ref("OutId"),
                "devices": {
                    "type": "array",
                    "items": _object(
                        {
                            "device": _DEVICE,
                            "provider": {"type": "string", "pattern": "^[a-z0-9_-]{1,16}$"},
                            "token": {"type": "string"},
                            "preview": {"type": "boolean"},
                            "locale": {"type": "string"},
                            "updated_ms": {"type": "integer"},
                        }
                    ),
                },
            }
        ),
        description="What PUSH_REGISTER stored for each of the uid's devices, newest first.",
    ),
    ("POST", "push-tokens/invalid"): Call(
        "Forget a push token its service called invalid",
        {
            "provider": {"type": "string", "pattern": "^[a-z0-9_-]{1,16}$"},
            "token": {"type": "string", "minLength": 1},
        },
        _object({"deleted": {"type": "boolean"}}),
        required=("provider", "token"),
        description="The registration holding (provider, token) goes, whichever uid and "
        "device hold it; deleted is false when none did.",
        example={"provider": "fcm", "token": "dGhpcyBpcyBub3QgYSByZWFsIHRva2Vu"},
    ),
    ("POST", "conversations/{id}/mute"): Call(
        "Mute a conversation's push events for a uid",
        {"uid": _ref("Id"), "until_ms": _ref("IdOrZero")},
        _object({**_CONV_ID, "uid": _ref("OutId"), "until_ms": {"type": "integer"}}),
        required=("uid", "until_ms"),
        errors=(404,),
        description="MUTE as uid: no push event for the conversation until until_ms (ms since "
        "the epoch; 0 unmutes). Unread counts are unchanged.",
        example={"uid": 1002, "until_ms": 0},
    ),
    ("POST", "conversations/{id}/delivered"): Call(
        "Move a device's delivered position",
        {"uid": _ref("Id"), "device": _DEVICE, "seq": _ref("IdOrZero")},
        _object({**_CONV_ID, "uid": _ref("OutId"), "device": _DEVICE, "seq": _ref("OutId")}),
        required=("uid", "device", "seq"),
        errors=(404,),
        description="DELIVERED as uid on device: that device's delivered position moves up "
        "to seq (never back).",
    ),
    ("POST", "p2p"): Call(
        "Open (or find) the p2p conversation of two uids",
        {"uid": _ref("Id"), "peer_uid": _ref("Id")},
        _object(_CONV_ID),
        required=("uid", "peer_uid"),
        description="OPEN_P2P as uid: the same conversation for the pair, whoever opens it.",
        example={"uid": 1001, "peer_uid": 1002},
    ),
    ("POST", "groups"): Call(
        "Create a group",
        {
            "owner_uid": _ref("Id"),
            "title": {"type": "string", "description": f"at most {TITLE_MAX_BYTES} UTF-8 bytes"},
            "uids": _UIDS,
        },
        _object(_CONV_ID),
        required=("owner_uid",),
        errors=(429,),
        description=f"GROUP_CREATE as the owner: at most {GROUP_MAX_MEMBERS} members; the "
        "owner's groups-a-day budget (429).",
        example={"owner_uid": 1001, "title": "team", "uids": [1002, 1003]},
    ),
    ("GET", "users/{id}/conversations"): Call(
        "A user's conversations with unread counts",
        {
            "device": _DEVICE,
            "limit": _limit(CONV_LIMIT_DEFAULT, CONV_LIMIT_MAX),
            "cursor": {"type": "string", "pattern": "^[0-9a-f]+$"},
        },
        _object(
            {
                "conversations": {"type": "array", "items": _ref("UserConversation")},
                **_NEXT_CURSOR,
                "partial": _object(
                    {"missing": {"type": "integer"}, "servers": {"type": "integer"}}
                ),
            },
            optional=("partial",),
        ),
        errors=(404,),
        description="SYNC from the start as the uid, newest activity first; delivered_seq is "
        "that of device (0 without it). While next_cursor is not null, pass it as cursor. "
        "partial: some of the storage servers holding the user's conversations did not "
        "answer (missing of servers) and their conversations are not listed.",
    ),
    ("POST", "tokens"): Call(
        "Mint a client token",
        {
            "uid": _ref("Id"),
            "device": _DEVICE,
            "ttl_s": {
                "type": "integer",
                "minimum": api.TOKEN_TTL_MIN_S,
                "maximum": api.TOKEN_TTL_MAX_S,
                "default": api.TOKEN_TTL_DEFAULT_S,
            },
        },
        _object(
            {
                "token": {"type": "string"},
                "uid": _ref("OutId"),
                "device": _DEVICE,
                "kid": {"type": "string"},
                "exp": {"type": "integer"},
            }
        ),
        required=("uid", "device"),
        errors=(429,),
        description="A token for LOGIN as uid on device, valid ttl_s seconds, signed with the "
        f"node's first token key; {api.TOKEN_MINT_PER_S:g} a second per node, in bursts of "
        f"{api.TOKEN_MINT_BURST}.",
        example={"uid": 1001, "device": "ios", "ttl_s": 3600},
    ),
    ("GET", "presence"): Call(
        "The online devices of uids",
        {
            "uids": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1, "maximum": MAX_U64},
                "minItems": 1,
                "description": f"at most {PRESENCE_MAX_UIDS} distinct",
            }
        },
        _object(
            {
                "presence": {
                    "type": "array",
                    "items": _object(
                        {"uid": _ref("OutId"), "devices": {"type": "array", "items": _DEVICE}}
                    ),
                }
            }
        ),
        required=("uids",),
        description=f"uids=1001,1002 (at most {PRESENCE_MAX_UIDS}), on every node.",
    ),
    ("POST", "kick"): Call(
        "KICK a uid's sessions, or one device's, on any node",
        {
            "uid": _ref("Id"),
            "device": _ANY_DEVICE,
            "reason": {
                "enum": sorted(r.name.lower() for r in KickReason),
                "default": "auth_revoked",
            },
            "text": {"type": "string", "description": f"at most {api.TEXT_MAX_BYTES} bytes"},
        },
        _KICKED,
        required=("uid",),
        description="Nothing is revoked: a client that logs in again is let in.",
        example={"uid": 1002, "device": "phone"},
    ),
    ("POST", "revoke"): Call(
        "Revoke a uid's (or one device's) tokens and kick its sessions",
        {"uid": _ref("Id"), "device": _ANY_DEVICE},
        _KICKED,
        required=("uid",),
        example={"uid": 1002},
    ),
    ("POST", "broadcast"): Call(
        "A NOTICE to the online devices of uids, not stored",
        {
            "uids": {
                **_UIDS,
                "minItems": 1,
                "description": f"at most {api.BROADCAST_MAX_UIDS} distinct",
            },
            "msg_type": _MSG_TYPE,
            "text": _TEXT,
            "content_b64": _CONTENT_B64,
        },
        _object({"uids": {"type": "integer", "minimum": 1}}),
        required=("uids",),
        errors=(413, 429),
        description="Give text or content_b64. The node's broadcast budget counts recipients; "
        "a call that does not fit takes nothing (429). The answer counts the distinct uids.",
        example={"uids": [1001, 1002, 1003], "text": "the service restarts in 5 minutes"},
        body_rules=_ONE_CONTENT,
    ),
}

# What each path id names, by the path's first segment.
PATH_IDS: Final = {"conversations": "conv_id", "users": "uid"}


def openapi_path(path: str) -> str:
    """The document's path of a route's `path` ("conversations/{id}" ->
    "/conversations/{conv_id}")."""
    return "/" + path.replace("{id}", "{" + PATH_IDS.get(path.partition("/")[0], "id") + "}")


def _operation(method: str, path: str, name: str, scope: str, keys: str) -> Schema:
    call = CALLS.get((method, path))
    if call is None:
        raise ValueError(f"{method} {path} has no entry in gateway/http/openapi.py CALLS")
    if set(call.params) != set(keys.split()):
        raise ValueError(
            f"{method} {path} takes {sorted(keys.split())}; CALLS documents {sorted(call.params)}"
        )
    body = method in api.BODY_METHODS
    statuses = {400, 401, 403, 503, *call.errors}
    if body:
        statuses |= {408, 413}
    parameters: list[Schema] = []
    if "{id}" in path:
        statuses.add(404)
        parameters.append(
            {
                "name": PATH_IDS.get(path.partition("/")[0], "id"),
                "in": "path",
                "required": True,
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_U64},
            }
        )
    op: Schema = {
        "operationId": name,
        "summary": call.summary,
        "description": f"{call.description}\n\nNeeds the scope `{scope}`.".lstrip(),
        "x-scope": scope,
        "responses": {
            "200": {
                "description": "OK",
                "content": {"application/json": {"schema": call.ok}},
            },
            **{str(s): {"$ref": f"#/components/responses/{s}"} for s in sorted(statuses)},
        },
    }
    if body:
        optional = set(call.params) - set(call.required)
        schema = _object(call.params, optional) | call.body_rules
        media: Schema = {"schema": schema}
        if call.example:
            media["example"] = call.example
        # a call whose keys are all optional takes no body as {}
        op["requestBody"] = {
            "required": bool(call.required),
            "content": {"application/json": media},
        }
    else:
        for key, schema in sorted(call.params.items()):
            param: Schema = {"name": key, "in": "query", "schema": schema}
            if key in call.required:
                param["required"] = True
            if schema.get("type") == "array":
                param["style"], param["explode"] = "form", False
            parameters.append(param)
    if parameters:
        op["parameters"] = parameters
    return op


def _error_response(status: int) -> Schema:
    description, codes, headers = ERRORS[status]
    schema: Schema = {
        "allOf": [
            _ref("Error"),
            {"properties": {"error": {"properties": {"code": {"enum": list(codes)}}}}},
        ]
    }
    response: Schema = {
        "description": description,
        "content": {"application/json": {"schema": schema}},
    }
    if headers:
        response["headers"] = {
            h: {"description": HEADERS[h], "required": True, "schema": {"type": "string"}}
            for h in headers
        }
    return response


def build(routes: tuple[tuple[str, str, str, str, str], ...]) -> dict[str, Any]:
    """The OpenAPI document of `routes` (rows of api.ROUTES), keys sorted."""
    paths: dict[str, dict[str, Schema]] = {}
    for method, path, name, scope, keys in routes:
        operation = _operation(method, path, name, scope, keys)
        paths.setdefault(openapi_path(path), {})[method.lower()] = operation
    paths["/openapi.json"] = {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            "description": "Open: no credentials.",
            "security": [],
            "responses": {
                "200": {
                    "description": "the OpenAPI document",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
        }
    }
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "imgw server API",
            "version": "1",
            "description": "JSON over HTTP on a gateway's admin port (docs/api.md). Every "
            "call but this document's needs `Authorization: Bearer <secret>`: the admin "
            "token (every scope), or an API key holding the scope a call names in x-scope "
            f"(one of {', '.join(sorted(KEY_SCOPES))}). Every error is "
            '`{"error": {"code", "message"}}`; a known path called with another method is '
            "405 with Allow. No operation lists 500 (internal): one is a bug.",
        },
        "servers": [{"url": api.PREFIX.rstrip("/")}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "responses": {str(s): _error_response(s) for s in ERRORS},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
    sorted_doc: dict[str, Any] = json.loads(json.dumps(doc, sort_keys=True))
    return sorted_doc


@cache
def document() -> dict[str, Any]:
    """The server API's document (what GET /api/v1/openapi.json answers)."""
    return build(api.ROUTES)


def text() -> str:
    """The document as docs/openapi.json holds it."""
    return json.dumps(document(), indent=2) + "\n"


if __name__ == "__main__":
    print(text(), end="")
