"""The agent endpoint's errors, OpenAI-style (``{"error": {"message", "type", "param", "code"}}``) on every route:
a refused call, an unknown route, a wrong method, a bug."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


class RequestError(Exception):
    """An OpenAI-style error answer."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}
        return JSONResponse(body, status_code=self.status)


async def http_error(request: Request, error: Exception) -> Response:
    """Starlette's 404 (no such route) and 405 (wrong method) as OpenAI-style errors."""
    assert isinstance(error, HTTPException)
    if error.status_code == 405:
        allowed = {k.lower(): v for k, v in (error.headers or {}).items()}.get("allow", "POST")
        message = f"{request.method} is not allowed on {request.url.path}: use {allowed}"
    else:
        message = f"no route {request.method} {request.url.path}: chat calls go to {{OPENAI_BASE_URL}}/chat/completions"
    answer = RequestError(error.status_code, message, kind="not_found_error" if error.status_code == 404 else
                          "invalid_request_error").response()  # fmt: skip
    answer.headers.update(error.headers or {})
    return answer


async def server_error(request: Request, error: Exception) -> Response:
    """A bug answers 500 in OpenAI form (the traceback is still logged)."""
    return RequestError(500, f"the endpoint failed: {error!r}", kind="server_error").response()
