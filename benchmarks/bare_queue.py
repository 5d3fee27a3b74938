"""Redis's own floor for a streamed request: the least a Redis-streams job queue with pub/sub replies costs it.

The same Redis as `benchmarks/scale.py` runs (the embedded one, `appendonly yes`), driven by one process: `streams`
closed-loop clients each XADD a job of ovq's size to one stream and wait for its end on one pub/sub channel; one
consumer reads the stream (XREADGROUP, one group) and steps its jobs every `step_s`: each step publishes one event
per running job, all of them in one PUBLISH, and acks and deletes the jobs that ended (XACK, XDEL). Commands go
through ovq's lane (common/redis/lane.py): those of one event-loop turn in one write, as the tiers send them.

None of ovq's queue: no job hash, no TTLs, no live-worker check or queue cap, no priorities, fair shares or
takeover records. `scale.py --floor` runs it at the request rate ovq reached: what Redis costs here is what any
durable queue of this shape costs it at that rate; the rest of ovq's Redis CPU is what its features cost.

  python benchmarks/bare_queue.py --rate 600 --frames 2
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving import free_port  # noqa: E402

from common.redis.lane import Lane  # noqa: E402
from common.redis.server import EmbeddedRedis  # noqa: E402

STREAM, GROUP, CHANNEL = "bare:jobs", "workers", "bare:events"
BOUND_S = 10.0  # the longest a job may take: the queue is paced to a fraction of a second
JOB_BYTES = 500  # about what ovq's job JSON of a 2-token chat weighs (`Job.to_json()`)


class Queue:
    """Both ends of the bare queue in one event loop."""

    def __init__(self, client: aioredis.Redis, step_s: float, frames: int) -> None:
        self.step_s, self.frames = step_s, frames
        self.api, self.worker = Lane(client), Lane(client)
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.running: dict[str, tuple[bytes, int]] = {}  # job id -> (its entry, events sent)
        self.done = 0

    async def submit(self) -> None:
        """One request: its job in, then its events until the last."""
        job = uuid.uuid4().hex
        ended = self.waiting[job] = asyncio.get_running_loop().create_future()
        body = orjson.dumps({"id": job, "pad": "x" * JOB_BYTES})
        await self.api.execute([["XADD", STREAM, "*", "job", body]])
        await ended
        self.done += 1

    async def listen(self, pubsub: Any) -> None:
        async for message in pubsub.listen():
            if message["type"] != "message":
                continue
            for job, last in orjson.loads(message["data"]):
                if last and job in self.waiting:
                    self.waiting.pop(job).set_result(None)

    async def consume(self) -> None:
        """The worker: a read, then one step of every running job, each `step_s`."""
        while True:
            started = time.perf_counter()
            commands: list[list[Any]] = [["XREADGROUP", "GROUP", GROUP, "w", "COUNT", 512, "STREAMS", STREAM, ">"]]
            events, ended = [], []
            for job, (entry, sent) in list(self.running.items()):
                last = sent + 1 == self.frames
                events.append((job, last))
                if last:
                    ended.append(entry)
                    del self.running[job]
                else:
                    self.running[job] = (entry, sent + 1)
            if events:
                commands.append(["PUBLISH", CHANNEL, orjson.dumps(events)])
            if ended:
                commands += [["XACK", STREAM, GROUP, *ended], ["XDEL", STREAM, *ended]]
            read = (await self.worker.execute(commands))[0]
            for _, entries in read or ():  # RESP as hiredis reads it: [[stream, [[entry, [field, value]]]]]
                for entry, (_, job) in entries:
                    self.running[orjson.loads(job)["id"]] = (entry, 0)
            await asyncio.sleep(max(0.0, self.step_s - (time.perf_counter() - started)))


async def drive(url: str, streams: int, rate: float, frames: int, duration: float) -> tuple[int, float, float]:
    """(requests done, Redis CPU seconds, wall seconds) of `duration` seconds of load, after a warm-up."""
    client = aioredis.from_url(url)
    await client.xgroup_create(STREAM, GROUP, id="$", mkstream=True)
    # A job lasts a read and `frames` steps: paced so that `streams` of them make about `rate` requests/s.
    queue = Queue(client, streams / rate / (frames + 1), frames)
    pubsub = client.pubsub()
    await pubsub.subscribe(CHANNEL)
    tasks = [asyncio.ensure_future(queue.listen(pubsub)), asyncio.ensure_future(queue.consume())]

    async def loop(until: float) -> None:
        while time.perf_counter() < until:
            for task in tasks:  # a failed end fails the run, not waits for it forever
                if task.done():
                    task.result()
                    raise RuntimeError("the bare queue's listener or consumer stopped")
            await asyncio.wait_for(queue.submit(), BOUND_S)

    try:
        await asyncio.gather(*(loop(time.perf_counter() + 1.0) for _ in range(streams)))  # warm-up
        before, queue.done, started = redis_cpu(url), 0, time.perf_counter()
        await asyncio.gather(*(loop(time.perf_counter() + duration) for _ in range(streams)))
        used, wall = redis_cpu(url) - before, time.perf_counter() - started
    finally:
        for task in tasks:
            task.cancel()
        await pubsub.aclose()
        await queue.api.close()
        await queue.worker.close()
        await client.aclose()
    return queue.done, used, wall


def redis_cpu(url: str) -> float:
    with redis.Redis.from_url(url) as client:
        info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def measure(streams: int, rate: float, frames: int, duration: float, unix: bool = False) -> dict[str, float]:
    """Redis's CPU per request of the bare queue, on a Redis of its own configured as scale.py's (`unix`: on a unix
    socket)."""
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis", port=0 if unix else free_port())
        url = server.start()
        try:
            done, used, wall = asyncio.run(drive(url, streams, rate, frames, duration))
        finally:
            server.stop()
    return {"req_s": done / wall, "redis_us_per_request": used / max(done, 1) * 1e6, "requests": done}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=600.0, help="requests/s to pace the jobs to")
    parser.add_argument("--frames", type=int, default=2, help="events per job, the last one ending it")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--duration", type=float, default=12.0)
    args = parser.parse_args()
    print(measure(args.streams, args.rate, args.frames, args.duration))


if __name__ == "__main__":
    main()
