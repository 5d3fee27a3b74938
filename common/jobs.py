"""The job: what the API puts on a model's stream and a worker runs. Versioned: workers on other hosts read it.

Also the job's hash (`Keys.job`: where a job is and how it went) by its field names and status values, and the
fields of a stream entry: every tier and the operator's tools read and write them by these names.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Final, Literal

import orjson
from pydantic import BaseModel, Field

JOB_VERSION = 2

Priority = Literal["high", "interactive", "low", "batch"]
# Every priority level, highest first: `interactive` is the default; `batch` (Batch API lines) stays lowest.
LEVELS: tuple[Priority, ...] = ("high", "interactive", "low", "batch")
# The request header that marks a request's job as batch traffic (the Batch API's workers send it).
PRIORITY_HEADER = "X-Ovq-Priority"


class JobStatus:
    """The job hash's `status`: `queued` by the API (or a retried dead letter), `running` once a worker accepted
    it, then how it ended."""

    QUEUED: Final = "queued"
    RUNNING: Final = "running"
    DONE: Final = "done"
    ERROR: Final = "error"
    CANCELLED: Final = "cancelled"


class JobHash:
    """The job hash's field names. Written by the API's enqueue (status, created, api, model, device), then by the
    worker's publisher (the rest; `updated` on every write), and by `ovq dead retry` (retries)."""

    STATUS: Final = "status"  # a `JobStatus`
    CREATED: Final = "created"  # unix s, as the job says
    API: Final = "api"  # the API process waiting for it (its `reply_to`)
    MODEL: Final = "model"
    DEVICE: Final = "device"
    UPDATED: Final = "updated"  # unix s of the last write
    WORKER: Final = "worker"  # the worker that accepted it
    # These two are written with the worker's next write (it starts or ends), not when it reads the job.
    ENTRY: Final = "entry"  # its stream entry id (when Redis queued it)
    TAKEN: Final = "taken"  # unix s it left the stream
    # 1 once a token went out: a dead worker's job is then continued from `Keys.generated` (or failed), not rerun.
    STREAMED: Final = "streamed"
    PROMPT_TOKENS: Final = "prompt_tokens"
    COMPLETION_TOKENS: Final = "completion_tokens"
    QUEUE_MS: Final = "queue_ms"
    TTFT_MS: Final = "ttft_ms"
    TOTAL_MS: Final = "total_ms"
    RESULT: Final = "result"  # the `done` event (JSON)
    ERROR: Final = "error"  # the error body (JSON)
    REASON: Final = "reason"  # why it was cancelled, when not by its client
    TEXT: Final = "text"  # the first choice's text, only with OVQ_KEEP_JOB_TEXT
    RETRIES: Final = "retries"  # how often an operator retried it from the dead letters
    FAIR: Final = "fair"  # its tenant's fair-share correction, once made at its end (workers/queue/share.py)
    OWNER: Final = "owner"  # a resumable stream's: whose it is, who may resume it (common/owner.py)


# A stream entry's fields: the job (`Job.to_fields`); a dead letter adds why and which worker put it there.
ENTRY_JOB: Final = "job"
ENTRY_REASON: Final = "reason"
ENTRY_WORKER: Final = "worker"
_ENTRY_JOB = ENTRY_JOB.encode()


class SamplingParams(BaseModel):
    """Request values only; `None` means "not given" so the worker can apply the model's defaults."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = Field(default_factory=list)
    ignore_eos: bool | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    n: int = 1
    best_of: int | None = None  # > 1: beam search with this beam width, the n best beams returned
    length_penalty: float | None = None
    # None: no log-probabilities; k >= 0: each token's own, plus the k most likely alternatives (k <= 1).
    logprobs: int | None = None
    echo: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # A `common.structured` tree: JSON schema, regex or structural tags the output must follow.
    structured: dict[str, Any] | None = None
    num_assistant_tokens: int | None = None
    max_ngram_size: int | None = None
    assistant_confidence_threshold: float | None = None  # speculative decoding: draft while this sure
    adapter: str | None = None  # the LoRA adapter (its declared name) the job generates with; None: the base


class ImageParams(BaseModel):
    """An image job's settings, limits already checked by the API; `None` means the worker's default."""

    n: int = 1
    width: int | None = None
    height: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    prompt_2: str | None = None
    prompt_3: str | None = None
    negative_prompt_2: str | None = None
    negative_prompt_3: str | None = None
    max_sequence_length: int | None = None
    rng_seed: int | None = None
    strength: float | None = None
    # Edits: Redis keys of the uploaded image and mask (bytes with a TTL), not the bytes themselves.
    image_key: str | None = None
    mask_key: str | None = None
    # Whether the client streams: then each denoising step sends a progress event with a preview image.
    previews: bool = False
    # LoRA adapters' weights by name for this request (those not named weigh 0); None: the models file's alphas.
    lora_weights: dict[str, float] | None = None


class VideoParams(BaseModel):
    """A video job's settings, limits already checked by the API; `None` means the model's default."""

    width: int
    height: int
    num_frames: int
    frame_rate: int
    num_inference_steps: int
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    rng_seed: int | None = None
    # How long its content lives (s): the worker stores the MP4 and thumbnail for this long (Keys.video_content).
    ttl_s: int


class SpeechParams(BaseModel):
    """A speech job's settings, checked by the API: transcribe or translate an upload (S2T), or speak the prompt
    (T2S). `None` means the model's default."""

    task: Literal["transcribe", "translate", "speak"]
    # The uploaded audio: a Redis key (bytes with a TTL), not the bytes themselves.
    audio_key: str | None = None
    language: str | None = None
    prompt: str | None = None
    temperature: float | None = None
    timestamps: bool = False  # segment timestamps (verbose_json, srt, vtt)
    words: bool = False  # word timestamps (verbose_json with timestamp_granularities word)
    stream: bool = False  # text deltas as they are decoded
    voice: str | None = None
    response_format: str = "wav"  # the speech file's format (a key of common.audio.SPEECH_FORMATS)
    speed: float | None = None
class EmbedParams(BaseModel):
    """An embeddings or rerank job's inputs, checked by the API against the model's card.

    Embeddings: `inputs` are the texts (or token id lists, decoded by the worker's tokenizer); rerank: `inputs`
    are the documents, scored against `query`."""

    inputs: list[str | list[int]]
    query: str | None = None
    # Embeddings: the vector's length when smaller than the model's (Matryoshka models); None: the model's.
    dimensions: int | None = None


class Share(BaseModel):
    """Whose work a job is, for fair shares (common/fairness.py): the tenant, its weight, and the tokens the job is
    estimated to cost (prompt + expected output), which its worker corrects by the actual count when it ends."""

    tenant: str
    weight: float = 1.0
    cost: int = 1


class Job(BaseModel):
    v: int = JOB_VERSION
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    model: str
    device: str
    # "transcription", "speech", "embed" and "rerank" came with SpeechParams and EmbedParams (still version 2: only
    # the speech, embeddings and rerank workers, which know them, read those models' streams; every other job reads
    # as before).
    kind: Literal["chat", "completion", "image", "transcription", "speech", "embed", "rerank", "video"]
    prompt: str | list[int]
    # Completions get the tokenizer's special tokens (BOS); a rendered chat template already has its own.
    add_special_tokens: bool = False
    params: SamplingParams = Field(default_factory=SamplingParams)
    image: ImageParams | None = None
    video: VideoParams | None = None  # "video" jobs (only the video workers read those models' streams)
    speech: SpeechParams | None = None
    # Vision-language chat: Redis keys of the message images, in prompt order (short-lived blobs).
    images: list[str] = Field(default_factory=list)
    embed: EmbedParams | None = None
    reply_to: str
    created: float = Field(default_factory=time.time)
    # Which of the model's streams the job waits in: batch jobs (Batch API lines) only run when no interactive
    # job waits. A worker acks the job on the stream this names.
    priority: Priority = "interactive"
    # W3C trace context of the API's request span when tracing is on (common/tracing.py): the worker's spans join
    # the request's trace, on whatever host it runs.
    traceparent: str | None = None
    # Resumable: the worker also writes its events to the job's journal (Keys.journal), which any API process can
    # replay, and does not cancel it when its API process goes. Off for plain jobs, which pay nothing for it.
    journal: bool = False
    # A background response: it runs whatever its client and API process do (only a cancel stops it). A
    # journaled job that is not is cancelled once no API process has streamed it for OVQ_RESUME_GRACE_S.
    background: bool = False
    # Unix s by which the job must have ended (X-Request-Timeout, or the openai SDK's read timeout on a unary
    # request): a worker cancels it there, like a client that left. None: no deadline.
    deadline: float | None = None
    # Unix s after which no worker starts it (its deadline, or a stream's first-byte deadline): one read later is
    # dropped from its stream with a 504 `error` event, never run.
    start_by: float | None = None
    # The tenant's fair share (its jobs wait in fair order among tenants when the queue is contended); None: the
    # job carries no tenant (no API key, no `user`), or OVQ_FAIRNESS is off: first come, first served.
    share: Share | None = None

    # Prefix affinity (issue 30): the worker whose affinity stream the job waits in (`Keys.affinity_jobs`; it is
    # acked there, whoever runs it), and the digests of its prompt's prefixes, most specific first, that the worker
    # running it records as served by it (`Keys.prefix_owner`). None: the job is not subject to affinity.
    affinity: str | None = None
    prefixes: list[str] | None = None
    # Ollama's `keep_alive` (seconds; negative: for good): how long a pool worker keeps the model loaded once idle
    # after this job (workers/pool/). None: OVQ_MODEL_KEEP_ALIVE_S.
    keep_alive: float | None = None

    def expired(self, now: float) -> bool:
        """Too late to start: nobody waits for its answer any more."""
        return self.start_by is not None and now > self.start_by

    def to_json(self) -> str:
        """The job as the API queues it: its fields that are None (not given) left out, which a reader's model
        makes None again. A short chat's job (benchmarks/scale.py's) is 1,022 bytes whole and 512 so: less for
        Redis to parse, copy into its AOF and hold while the job waits, and for the worker to read; and quicker to
        write (3.6 µs, against 5.3 whole; leaving out every default took 14). Lossless as long as no field that may
        be None defaults to something else (tests/unit/common/test_jobs.py holds the contract to that)."""
        return self.model_dump_json(exclude_none=True)

    def to_fields(self) -> dict[str, bytes]:
        return {ENTRY_JOB: orjson.dumps(self.model_dump())}

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> Job:
        return cls.model_validate_json(fields[_ENTRY_JOB])
