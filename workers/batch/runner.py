"""The rq job that runs one batch: validate its input file, send each line to an ovq API at batch priority,
checkpoint every answer in Redis, and write the output and error files.

Each line is an HTTP request to the API (`batch_api_url`) with the line's body and `X-Ovq-Priority: batch`:
the live endpoint's own checks and exact response body, and a job that waits in the model's batch stream
(workers take it only when no interactive job waits). At most `batch_max_in_flight` lines are in flight.

The runner holds the batch with a lease it renews every beat; a runner that dies (SIGKILL, lost host) leaves
the lease to lapse, and another batch worker picks the batch up (the sweep in workers/batch/worker.py, or rq's
own retry of an abandoned job), skips the lines already answered and goes on. Answers are recorded with HSETNX,
so each custom_id is answered exactly once in the files; a line that was in flight when its runner died is sent
again (the API cancelled it when the connection dropped).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import httpx
import orjson

from common.batch.files import CHUNK, FileStore
from common.batch.models import LineError
from common.batch.rq_keys import use_rq_prefix
from common.batch.store import RUN_AS_HEADER, TERMINAL, Batches, BatchQueue, BatchState, result_file_id
from common.jobs import PRIORITY_HEADER
from common.owner import OPERATOR
from common.redis.client import UNAVAILABLE, Backoff, connect, connect_rq, keys_for
from common.settings import Settings, get_settings
from workers.batch.inputs import InputLine, ParsedInput, parse_input

log = logging.getLogger("ovq.batch")

Stop = Literal["cancel", "expire", "shutdown", "lost"]
ENDING: dict[Stop | None, str] = {None: "completed", "cancel": "cancelled", "expire": "expired"}
UNANSWERED = {
    "cancelled": ("batch_cancelled", "The batch was cancelled before this request executed."),
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
}
# Answers that say "not now" (queue full, no worker yet, API restarting) or "this batch worker's key is wrong" (an
# operator's fix, not the line's fault): the line is sent again later, until the batch stops. A 500 or a timeout
# is tried SERVER_ERROR_TRIES times before it is the line's answer.
TRANSIENT = (401, 403, 429, 502, 503, 504)
SERVER_ERROR_TRIES = 3
LINES_PER_READ = 1000
VIDEO_POLL_MAX_S = 5.0  # a video line polls its video at most this far apart


def run_batch(batch_id: str) -> str:
    """rq job: run the batch until it ends, or until this worker is told to stop (then it is handed back)."""
    settings = get_settings()
    # A plain `rq worker` must run with RQ_KEY_PREFIX=Keys.rq_prefix of the OVQ_KEY_PREFIX it serves: else fail
    # the job, rather than run a batch whose rq keys belong to another deployment.
    use_rq_prefix(keys_for(settings))
    return asyncio.run(BatchRunner(settings, batch_id, _rq_worker_key()).run())


def _rq_worker_key() -> str | None:
    """The rq worker's hash, where rq notes a requested shutdown (SIGTERM): the runner then hands the batch back."""
    from rq import get_current_job
    from rq.worker import Worker

    job = get_current_job()
    return Worker.redis_worker_namespace_prefix + job.worker_name if job and job.worker_name else None


class BatchRunner:
    def __init__(self, settings: Settings, batch_id: str, rq_worker_key: str | None = None) -> None:
        self.settings, self.batch_id, self.rq_worker_key = settings, batch_id, rq_worker_key
        self.keys = keys_for(settings)
        self.token = uuid.uuid4().hex
        self.beat_s = min(1.0, settings.batch_lease_s / 3)
        self.stop: Stop | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.headers = {PRIORITY_HEADER: "batch", "Content-Type": "application/json"}
        if settings.batch_api_key:
            self.headers["Authorization"] = f"Bearer {settings.batch_api_key}"

    async def run(self) -> str:
        self.interrupted = asyncio.Event()
        self.redis = connect(self.settings, max_connections=16)
        self.store = Batches(self.redis, self.keys, self.settings)
        self.files = FileStore(self.redis, self.keys, self.settings)
        try:
            if not await self.store.acquire(self.batch_id, self.token):
                return "run by another batch worker"
            try:
                return await self._run_held()
            finally:
                await self.store.release(self.batch_id, self.token)
        finally:
            await self.redis.aclose()

    def _interrupt(self, why: Stop) -> None:
        """Stop feeding lines; a lost lease overrides any other reason (nothing may be written any more)."""
        if self.stop is None or why == "lost":
            if self.stop != why:
                log.warning("batch %s: %s", self.batch_id, {"cancel": "cancelled: in-flight lines finish",
                            "expire": "completion window elapsed", "shutdown": "worker stopping: handing it back",
                            "lost": "lease lost to another batch worker"}[why])
            self.stop = why
        self.interrupted.set()

    async def _run_held(self) -> str:
        state = await self.store.get(self.batch_id, OPERATOR)  # (the runner acts for the operator)
        if state is None or state.status in TERMINAL:
            return state.status if state else "no such batch"
        beat = asyncio.create_task(self._heartbeat(state))
        try:
            return await self._run_state(state)
        finally:
            beat.cancel()

    async def _heartbeat(self, state: BatchState) -> None:
        """Renew the lease; hear cancel, the window's end and the worker's shutdown; publish lines in flight."""
        while True:
            try:
                if not await self.store.renew(self.batch_id, self.token):
                    self._interrupt("lost")
                    return
                if await self.redis.hget(self.keys.batch(self.batch_id), "status") == b"cancelling":
                    self._interrupt("cancel")
                if self.rq_worker_key and await self.redis.hexists(self.rq_worker_key, "shutdown_requested_date"):
                    self._interrupt("shutdown")
                await self.redis.hset(self.keys.batch(self.batch_id), "in_flight", len(self.tasks))
            except UNAVAILABLE as exc:
                log.warning("batch %s: Redis unavailable (%s); retrying", self.batch_id, exc)
            if time.time() >= state.expires_at:
                self._interrupt("expire")
            await asyncio.sleep(self.beat_s)

    # ---- the batch's course -----------------------------------------------------------------------------
    async def _run_state(self, state: BatchState) -> str:
        if time.time() >= state.expires_at:
            self._interrupt("expire")
        elif state.status == "cancelling":
            self._interrupt("cancel")
        parsed = await self._read_input(state)
        if parsed.errors and state.status == "validating" and self.stop is None:
            return await self._fail(parsed.errors)
        if parsed.errors and not parsed.lines:  # the input file was deleted under a running batch
            return await self._finalize(state, [], "failed", errors=[e.model_dump() for e in parsed.errors])
        if state.status == "validating" and self.stop is None:
            model_error = await self._check_model(parsed)
            if self.stop in ("lost", "shutdown"):
                return await self._leave()
            if model_error is not None:
                return await self._fail([model_error])
            status = await self.store.update(self.batch_id, self.token, ("validating",), status="in_progress",
                                             in_progress_at=int(time.time()), total=len(parsed.lines),
                                             model=parsed.model or "")
            if not status:
                return "lost"
            state.status, state.model, state.total = status, parsed.model, len(parsed.lines)
        if state.status == "in_progress" and self.stop is None:
            await self._feed(state, parsed.lines)
        if self.stop in ("lost", "shutdown"):
            return await self._leave()
        return await self._finalize(state, parsed.lines)

    async def _read_input(self, state: BatchState) -> ParsedInput:
        stored = await self.files.get(state.input_file_id, OPERATOR)
        if stored is None:
            parsed = ParsedInput()
            parsed.fail("file_not_found", f"The input file {state.input_file_id} no longer exists")
            return parsed
        data = await self.files.read_all(stored)
        s = self.settings
        return parse_input(data, state.endpoint, s.batch_max_requests, s.batch_max_input_bytes)

    async def _check_model(self, parsed: ParsedInput) -> LineError | None:
        """Whether the API knows the model (served now or expected); waits while the API cannot answer."""
        async with self._client() as client:
            while True:
                try:
                    response = await client.get(f"/v1/models/{parsed.model}")
                    if response.status_code == 404:
                        return LineError(code="model_not_found", line=parsed.model_line, param="body.model",
                                         message=f"The model {parsed.model!r} does not exist")
                    if response.status_code == 200:
                        return None
                    log.warning("batch %s: the API answers %d to a model lookup (OVQ_BATCH_API_KEY?); retrying",
                                self.batch_id, response.status_code)
                except httpx.TransportError as exc:
                    log.warning("batch %s: the API at %s does not answer (%s); retrying", self.batch_id,
                                self.settings.batch_api, exc)
                if await self._pause(2.0):
                    return None

    async def _fail(self, errors: list[LineError]) -> str:
        log.warning("batch %s failed validation: %s", self.batch_id, "; ".join(
            f"line {e.line}: {e.message}" if e.line else e.message for e in errors[:5]))
        await self.store.end(self.batch_id, self.token, "failed", failed_at=int(time.time()),
                             errors=[e.model_dump() for e in errors])
        return "failed"

    async def _leave(self) -> str:
        """Stop without ending the batch: lost (another runner has it), or handed back to the queue."""
        if self.stop == "lost":
            return "lost"
        await self.store.release(self.batch_id, self.token)
        queue = await asyncio.to_thread(BatchQueue, connect_rq(self.settings), self.keys, self.settings)
        rq_job = await asyncio.to_thread(queue.enqueue, self.batch_id)
        await self.store.set_rq_job(self.batch_id, rq_job)
        return "handed back"

    # ---- lines --------------------------------------------------------------------------------------------
    def _client(self, state: BatchState | None = None) -> httpx.AsyncClient:
        """Each line says which batch it is of, with the batch's run token: the API runs it as the batch's owner's
        (fair share, priority limit, quota: api/batch/lines.py), not as the batch worker key's tenant."""
        timeout = httpx.Timeout(self.settings.batch_line_timeout_s, connect=10.0)
        limits = httpx.Limits(max_connections=self.settings.batch_max_in_flight + 2)
        headers = dict(self.headers)
        if state is not None and state.run_token:  # (an old batch has none: it runs as the key's, as it did)
            headers[RUN_AS_HEADER] = f"{state.id}:{state.run_token}"
        return httpx.AsyncClient(base_url=self.settings.batch_api, timeout=timeout, limits=limits, headers=headers)

    async def _pause(self, seconds: float) -> bool:
        """Sleep, cut short by a stop; True when stopping."""
        try:
            await asyncio.wait_for(self.interrupted.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass
        return self.stop is not None

    async def _feed(self, state: BatchState, lines: list[InputLine]) -> None:
        answered = await self.store.answered(self.batch_id)
        todo = [line for line in lines if line.custom_id not in answered]
        log.info("batch %s: %d of %d lines to run", self.batch_id, len(todo), len(lines))
        slots = asyncio.Semaphore(self.settings.batch_max_in_flight)
        async with self._client(state) as client:
            for line in todo:
                if not await self._take(slots):
                    break
                task = asyncio.create_task(self._line(client, state, line))
                self.tasks.add(task)
                task.add_done_callback(self._line_done(slots))
            await self._drain()

    def _line_done(self, slots: asyncio.Semaphore) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            self.tasks.discard(task)
            slots.release()
        return done

    async def _take(self, slots: asyncio.Semaphore) -> bool:
        """A free slot, or False once feeding must stop."""
        if self.stop is not None:
            return False
        acquire = asyncio.ensure_future(slots.acquire())
        stop = asyncio.ensure_future(self.interrupted.wait())
        await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not acquire.done():
            acquire.cancel()
            return False
        if self.stop is not None:
            slots.release()
            return False
        return True

    async def _drain(self) -> None:
        """Let the lines in flight finish: all of them after a cancel or the last line, up to the grace period
        on shutdown, none past the window's end or a lost lease."""
        deadline: float | None = None
        while self.tasks:
            await asyncio.wait(set(self.tasks), timeout=self.beat_s)
            if self.stop == "shutdown" and deadline is None:
                deadline = time.monotonic() + self.settings.shutdown_grace_s
            if self.stop in ("lost", "expire") or (deadline is not None and time.monotonic() > deadline):
                for task in self.tasks:
                    task.cancel()
                await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _line(self, client: httpx.AsyncClient, state: BatchState, line: InputLine) -> None:
        try:
            answer = await self._ask(client, state, line)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch %s: line %d failed in the batch worker", self.batch_id, line.number)
            answer = _error_answer(line, 500, "the batch worker failed on this line", "server_error")
        if answer is not None:
            await self._record(state, line, answer)

    async def _ask(self, client: httpx.AsyncClient, state: BatchState, line: InputLine) -> dict[str, Any] | None:
        """The line's answer as an output line, or None when the batch stops before it has one."""
        body = line.body
        if body.get("stream"):
            return _error_answer(line, 400, "stream is not supported in a batch", param="stream")
        if body.get("background"):  # the line's answer is the response itself, not its queued start
            return _error_answer(line, 400, "background is not supported in a batch", param="background")
        backoff, tries = Backoff(first=0.5), 0
        content = orjson.dumps(body)
        while True:
            response = None
            try:
                response = await client.post(state.endpoint, content=content)
            except httpx.TimeoutException:
                tries += 1
                if tries >= SERVER_ERROR_TRIES:
                    return {"id": _request_id("batch_req"), "custom_id": line.custom_id, "response": None,
                            "error": {"code": "request_timeout", "message": "The request timed out."}}
            except httpx.TransportError as exc:
                log.warning("batch %s: the API does not answer (%s); line %d waits", self.batch_id, exc, line.number)
            if response is not None:
                if response.status_code in (401, 403):
                    log.warning("batch %s: the API refuses this batch worker's key (%d): set OVQ_BATCH_API_KEY; line "
                                "%d waits", self.batch_id, response.status_code, line.number)
                if response.status_code == 500:
                    tries += 1  # a worker died under it, say: worth another try or two
                    if tries >= SERVER_ERROR_TRIES:
                        return _answer(line, response)
                elif response.status_code not in TRANSIENT:
                    answer = _answer(line, response)
                    return await self._video_ended(client, state, answer) if _is_video(state, response) else answer
            if await self._pause(backoff.next()):
                return None

    async def _video_ended(self, client: httpx.AsyncClient, state: BatchState,
                           answer: dict[str, Any]) -> dict[str, Any] | None:
        """A video line's answer is the video as it ended (completed or failed), not its `queued` start: polled
        until then (None when the batch stops first; the line is sent again when the batch goes on)."""
        response = answer["response"]
        path = f"{state.endpoint}/{response['body']['id']}"
        backoff = Backoff(first=0.5, cap=VIDEO_POLL_MAX_S)
        while True:
            if await self._pause(backoff.next()):
                return None
            try:
                polled = await client.get(path)
            except httpx.TransportError as exc:
                log.warning("batch %s: the API does not answer (%s); a video line waits", self.batch_id, exc)
                continue
            if polled.status_code != 200 or polled.json().get("status") in ("completed", "failed"):
                response["status_code"], response["body"] = polled.status_code, polled.json()
                return answer

    async def _record(self, state: BatchState, line: InputLine, answer: dict[str, Any]) -> None:
        response = answer.get("response") or {}
        ok = 200 <= response.get("status_code", 0) < 300
        usage = (response.get("body") or {}).get("usage") or {} if ok else {}
        # A chat or completion counts prompt and completion tokens; a response (/v1/responses), input and output.
        tokens = (int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0),
                  int(usage.get("completion_tokens") or usage.get("output_tokens") or 0))
        while True:
            try:
                recorded = await self.store.record(state, self.token, line.custom_id, orjson.dumps(answer), ok,
                                                   *tokens)
                break
            except UNAVAILABLE:
                if self.stop == "lost":
                    return
                await asyncio.sleep(1.0)
        if recorded < 0:
            self._interrupt("lost")

    # ---- the end ------------------------------------------------------------------------------------------
    async def _finalize(self, state: BatchState, lines: list[InputLine], ending: str | None = None,
                        **extra: Any) -> str:
        """Write the output and error files from the checkpoint, then end the batch (`ending`: by default what
        stopped it: completed, cancelled or expired)."""
        ending = ending or ENDING[self.stop]
        now = int(time.time())
        if ending == "completed":
            status = await self.store.update(self.batch_id, self.token, ("in_progress", "finalizing"),
                                             status="finalizing", finalizing_at=now)
            if not status:
                return "lost"
            if status == "cancelling":  # cancelled as its last line finished: all answered, still cancelled
                ending = "cancelled"
        ttl = state.output_ttl_s or self.settings.files_ttl_s
        # Without the input (deleted), only the answered lines are known, in no particular order.
        ids = [line.custom_id for line in lines] or sorted(await self.store.answered(self.batch_id))
        fields: dict[str, Any] = {f"{ending}_at": int(time.time()), **extra}
        for kind, wanted in (("output", True), ("error", False)):
            file_id = result_file_id(self.batch_id, kind)
            counted = _Count()
            stored = await self.files.create(f"batch_{kind}.jsonl", "batch_output",
                                             self._result_lines(ids, wanted, ending, counted), state.owner, file_id,
                                             ttl)
            if counted.lines:
                fields[f"{kind}_file_id"] = stored.id
            else:
                await self.files.delete(stored.id, OPERATOR)
        if not await self.store.end(self.batch_id, self.token, ending, **fields):
            return "lost"
        log.info("batch %s %s", self.batch_id, ending)
        return ending

    async def _result_lines(self, ids: list[str], successes: bool, ending: str,
                            counted: _Count) -> AsyncIterator[bytes]:
        """The output file (2xx answers) or the error file (the rest, and lines never run), in input order."""
        buffer = bytearray()
        for start in range(0, len(ids), LINES_PER_READ):
            chunk = ids[start:start + LINES_PER_READ]
            for custom_id, raw in zip(chunk, await self.store.lines(self.batch_id, chunk), strict=True):
                if raw is None:
                    if successes or ending not in UNANSWERED:
                        continue
                    code, message = UNANSWERED[ending]
                    raw = orjson.dumps({"id": _request_id("batch_req"), "custom_id": custom_id, "response": None,
                                        "error": {"code": code, "message": message}})
                else:
                    response = orjson.loads(raw).get("response") or {}
                    if (200 <= response.get("status_code", 0) < 300) != successes:
                        continue
                buffer += raw + b"\n"
                counted.lines += 1
                if len(buffer) >= CHUNK:
                    yield bytes(buffer)
                    buffer.clear()
        if buffer:
            yield bytes(buffer)


class _Count:
    lines = 0


def _is_video(state: BatchState, response: httpx.Response) -> bool:
    return state.endpoint.endswith("/videos") and response.status_code == 200


def _request_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _answer(line: InputLine, response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {"error": {"message": response.text[:2000] or f"HTTP {response.status_code}", "type": "server_error",
                          "param": None, "code": None}}
    request_id = response.headers.get("x-request-id") or _request_id("req")
    return {"id": _request_id("batch_req"), "custom_id": line.custom_id,
            "response": {"status_code": response.status_code, "request_id": request_id, "body": body}, "error": None}


def _error_answer(line: InputLine, status: int, message: str, kind: str = "invalid_request_error",
                  param: str | None = None) -> dict[str, Any]:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return {"id": _request_id("batch_req"), "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": _request_id("req"), "body": body}, "error": None}
