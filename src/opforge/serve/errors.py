"""HTTP errors in OpenAI's shape, and the request-body size limit.

Every error the server answers has the body ``{"error": {"message", "type", "param", "code"}}``.
A client's mistake is a 4xx naming what was wrong; a 500 means a fault in the server.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Awaitable, Callable, Optional

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .openai_schemas import ErrorDetail, ErrorResponse

log = logging.getLogger("opforge.serve")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          503: "server_error"}


class APIError(Exception):
    """An error answered to the client: a status, a message, and OpenAI's ``type``/``param``/``code``.

    Example:
        >>> e = APIError(400, "max_tokens must be >= 1", param="max_tokens")
        >>> e.body()["error"]["type"], e.body()["error"]["param"]
        ('invalid_request_error', 'max_tokens')
    """

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 type: Optional[str] = None, headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return ErrorResponse(error=ErrorDetail(message=self.message, type=self.type, param=self.param,
                                               code=self.code)).model_dump()

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def validation_error(errors: list[dict[str, Any]]) -> APIError:
    """A 400 from pydantic's errors, naming the first offending field (``messages.0.role``).

    Example:
        >>> validation_error([{"loc": ("max_tokens",), "msg": "Input should be a valid integer"}]).message
        'max_tokens: Input should be a valid integer'
    """
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if not (isinstance(p, str) and ("[" in p or p in ("str", "int")))]
    param = ".".join(loc) or None
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return APIError(400, f"{param + ': ' if param else ''}{first.get('msg', 'invalid value')}{more}", param=param,
                    code="invalid_value")


def parse_json(body: bytes) -> Any:
    """The JSON body of a request; a 400 naming the position when it is not JSON.

    Example:
        >>> parse_json(b'{"a": 1}')
        {'a': 1}
    """
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from e
    except RecursionError as e:
        raise APIError(400, "the request body nests JSON too deeply", code="invalid_json") from e


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"no route {request.method} {request.url.path}",
               405: f"method {request.method} not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
    return APIError(exc.status_code, message, headers=getattr(exc, "headers", None)).response()


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return APIError(500, f"internal server error: {type(exc).__name__}: {exc}", code="internal_error").response()


def install_error_handlers(app: Any) -> None:
    """Answer ``APIError``, routing errors (404/405) and unexpected faults (500) in OpenAI's shape."""
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _server_error)


ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: request bodies above ``max_bytes`` get a 413 before the app sees them.

    The body is read here (bounded) and handed to the app in one message; later ``receive``
    calls go to the server, so the app still learns of a disconnect.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def _too_large(self, scope: dict, receive: Any, send: Any) -> None:
        error = APIError(413, f"the request body exceeds {self.max_bytes} bytes", code="request_too_large")
        await error.response()(scope, receive, send)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
