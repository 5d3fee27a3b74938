"""The job hash as each tier writes it (the API's enqueue, a worker's publisher, a retry) and `ovq jobs show` reads
it, by the names `common/jobs.py` gives its fields and statuses; the job in its stream entry."""
from __future__ import annotations

import time
import typing
from collections.abc import Iterator

import redis.asyncio as aioredis
from pydantic import BaseModel

from api.queue.registry import Registry, Servable
from common.events import Done, Timings, Usage
from common.jobs import ENTRY_JOB, EmbedParams, Job, JobHash, JobStatus, SamplingParams
from common.keys import GROUP, Keys
from common.modelcard import ModelCard
from common.ops import control
from common.servable import ServableType
from common.settings import Settings
from workers.queue.publisher import Outbox, Publisher


def names(namespace: type) -> list[str]:
    return [value for name, value in vars(namespace).items() if name.isupper()]


def test_every_field_and_status_has_a_name_of_its_own() -> None:
    """Two constants with one value would write two facts into one field."""
    for namespace in (JobHash, JobStatus):
        assert len(set(names(namespace))) == len(names(namespace))


def test_a_job_travels_in_its_stream_entry_under_one_field() -> None:
    job = Job(model="m", device="CPU", kind="completion", prompt="x", reply_to="api")
    fields = {k.encode(): v for k, v in job.to_fields().items()}
    assert list(fields) == [ENTRY_JOB.encode()]
    assert Job.from_fields(fields) == job


def test_a_queued_jobs_json_leaves_nones_out_and_reads_back_whole() -> None:
    """What the API queues reads back equal to the job, with less than half the bytes of a short chat's whole dump;
    a JSON schema's own nulls stay in it."""
    chat = Job(model="m", device="CPU", kind="chat", prompt="<|im_start|>user\nhi<|im_end|>\n", reply_to="api-1",
               params=SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    schema = {"type": "object", "properties": {"a": {"type": ["string", "null"], "default": None}}}
    unusual = Job(model="m", device="GPU", kind="completion", prompt=[1, 2, 3], reply_to="api-2", v=3,
                  add_special_tokens=True, priority="batch", journal=True, deadline=12.5, images=["k"],
                  params=SamplingParams(stop=["x"], n=2, skip_special_tokens=False, structured={"json_schema": schema}),
                  keep_alive=-1.0)
    for job in (chat, unusual):
        assert Job.model_validate_json(job.to_json()) == job == Job.model_validate_json(job.model_dump_json())
    assert len(chat.to_json()) * 2 < len(chat.model_dump_json())
    assert '"default":null' in unusual.to_json()


def models_of(model: type[BaseModel]) -> Iterator[type[BaseModel]]:
    """The model and every model its fields hold, however nested in unions and lists."""
    yield model
    for info in model.model_fields.values():
        pending = [info.annotation]
        while pending:
            kind = pending.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from models_of(kind)
            pending += typing.get_args(kind)


def test_no_field_of_a_job_that_may_be_none_defaults_to_anything_else() -> None:
    """`Job.to_json` leaves None fields out and readers fill in defaults: a field that may be None but defaults
    to something else would read back wrong, and one that is required would not read back at all."""
    for model in set(models_of(Job)):
        for name, info in model.model_fields.items():
            if type(None) in typing.get_args(info.annotation):
                assert not info.is_required() and info.default_factory is None and info.default is None, \
                    f"{model.__name__}.{name}"


def test_embeddings_and_rerank_jobs_travel_with_their_inputs() -> None:
    job = Job(model="m", device="CPU", kind="rerank", prompt="", reply_to="api",
              embed=EmbedParams(inputs=["a", [1, 2]], query="q", dimensions=8))
    assert Job.from_fields({k.encode(): v for k, v in job.to_fields().items()}) == job
    # A job of before embeddings (no `embed` field) still reads.
    old = job.model_dump(exclude={"embed"}) | {"kind": "chat"}
    assert Job.model_validate(old).embed is None


async def test_the_hash_the_api_and_a_worker_write_is_the_one_jobs_show_reads(redis_url: str) -> None:
    keys, settings = Keys(f"unit{time.time_ns()}"), Settings()
    redis = aioredis.Redis.from_url(redis_url)
    card = ModelCard(name="m", device="CPU", servable_type=ServableType.LM_CB, context_length=64, chat_template="x",
                     created=0)
    await redis.zadd(keys.workers("m", "CPU"), {"w1": time.time()})
    await redis.xgroup_create(keys.jobs("m", "CPU"), GROUP, id="0", mkstream=True)
    job = Job(model="m", device="", kind="completion", prompt="x", params=SamplingParams(), reply_to="api-1")
    await Registry(redis, keys, settings, expected=[]).enqueue(Servable("m", {"CPU": card}), job)

    queued = await control.job_info(redis, keys, settings, job.id)
    assert (queued.status, queued.model, queued.device, queued.api) == (JobStatus.QUEUED, "m", "CPU", "api-1")
    assert queued.created == job.created and queued.kind == "completion"

    publisher = Publisher(redis, keys, keys.jobs("m", "CPU"), job_ttl=60)
    outbox = Outbox()  # as a worker's I/O half writes it: accepted, then done
    outbox.set_status(job.id, status=JobStatus.RUNNING, worker="w1", prompt_tokens=3, streamed=0)
    await publisher._send(outbox, [])
    running = await control.job_info(redis, keys, settings, job.id)
    assert (running.status, running.worker, running.prompt_tokens) == (JobStatus.RUNNING, "w1", 3)
    assert running.updated is not None

    done = Done(job=job.id, seq=3, finish_reasons=["length"], usage=Usage(prompt_tokens=3, completion_tokens=2,
                total_tokens=5), timings=Timings(queue_ms=1.0, ttft_ms=2.0, total_ms=4.0))
    outbox = Outbox()
    outbox.set_status(job.id, status=JobStatus.DONE, result=done.model_dump(mode="json"), completion_tokens=2,
                      total_ms=4.0)
    await publisher._send(outbox, [])
    ended = await control.job_info(redis, keys, settings, job.id)
    assert (ended.status, ended.completion_tokens, ended.finish_reasons) == (JobStatus.DONE, 2, ["length"])
    assert (ended.total_ms, ended.ttft_ms) == (4.0, 2.0)  # the hash's own field first, else the result's
    await publisher.lane.close()
    await redis.aclose()
