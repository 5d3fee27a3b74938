"""The Videos API's wire formats (OpenAI's `POST /videos`, the `video` object), with GenAI's own knobs as extras."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.errors import ErrorBody

VideoStatus = Literal["queued", "in_progress", "completed", "failed"]
VARIANTS = ("video", "thumbnail")  # what `GET /videos/{id}/content?variant=` serves (not OpenAI's spritesheet)


class VideoRequest(BaseModel):
    """`POST /videos` (a form, as the openai SDK sends it, or JSON). `seconds` and `size` take any value within the
    model's limits, not only Sora's; the rest are Text2VideoPipeline's settings (OVMS's image-node names)."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    model: str | None = None
    seconds: int | None = Field(None, ge=1)
    size: str | None = None
    num_inference_steps: int | None = Field(None, ge=1)
    guidance_scale: float | None = Field(None, ge=0)
    negative_prompt: str | None = None
    seed: int | None = Field(None, ge=0)
    frame_rate: int | None = Field(None, ge=1, le=60)

    @field_validator("seconds", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        return int(value) if isinstance(value, str) and value.isdigit() else value


class RemixRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)


class Video(BaseModel):
    """OpenAI's `video` object."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: VideoStatus
    progress: int = 0
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    prompt: str
    seconds: str
    size: str
    remixed_from_video_id: str | None = None
    error: ErrorBody | None = None


class VideoList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Video]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True
