"""The server API's OpenAPI document (gateway/http/openapi.py): docs/openapi.json is the
generated one, every route of the table is an operation and every operation a route, the
error answers name the codes and statuses the API gives, and the document is valid
OpenAPI 3.1 (Schemathesis's validator) with valid JSON Schemas (2020-12)."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import schemathesis

from gateway.http import admin, api, openapi
from protocol.ops import ErrorCode

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


def test_docs_openapi_json_is_the_generated_document() -> None:
    assert DOCS.read_text() == openapi.text(), (
        "docs/openapi.json is stale: python -m gateway.http.openapi > docs/openapi.json"
    )


def test_every_route_is_an_operation_and_every_operation_a_route() -> None:
    doc = openapi.document()
    operations = {
        (method.upper(), re.sub(r"\{[a-z_]+\}", "{id}", path.lstrip("/"))): op
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS
    }
    routes = {(method, path): (name, scope, keys) for method, path, name, scope, keys in api.ROUTES}
    assert set(operations) == set(routes) | {("GET", "openapi.json")}
    for key, (name, scope, keys) in routes.items():
        op = operations[key]
        assert (op["operationId"], op["x-scope"]) == (name, scope)
        assert f"`{scope}`" in op["description"]
        if key[0] in api.BODY_METHODS:
            body = op["requestBody"]["content"]["application/json"]["schema"]
            assert set(body["properties"]) == set(keys.split())
            assert body["additionalProperties"] is False
        else:
            query = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
            assert query == set(keys.split())
    assert operations[("GET", "openapi.json")]["security"] == []  # open
    assert doc["security"] == [{"bearer": []}]


def test_a_route_without_its_entry_or_with_other_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="no entry"):
        openapi.build((("GET", "nothing/here", "nothing", "read", ""),))
    with pytest.raises(ValueError, match="takes"):
        openapi.build((("POST", "p2p", "open_p2p", "manage", "uid peer_uid extra"),))


def test_the_error_answers_are_the_apis() -> None:
    """Each documented code is answered with its status, by a call (api.STATUS) or by the
    listener (api.code_of_status); every code a call answers with is documented."""
    for status, (_, codes, _) in openapi.ERRORS.items():
        for name in codes:
            code = ErrorCode[name.upper()]
            assert api.STATUS.get(code) == status or api.code_of_status(status) == code
    documented = {(s, c) for s, (_, codes, _) in openapi.ERRORS.items() for c in codes}
    for code, status in api.STATUS.items():
        if status != 500:  # a bug, not part of the contract
            assert (status, code.name.lower()) in documented
    assert admin.MAX_BODY == openapi.MAX_BODY_KIB * 1024
    assert admin.BODY_TIMEOUT_S == openapi.BODY_TIMEOUT_S


def _schemas(value: Any) -> Iterator[dict[str, Any]]:
    """Every JSON Schema in the document: components and the operations' own."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "schema" and isinstance(item, dict):
                yield item
            else:
                yield from _schemas(item)
    elif isinstance(value, list):
        for item in value:
            yield from _schemas(item)


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = openapi.document()
    assert doc["openapi"] == "3.1.0"
    schemathesis.openapi.from_dict(copy.deepcopy(doc)).validate()
    schemas = [*doc["components"]["schemas"].values(), *_schemas(doc)]
    assert len(schemas) > 50
    for schema in schemas:
        jsonschema_rs.meta.validate(schema)
    # the validator is live: a parameter without "in" is refused
    broken = copy.deepcopy(doc)
    del broken["paths"]["/presence"]["get"]["parameters"][0]["in"]
    with pytest.raises(jsonschema_rs.ValidationError):
        schemathesis.openapi.from_dict(broken).validate()


def test_the_document_is_deterministic_and_cached() -> None:
    assert openapi.document() is openapi.document()
    assert openapi.build(api.ROUTES) == openapi.document()
    assert openapi.text() == openapi.text()
    assert list(openapi.document()["paths"]) == sorted(openapi.document()["paths"])
