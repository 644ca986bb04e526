"""API errors: one exception type, answered in OpenAI's error JSON shape on every route."""

from __future__ import annotations

from typing import Any

import msgspec


class ApiError(Exception):
    """A request the server refuses; `status` is the HTTP code, `message` says what to change."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def decode(raw: bytes, kind: type) -> Any:
    """Decode a JSON body into the struct `kind`; malformed or mistyped input is a 400."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as e:
        raise ApiError(400, f"invalid request: {e}") from None
    except msgspec.DecodeError as e:
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
