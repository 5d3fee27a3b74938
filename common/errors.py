"""The OpenAI error envelope, shared by the API's answers and the workers' `error` events."""
from __future__ import annotations

import re

from pydantic import BaseModel, field_validator

GENERIC = "The request could not be completed"
# Where an error was raised says nothing to a client and tells an attacker the build: OpenVINO's
# "Check '<expr>' failed at <file>:<line>:" and "Exception from <file>:<line>:", any other source path, and
# Python's default reprs ("<_io.BytesIO object at 0x7f...>").
_LEAKS = re.compile(
    r"Check '.*?' failed at \S+:\d+:?"
    r"|Exception from \S+:\d+:?"
    r"|(?:[A-Za-z]:)?[\w.~+-]*(?:[/\\][\w.~+-]+)+\.(?:cpp|hpp|cc|cxx|hxx|h|c|py|pyx)(?::\d+)*:?"
    r"|<[\w.]+ object at 0x[0-9a-fA-F]+>"
)


def clean_message(text: str) -> str:
    """An error text fit for a client: no source locations or object reprs, spaces collapsed, never empty."""
    cleaned = re.sub(r"\s+", " ", _LEAKS.sub("", text)).strip(" :")
    return cleaned or GENERIC


def exc_text(exc: BaseException) -> str:
    """A third-party exception's message for an error body (its class name when it has none)."""
    return clean_message(str(exc)) if str(exc).strip() else exc.__class__.__name__


class ErrorBody(BaseModel):
    """The envelope; its message is cleaned wherever it is built (API, worker) or read back from an event."""

    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | int | None = None

    @field_validator("message")
    @classmethod
    def _clean(cls, value: str) -> str:
        return clean_message(value)


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
        self.retry_after: int | None = None  # seconds, for the Retry-After header; None: the status's default


def not_found(message: str, param: str | None = "model") -> OvqError:
    return OvqError(message, 404, "invalid_request_error", param, "model_not_found")


def unavailable(message: str) -> OvqError:
    return OvqError(message, 503, "service_unavailable", None, "service_unavailable")


def internal(message: str) -> OvqError:
    return OvqError(message, 500, "server_error", None, "internal_error")
