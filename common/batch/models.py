"""The OpenAI objects that /v1/files and /v1/batches answer with and that the stores keep: a stored file is a
`FileObject` with where its bytes are; a batch's hash keeps a Batch's own fields (`BatchFields`) and its counts,
usage and errors in a shape of its own. api/batch/protocol.py builds the rest of the wire objects on these."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: str
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None

    @classmethod
    def of(cls, stored: FileObject) -> FileObject:
        """The wire object of a stored file: its fields of its own left out."""
        return cls.model_validate(stored.model_dump(include=set(cls.model_fields)))


class LineError(BaseModel):
    """One of a batch's `errors.data` (OpenAI's BatchError)."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchFields(BaseModel):
    """The fields of OpenAI's Batch object that a batch's hash keeps as they are."""

    id: str
    endpoint: str
    model: str | None = None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    metadata: dict[str, str] | None = None
