"""The OpenAPI document: FastAPI's, plus the request bodies. The routes decode their bodies
with msgspec themselves (size limits first), so FastAPI cannot see them; the schemas come
from the same msgspec Structs, so the document and the decoder never disagree."""

from __future__ import annotations

from typing import Any

import msgspec
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from arbor.runtime.server.protocol import (
    AbortRequest,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
)

BODIES: dict[str, type] = {
    "/generate": GenerateRequest,
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/abort_request": AbortRequest,
}


def install_openapi(app: FastAPI, with_key: bool) -> None:
    """Make `app.openapi()` document the request bodies (and the bearer key, `with_key`)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            refs, components = msgspec.json.schema_components(
                list(BODIES.values()), ref_template="#/components/schemas/{name}"
            )
            doc.setdefault("components", {}).setdefault("schemas", {}).update(components)
            for path, ref in zip(BODIES, refs):
                operation = doc["paths"][path]["post"]
                operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
                operation["responses"]["400"] = {"description": "refused; the message says what to change"}
            if with_key:
                doc["components"]["securitySchemes"] = {"key": {"type": "http", "scheme": "bearer"}}
                doc["security"] = [{"key": []}]
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
