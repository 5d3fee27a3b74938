"""Wire models of /v1/files and /v1/batches, as OpenAI's API reference and SDK define them; those the stores keep
too (a file, a batch's own fields, a line's error) are common/batch/models.py's."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from common.batch.models import BatchFields, FileObject, LineError
from common.batch.store import BatchState


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class OutputExpiresAfter(BaseModel):
    anchor: Literal["created_at"]
    seconds: int = Field(ge=3600, le=2_592_000)


class BatchCreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: OutputExpiresAfter | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[LineError]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class Batch(BatchFields):
    object: Literal["batch"] = "batch"
    errors: BatchErrors | None = None
    request_counts: RequestCounts
    usage: BatchUsage

    @classmethod
    def of(cls, state: BatchState) -> Batch:
        values = state.model_dump(include=set(BatchFields.model_fields))
        errors = BatchErrors(data=state.errors) if state.errors else None
        counts = RequestCounts(total=state.total, completed=state.completed, failed=state.failed)
        usage = BatchUsage(input_tokens=state.input_tokens, output_tokens=state.output_tokens,
                           total_tokens=state.input_tokens + state.output_tokens)
        return cls(**values, errors=errors, request_counts=counts, usage=usage)


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Batch]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
