"""`ovq batch-worker`: runs Batch API batches from ovq's rq queue (any number, on any hosts).

`RQ_KEY_PREFIX=ovq:rq rq worker --url $REDIS_URL ovq-batches` runs them too (the queue is
`{OVQ_KEY_PREFIX}-batches`, rq's keys `{OVQ_KEY_PREFIX}:rq:*`), and `RQ_KEY_PREFIX=ovq:rq rq info --url $REDIS_URL`
or rq-dashboard (with the same RQ_KEY_PREFIX) shows the queue; `ovq batch-worker` adds the quick take-over of
batches whose worker died, and keeps rq's heartbeats while a batch runs in its own process.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from common.batch.rq_keys import RQPrefixError, use_rq_prefix
from common.redis.client import Backoff, RedisURLError, connect_rq, describe, keys_for, reason, redis_url
from common.settings import Settings


def _wait_for_redis(settings: Settings) -> bool:
    deadline, backoff = time.monotonic() + settings.redis_wait_s, Backoff()
    while True:
        try:
            connect_rq(settings).ping()  # rq's own connection: on a Cluster, to the master of rq's slot
            return True
        except Exception as exc:  # redis-py's connection errors, whatever the version
            if time.monotonic() + backoff.delay > deadline:
                print(f"ovq batch-worker: Redis at {describe(redis_url(settings))} unreachable: {reason(exc)}",
                      file=sys.stderr)
                return False
            time.sleep(backoff.next())


def batch_worker(args: argparse.Namespace) -> int:
    if args.api_url:
        os.environ["OVQ_BATCH_API_URL"] = args.api_url
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        redis_url(settings)
    except RedisURLError as exc:
        print(f"ovq batch-worker: {exc}", file=sys.stderr)
        return 2
    try:
        use_rq_prefix(keys_for(settings))  # before rq is imported: rq reads its key prefix only then
    except (ValueError, RQPrefixError) as exc:
        print(f"ovq batch-worker: {exc}", file=sys.stderr)
        return 2
    if not _wait_for_redis(settings):
        return 1
    from workers.batch.worker import BatchWorker

    worker = BatchWorker(settings, connect_rq(settings), name=args.name)
    logging.getLogger("ovq.batch").info("batch worker on queue %s, sending lines to %s",
                                        keys_for(settings).batch_queue, settings.batch_api)
    worker.work(burst=args.burst, logging_level=settings.log_level.upper())
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("batch-worker", help="run Batch API batches from ovq's rq queue (any number, on any hosts)")
    p.add_argument("--api-url", help="the ovq API the batch's lines go to (default: OVQ_BATCH_API_URL)")
    p.add_argument("--name", help="the worker's name in rq (default: a random one)")
    p.add_argument("--burst", action="store_true", help="exit once the queue is empty")
    p.set_defaults(func=batch_worker)
