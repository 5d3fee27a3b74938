"""The speech worker: one transcription or synthesis at a time (GenAI's speech pipelines do not batch; jobs beyond
that wait in the Redis stream).

Audio never travels in the stream or in events: the API stores an upload under a short-lived key
(`Keys.blob(job, "audio")`) that this worker reads and deletes once the job ends (a crashed worker leaves it for
the worker that reruns the job; the TTL bounds it), and speech comes back the same way (`Keys.blob(job, "speech")`,
read once and deleted by the API). Transcribed text streams as `delta` events when the client streams.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from common.audio import AudioError, decode, encode
from common.errors import ErrorBody
from common.events import Cancelled, Done, Error, Timings, Transcript, delta
from common.jobs import Job, JobStatus, SpeechParams
from common.models.config import ModelConfig
from common.servable import ServableType, infer_servable
from common.settings import Settings
from workers.audio.pipelines import SpeechPipelines, speech_info
from workers.engine.continuous import error_message
from workers.ops.tracing import JobTimes
from workers.pipeline import PipelineRun, PipelineWorker, pipeline_card
from workers.queue.publisher import Outbox

log = logging.getLogger("ovq.speech_worker")


@dataclass
class SpeechJob(PipelineRun):
    first: float | None = None  # when the first text arrived (unix s)
    generated: float | None = None  # when the pipeline's generate() returned (unix s)
    pieces: int = 0  # text pieces the streamer got


@dataclass
class Outcome:
    transcript: Transcript | None = None
    audio: str | None = None
    error: str | None = None


class SpeechWorker(PipelineWorker):
    def __init__(self, settings: Settings, model: ModelConfig, device: str) -> None:
        super().__init__(settings, model, device)
        self.capacity = 1
        self.configure(model)

    def configure(self, model: ModelConfig) -> None:
        device, path = self.device, Path(model.path)
        self.kind = infer_servable(path, device)
        self.card = pipeline_card(model, device, servable_type=self.kind, speech=speech_info(model, self.kind))
        self.pipes = SpeechPipelines(model, device, self.kind)

    async def start_backend(self) -> None:
        await asyncio.to_thread(self.pipes.load)

    async def stop_backend(self) -> None:
        for state in self.running.values():
            state.cancelled = True

    def describe(self) -> str:
        return f"{self.kind.value}, {'WhisperPipeline' if self.kind is ServableType.S2T else 'Text2SpeechPipeline'}"

    def cancel_running(self, job_id: str) -> None:
        self.running[job_id].cancelled = True  # Whisper's streamer returns True at its next piece of text

    def _start(self, entry_id: bytes, job: Job, outbox: Outbox) -> None:
        state = SpeechJob(job, entry_id)
        self._accept(state, outbox)
        self._spawn(self._run(state))

    async def _run(self, state: SpeechJob) -> None:
        params = state.job.speech
        try:
            if params is None:
                raise ValueError("a speech job needs its speech settings")
            if params.task == "speak":
                outcome = await self._speak(state, params)
            else:
                outcome = await self._transcribe(state, params)
        except Exception as exc:  # undecodable audio, or GenAI refuses a setting: the request's fault
            outcome = Outcome(error=error_message(exc))
            log.warning("speech job %s failed: %s", state.job.id, outcome.error)
        # A job handed back at shutdown (no longer ours) keeps its upload for the worker that runs it again.
        if params is not None and params.audio_key is not None and state.job.id in self.running:
            await self.redis.delete(params.audio_key)
        self._end(state, outcome)

    async def _transcribe(self, state: SpeechJob, params: SpeechParams) -> Outcome:
        if params.audio_key is None:
            raise ValueError("a transcription job needs its audio")
        data = await self.redis.get(params.audio_key)
        if data is None:
            raise ValueError("the uploaded audio expired before the job started")
        try:
            samples = await asyncio.to_thread(decode, data)
        except AudioError as exc:
            raise ValueError(str(exc)) from None
        loop = asyncio.get_running_loop()

        def on_text(text: str) -> bool:
            if state.cancelled:
                return True
            if params.stream and text:
                loop.call_soon_threadsafe(self._delta, state, text)
            return False

        transcript = await asyncio.to_thread(self.pipes.transcribe, samples, params, on_text)
        state.generated = time.time()
        return Outcome() if state.cancelled else Outcome(transcript=transcript)

    async def _speak(self, state: SpeechJob, params: SpeechParams) -> Outcome:
        if state.cancelled:
            return Outcome()
        samples, rate = await asyncio.to_thread(self.pipes.speak, str(state.job.prompt), params)
        state.generated = time.time()
        if state.cancelled:
            return Outcome()
        data = await asyncio.to_thread(encode, samples, rate, params.response_format)
        key = self.keys.blob(state.job.id, "speech", state.job.model)
        await self.redis.set(key, data, ex=self.settings.blob_ttl_s)
        return Outcome(audio=key)

    def _delta(self, state: SpeechJob, text: str) -> None:
        if state.job.id not in self.running or state.cancelled:
            return
        outbox = Outbox()
        state.pieces += 1
        self.tokens_generated += 1
        outbox.publish(state.job.reply_to, delta(state.job.id, state.next_seq(), 0, text, 1))
        if not state.streamed:
            state.streamed, state.first = True, time.time()
            outbox.set_status(state.job.id, streamed=1)
            outbox.observe("ttft", (state.first - state.job.created) * 1000)
        self.publisher.put(outbox)

    def _end(self, state: SpeechJob, outcome: Outcome) -> None:
        job, outbox = state.job, Outbox()
        if job.id not in self.running:
            return
        self._job_done(state, outbox)
        summary = state.summary()
        if outcome.error is not None:
            body = ErrorBody(message=outcome.error)
            outbox.publish(job.reply_to, Error(job=job.id, seq=state.next_seq(), status=400, error=body))
            outbox.set_status(job.id, status=JobStatus.ERROR, error=body.model_dump(), **summary)
            end = JobStatus.ERROR
        elif outcome.transcript is None and outcome.audio is None:
            outbox.publish(job.reply_to, Cancelled(job=job.id, seq=state.next_seq()))
            outbox.set_status(job.id, status=JobStatus.CANCELLED, **summary)
            end = JobStatus.CANCELLED
        else:
            now = time.time()
            ttft = (state.first - job.created) * 1000 if state.first else None
            timings = Timings(queue_ms=(state.received - job.created) * 1000, ttft_ms=ttft,
                              total_ms=(now - job.created) * 1000)
            done = Done(job=job.id, seq=state.next_seq(), timings=timings, transcript=outcome.transcript,
                        audio=outcome.audio)
            outbox.publish(job.reply_to, done)
            outbox.set_status(job.id, status=JobStatus.DONE, result=done.model_dump(mode="json"), **summary)
            end = JobStatus.DONE
        if job.traceparent is not None:
            work = "speech.synthesize" if self.kind is ServableType.T2S else "speech.transcribe"
            times = JobTimes(state.received, state.received, first_token=state.first, generated=state.generated,
                             work=work)
            published = times.spans(job, self.id, end, 0, state.pieces, time.time())
            if published is not None:
                outbox.sent.append(published)
        self.publisher.put(outbox)
