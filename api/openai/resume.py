"""Resumable chat and completions streams: a client that loses its stream reconnects to any API process, within
`resume_grace_s`, and gets the rest of the same generation.

Opt-in per request, with the header `X-Ovq-Resumable: true` on a streamed request of one prompt. Not on by default:
a resumable job's worker writes every step to the job's journal too (`Keys.journal`: one more command in the same
round trip, Redis CPU and memory per token, measured by `benchmarks/scale.py`), and the stream goes out one frame
per worker event (no merging; a plain text delta takes the hub's express lane, as on a plain stream). The OpenAI
SDKs never reconnect, so most clients would pay for nothing; the ones that do (an EventSource-style client, a proxy
that retries) ask for it.

Every frame of such a stream carries `id: <job id>:<seq>`, the worker event it came from. Reconnecting is sending
the same request again with `Last-Event-ID` set to the last id seen: the API replays the journal through the same
formatting (so parsers rebuild their state), and writes only the frames after that event, then follows the job
live from its journal. Only the stream's owner may resume it (common/owner.py: its tenant, recorded in the job's
hash with the enqueue); to anyone else it is a stream that does not exist. While a stream is read its API process
holds the job's reader lease (`Keys.reader`); once nobody has held it for `resume_grace_s`, the worker cancels the
job: a client that left for good still frees it.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request

from api.http.auth import caller_of
from api.http.sse import DONE as END
from api.http.sse import PING, Last, SSEResponse, Write
from api.openai.choices import ChoiceState
from api.openai.formats import Format
from api.queue.client import ClientGone, Generation, JobClient
from api.queue.hub import Express
from api.queue.journal import Journal, paced
from common.errors import OvqError
from common.events import ACCEPTED, DELTA, DONE, ERROR, TERMINAL, EventDict
from common.jobs import Job, JobHash

RESUMABLE_HEADER = "x-ovq-resumable"
LAST_EVENT_ID = re.compile(r"([A-Za-z0-9._:-]{1,128}):(\d{1,9})")
PING_S = 15.0

Choices = dict[tuple[str, int], ChoiceState]


def resume_point(request: Request) -> tuple[str, int] | None:
    """`Last-Event-ID` as (job id, the last event's seq), when the request resumes a stream."""
    given = request.headers.get("last-event-id")
    if given is None:
        return None
    match = LAST_EVENT_ID.fullmatch(given)
    if match is None:
        raise OvqError("Last-Event-ID must be an `id:` this server sent on a resumable stream (`<job>:<n>`)",
                       param="Last-Event-ID", code="invalid_value")
    return match.group(1), int(match.group(2))


def wants_resumable(request: Request, stream: bool, jobs: list[Job]) -> bool:
    if request.headers.get(RESUMABLE_HEADER, "").lower() not in ("true", "1"):
        return False
    if not stream or len(jobs) != 1:
        raise OvqError("X-Ovq-Resumable applies to a streamed request of one prompt", param="X-Ovq-Resumable",
                       code="invalid_value")
    return True


def tagged(out: bytes, job: str, seq: int) -> bytes:
    """Each SSE frame of `out` with the id of the worker event it came from."""
    if not out:
        return out
    line = b"id: %s:%d\n" % (job.encode(), seq)
    return line + out.replace(b"\n\ndata: ", b"\n\n" + line + b"data: ")


class Frames:
    """One resumable stream's formatting: a worker event in, its frames (tagged) out; the same whether the events
    come live or from the journal, so a replay rebuilds the parsers' state exactly."""

    def __init__(self, fmt: Format, choices: Choices) -> None:
        self.fmt, self.choices = fmt, choices
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        self.ended = False
        self.started: set[str] = set()  # jobs whose `accepted` went out

    def of(self, event: EventDict) -> bytes:
        kind, fmt = event["type"], self.fmt
        out = b""
        if kind == ACCEPTED:
            if event["job"] in self.started:  # another worker took the job over: the stream just goes on
                return out
            self.started.add(event["job"])
            fmt.started(event["prompt_tokens"])
            out = fmt.first(sorted(self.choices.values(), key=lambda c: c.index))
        elif kind == DELTA:
            fmt.count(event)
            out = fmt.chunk(self.choices[event["job"], event.get("index", 0)], event)
        elif kind == DONE:
            for name, value in (event.get("usage") or {}).items():
                self.usage[name] = self.usage.get(name, 0) + value
            out = (fmt.usage(self.usage) if fmt.include_usage else b"") + END
        elif kind == ERROR:
            out = b"data: " + orjson.dumps({"error": event["error"]}) + b"\n\n" + END
        if kind in TERMINAL:
            self.ended = True
        return tagged(out, event["job"], event["seq"])


class Resumable:
    def __init__(self, jobs: JobClient) -> None:
        self.jobs, self.keys, self.settings = jobs, jobs.keys, jobs.settings
        self.journal = Journal(jobs.redis, jobs.keys)

    def lease(self, job_id: str, model: str = "") -> tuple[str, str, float]:
        return self.keys.reader(job_id, model), self.jobs.hub.reply_to, self.settings.resume_grace_s

    @staticmethod
    def hold(job: Job) -> None:
        """Before the job is queued: it is resumable, and this process reads it (the enqueue's round trip sets the
        reader lease the worker checks: `Registry._reader_lease`)."""
        job.journal = True

    async def live(self, generation: Generation, frames: Frames) -> AsyncIterator[bytes]:
        """The stream as it starts, from the hub: one tagged write per wake-up; the client leaving does not cancel
        the job (the lease lapses instead), so the generation is detached."""
        generation.detached = True
        key, value, ttl = self.lease(generation.job.id, generation.job.model)
        renewed = last = time.monotonic()
        try:
            if generation.pending:
                yield PING
                while not await generation.starting():
                    if time.monotonic() - last >= PING_S:
                        last = time.monotonic()
                        yield PING
            out = b"".join(frames.of(event) for event in generation.accepted.values())
            if out:
                last = time.monotonic()
                yield out
            due = [renewed + ttl / 3]  # the lease's next renewal: the express lane declines from then on
            with generation.express(lambda write: self._express(write, generation, frames, due)):
                while not (generation.finished or frames.ended):
                    events = await generation.events()
                    out = b"".join(frames.of(event) for event in events)
                    now = time.monotonic()
                    if frames.ended:
                        yield Last(out)
                        return
                    if now - renewed >= ttl / 3:
                        renewed = now
                        due[0] = now + ttl / 3
                        await self.jobs.redis.set(key, value, ex=max(1, round(ttl)))
                    if out:
                        last = now
                        yield out
                    elif now - max(last, generation.inbox.last) >= PING_S:
                        last = now
                        yield PING
        except OvqError as exc:
            yield Last(b"data: " + orjson.dumps({"error": exc.body.model_dump()}) + b"\n\n" + END)
            return
        except ClientGone:
            return
        yield Last(b"")

    @staticmethod
    def _express(write: Write, generation: Generation, frames: Frames, due: list[float]) -> Express | None:
        """A plain text delta with nothing queued ahead of it goes to the client from the hub's callback, as its own
        tagged frame: the bytes `Frames.of` makes of it, without a task wake-up per event. Anything else, and
        every event once the reader lease is due for renewal (only the loop renews it), takes the loop."""
        fmt = frames.fmt
        if fmt.running is not None:  # usage on every chunk: each delta is counted in `Frames.of`
            return None
        choices = frames.choices
        job = generation.job.id
        tag = b"id: " + job.encode() + b":"  # `tagged`'s line, made once: an express frame is a single frame

        def express(event: EventDict) -> bool:
            if event["type"] != DELTA or event.get("finish_reason") or not generation.quiet or event["job"] != job:
                return False
            choice = choices.get((job, event.get("index", 0)))
            if choice is None or not choice.plain or time.monotonic() >= due[0]:
                return False
            out = fmt.plain(choice, event["text"], None)
            return write(b"%b%d\n%b" % (tag, event["seq"], out) if out else out)

        return express

    async def resume(self, request: Request, model: str, frames: Frames, job_id: str, after: int) -> SSEResponse:
        """The rest of the stream after event `after` of job `job_id`, from its journal, on this API process."""
        redis = self.jobs.redis
        (made_for, owner), exists = await asyncio.gather(
            redis.hmget(self.keys.job(job_id, model), [JobHash.MODEL, JobHash.OWNER]),
            self.journal.exists(job_id, model))
        if not exists or (made_for is not None and made_for.decode() != model) or not caller_of(request).sees(owner):
            raise OvqError(f"No resumable stream `{job_id}` of `{model}` to resume: it was not resumable, its "
                           "model differs, or it ended longer ago than its journal is kept", 404,
                           code="stream_not_found")
        request.state.record.request_id = job_id
        return SSEResponse(self._replay(request, frames, job_id, after, model), _nothing, {"X-Request-Id": job_id})

    async def _replay(self, request: Request, frames: Frames, job_id: str, after: int,
                      model: str = "") -> AsyncIterator[bytes]:
        def render(events: list[EventDict]) -> bytes:
            return b"".join(frame for event in events if (frame := frames.of(event)) and event["seq"] > after)

        try:
            async for out in paced(self.journal, job_id, self.settings.background_stall_s, render,
                                   lambda: frames.ended, request.is_disconnected, self.lease(job_id, model),
                                   model=model):
                yield out
        except OvqError as exc:
            yield Last(b"data: " + orjson.dumps({"error": exc.body.model_dump()}) + b"\n\n" + END)


async def _nothing() -> None:
    return None
