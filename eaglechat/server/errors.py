"""The one error a request can end in: `ApiError` (status, message, the parameter it names), and how an
engine's exception becomes one (a user's mistake is a 4xx, never a 500). Each face renders it in its
own shape (OpenAI's `{"error": {...}}`, Ollama's `{"error": "..."}`) with an exception handler
registered on its routes (server/app.py)."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}
        self.counted = False  # already in the server metrics (a reply's own end), not a refusal to count

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, f"'{param}' is not supported by this server: {why}", param=param, code="unsupported_parameter")


def engine_error(exc: BaseException, param: str = "messages") -> ApiError:
    """An exception from the engine -> the client's error (a user's mistake is a 4xx, not a 500)."""
    from eaglechat.errors import ContextTooLong, EaglechatError, OutOfMemory, UsageError

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextTooLong):
        return ApiError(400, str(exc), param=param, code="context_length_exceeded")
    if isinstance(exc, UsageError):
        return ApiError(400, str(exc), param=param, code="invalid_value")
    if isinstance(exc, OutOfMemory):
        return ApiError(503, str(exc), type="server_error", code="out_of_memory", headers={"Retry-After": "5"})
    if isinstance(exc, EaglechatError):
        return ApiError(500, str(exc), type="server_error", code="engine_error")
    return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error", code="internal_error")
