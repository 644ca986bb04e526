"""API errors: one exception type, answered in OpenAI's error JSON shape on every route.

The contract: what a request's own input causes is a 4xx that names the field; checks that
refuse input raise ValueError (a SchemaError, a TooDeep, a JSONDecodeError), which
`refusing` turns into a 400. Anything else escaping a route is Arbor's bug: a logged 500."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import msgspec

from arbor.grammar.nesting import TooDeep, check_json, too_deep_path
from arbor.runtime.server.redact import public


class ApiError(Exception):
    """A request the server refuses; `status` is the HTTP code, `message` says what to change."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        """The JSON a client reads; the message carries no filesystem path of the server."""
        return {"error": {"message": public(self.message), "type": self.kind, "param": self.param, "code": self.status}}


@contextlib.contextmanager
def refusing(param: str | None = None, prefix: str = "") -> Iterator[None]:
    """Inside, a ValueError (a check refusing the request's input) becomes a 400 with `param`
    and the message after `prefix`; other exceptions pass on to the 500 handler."""
    try:
        yield
    except ValueError as e:
        raise ApiError(400, prefix + str(e), param=param) from None


def decode(raw: bytes, kind: type) -> Any:
    """Decode a JSON body into the struct `kind`; malformed, mistyped or too deeply nested
    input is a 400. The nesting is checked first, without recursing: msgspec recurses per level."""
    try:
        check_json(raw, "the body")
    except TooDeep as e:
        path = too_deep_path(raw, e.limit)
        where = f" (at {path})" if path else ""
        field = re.match(r"[^.\[]*", path)
        raise ApiError(
            400,
            f"the body nests arrays and objects {e.depth} levels deep{where}; the limit is {e.limit}: flatten it",
            param=field[0] if field and field[0] else None,
        ) from None
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as e:
        raise ApiError(400, f"invalid request: {e}") from None
    except msgspec.DecodeError as e:
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
