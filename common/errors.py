"""The OpenAI error envelope, shared by the API's answers and the workers' `error` events."""
from __future__ import annotations

from pydantic import BaseModel


class ErrorBody(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | int | None = None


class OvqError(Exception):
    """An error with an HTTP status that should reach the client as the OpenAI envelope."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorBody(message=message, type=type, param=param, code=code)


def not_found(message: str, param: str | None = "model") -> OvqError:
    return OvqError(message, 404, "invalid_request_error", param, "model_not_found")


def unavailable(message: str) -> OvqError:
    return OvqError(message, 503, "service_unavailable", None, "service_unavailable")


def internal(message: str) -> OvqError:
    return OvqError(message, 500, "server_error", None, "internal_error")
