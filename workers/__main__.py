"""`python -m workers --model NAME --device CPU`: one worker process for one model on one device."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

import uvloop

from common.models.config import ConfigError, ModelConfig
from common.models.prepare import prepare
from common.models.sources import find_model
from common.redis.client import RedisRefused, RedisURLError, connect, redis_url, wait_until_up
from common.servable import ServableType, infer_servable
from common.settings import Settings
from workers.engine.continuous import error_message


def worker_class(model: ModelConfig, device: str) -> type:
    """The servable type (from the directory and the device) says which worker runs the model."""
    kind = infer_servable(model.path, device, model.pipeline_type)
    if kind is ServableType.IMAGE:
        from workers.image.worker import ImageWorker

        return ImageWorker
    if kind is ServableType.VIDEO:
        from workers.video.worker import VideoWorker

        return VideoWorker
    if kind in (ServableType.S2T, ServableType.T2S):
        from workers.audio.worker import SpeechWorker

        return SpeechWorker
    if kind in (ServableType.EMBEDDINGS, ServableType.RERANK):
        from workers.embed.worker import EncoderWorker

        return EncoderWorker
    from workers.text.worker import TextWorker

    return TextWorker


async def _wait_for_redis(settings: Settings, url: str) -> None:
    client = connect(settings, max_connections=1)
    try:
        await wait_until_up(client, url, settings.redis_wait_s, "ovq worker")
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ovq worker")
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--config", default=None, help="models file (YAML or JSON)")
    args = parser.parse_args(argv)
    overrides = {"config": args.config} if args.config else {}
    settings = Settings(**overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        model = find_model(settings, args.model)
    except KeyError:
        print(f"ovq worker: no model named {args.model!r} in the models file", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"ovq worker: {exc}", file=sys.stderr)
        return 2
    try:
        url = redis_url(settings)
    except RedisURLError as exc:
        print(f"ovq worker: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_wait_for_redis(settings, url))
    except TimeoutError as exc:
        print(f"ovq worker: {exc}; exiting", file=sys.stderr)
        return 1
    except RedisRefused as exc:
        print(f"ovq worker: {exc}", file=sys.stderr)
        return 2
    prepare(model)
    device = args.device.upper()
    try:
        uvloop.run(worker_class(model, device)(settings, model, device).run())
    except RuntimeError as exc:
        print(f"ovq worker: device {args.device} unavailable for {model.name}: {error_message(exc)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
