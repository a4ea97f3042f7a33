"""What the update endpoint's Python tests share: a PUT of a body to an endpoint."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def put(endpoint, name: str, body: bytes) -> tuple[int, dict]:
    """PUT /v1/modules/NAME with `body`: the HTTP status and the JSON answer."""
    request = urllib.request.Request(f"{endpoint.url}/v1/modules/{name}", data=body, method="PUT",
                                     headers={"Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())
