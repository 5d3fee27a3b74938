"""Wire formats of /embeddings (OpenAI's) and /rerank (Cohere's, as OVMS serves it)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    # A string, a list of strings, a list of token ids, or a list of token id lists (OpenAI's four forms).
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if value == "" or value == [] or (isinstance(value, list) and any(v == "" or v == [] for v in value)):
            raise ValueError("must not be empty, nor hold an empty string or an empty token list")
        return value

    def inputs(self) -> list[str | list[int]]:
        """The input as a list of texts or token id lists."""
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [list(self.input)]  # type: ignore[arg-type]
        return list(self.input)  # type: ignore[arg-type]


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="allow")  # Cohere's document objects carry fields besides the text

    text: str


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    query: str = Field(min_length=1)
    documents: list[str | RerankDocument] = Field(min_length=1)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, Any] | None = None


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    results: list[RerankResult]
    usage: RerankUsage
