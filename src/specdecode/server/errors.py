"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` for every failure the server reports."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["APIError", "install_error_handlers", "error_param"]

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}

# pydantic error type -> OpenAI-style error code
_CODES = {
    "extra_forbidden": "unknown_parameter",
    "missing": "missing_required_parameter",
    "json_invalid": "invalid_json",
    "unsupported_value": "unsupported_value",
}
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_short", "too_long",
                 "string_too_short", "string_too_long", "literal_error", "enum"}


class APIError(Exception):
    """An error with an HTTP status and an OpenAI error body."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def error_param(loc: Sequence[str | int], field_names: Iterable[str], unknown_last: bool = False) -> str | None:
    """'messages[0].content' from a pydantic location, skipping 'body' and union-member tags.

    unknown_last: the last part is an unknown field's name (kept although it is no field name).
    """
    names = set(field_names)
    param = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in names or (unknown_last and i == len(loc) - 1 and i > 0):
            param += f".{part}" if param else part
    return param or None


def _validation_error(error: RequestValidationError, field_names: Iterable[str]) -> APIError:
    first = error.errors()[0]
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, "We could not parse the JSON body of your request: " + str(first.get("ctx", {}).get("error", first.get("msg"))),
                        code="invalid_json")
    param = error_param(first.get("loc", ()), field_names, unknown_last=kind == "extra_forbidden")
    if kind == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif kind == "model_attributes_type" and param is None:
        message = "The request body must be a JSON object"
    else:
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    code = _CODES.get(kind) or ("invalid_value" if kind in _RANGE_ERRORS else "invalid_type")
    return APIError(400, message, param=param, code=code)


def install_error_handlers(app: FastAPI, field_names: Iterable[str]) -> None:
    """Turn validation errors, HTTP errors and unexpected exceptions into OpenAI error bodies."""
    names = frozenset(field_names)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return _validation_error(error, names).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return APIError(error.status_code, str(error.detail), code=code).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return APIError(500, f"internal server error: {type(error).__name__}: {error}").response()
