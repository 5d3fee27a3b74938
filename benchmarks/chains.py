#!/usr/bin/env python3
"""Long Responses chains, measured: what one turn of a `previous_response_id` chain costs the API and Redis after 10,
100 and 1,000 turns.

A turn is the API's own work for a chained response, on the code the API runs (api/openai/responses/): read the
chain and make the chat request (`ResponsesServing.history`: the store's reads, and with `truncation: auto` the cut,
rendered by the model's chat template and counted by its tokenizer), then store the ended response with its items'
token counts (`store.save`). Generation is a worker's and is left out: here the answer is a fixed text. The model
is the tiny Llama of tests/models (its ChatML template and tokenizer, a 2,048-token context), announced on a
private redis-server that nothing else uses, so the server's own counters (INFO commandstats and stats) are the
turn's: commands, bytes Redis sent (what the API read) and received (what it wrote). API CPU is this process's CPU
time for the turn (Redis runs in its own process). Each figure is the mean of `--sample` turns taken after the chain
reached the length, each continuing the chain's last response (forks of it: each turn measured is turn N+1).

  python benchmarks/chains.py                     # auto and disabled, 10, 100 and 1,000 turns
  python benchmarks/chains.py --lengths 10,100 --sample 10

With `truncation: disabled` a chain longer than the context is refused (a 400, as OpenAI's), so that arm stops
at the length where it is; with `auto` the oldest turns are dropped and the chain goes on.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from api.openai.conversations.store import ConversationStore  # noqa: E402
from api.openai.conversations.turns import ConversationTurns  # noqa: E402
from api.openai.responses.chain import item_tokens  # noqa: E402
from api.openai.responses.convert import stored_items  # noqa: E402
from api.openai.responses.events import initial_response, new_id  # noqa: E402
from api.openai.responses.protocol import OutputMessage, OutputText, ResponsesRequest  # noqa: E402
from api.openai.responses.serving import ResponsesServing  # noqa: E402
from api.openai.responses.store import ResponseStore  # noqa: E402
from api.openai.serving import Serving  # noqa: E402
from api.queue.registry import Registry  # noqa: E402
from common.errors import OvqError  # noqa: E402
from common.keys import Keys  # noqa: E402
from common.modelcard import ModelCard  # noqa: E402
from common.owner import Caller  # noqa: E402
from common.redis.server import EmbeddedRedis  # noqa: E402
from common.servable import ServableType  # noqa: E402
from common.settings import Settings  # noqa: E402

MODEL = "tiny-llama"
DIRECTORY = ROOT / "tests" / "models" / MODEL
CALLER = Caller("bench")
USER = "Tell me about the reading room of the library and its catalogue, please. "
ANSWER = "The reading room holds the catalogue, the atlases and the periodicals of the library. "


class Arm:
    """One chain, turn after turn, with one truncation setting."""

    def __init__(self, responses: ResponsesServing, settings: Settings, truncation: str) -> None:
        self.responses, self.settings, self.truncation = responses, settings, truncation
        self.previous: str | None = None
        self.turns = 0

    async def turn(self, advance: bool = True) -> None:
        """The next turn; without `advance`, a turn that forks from the same response (measured turns all
        continue the chain at the length being measured)."""
        body = ResponsesRequest(model=MODEL, input=USER, previous_response_id=self.previous, max_output_tokens=16,
                                truncation=self.truncation)
        history, _, _ = await self.responses.history(body, CALLER)  # and the chat request create hands on
        response = initial_response(body)
        response.output = [OutputMessage(id=new_id("msg"), status="completed", content=[OutputText(text=ANSWER)])]
        response.status = "completed"
        stored = stored_items(body, response)
        tokens = await item_tokens(self.settings, MODEL, stored)
        chain = history.chain.fitted(2048)
        await self.responses.store.save(response, stored, len(stored) - 1, chain, CALLER.tenant, tokens)
        if advance:
            self.previous, self.turns = response.id, self.turns + 1


async def counters(redis: aioredis.Redis) -> tuple[int, int, int]:
    """Commands run, bytes sent and bytes received by the server so far."""
    stats = await redis.info("stats")
    calls = sum(entry["calls"] for entry in (await redis.info("commandstats")).values())
    return calls, stats["total_net_output_bytes"], stats["total_net_input_bytes"]


async def measure(arm: Arm, redis: aioredis.Redis, sample: int) -> tuple[float, ...]:
    first, second = await counters(redis), await counters(redis)
    own = [b - a for a, b in zip(first, second, strict=True)]  # what reading the counters costs, taken off
    before, cpu = await counters(redis), time.process_time_ns()
    for _ in range(sample):
        await arm.turn(advance=False)
    cpu = time.process_time_ns() - cpu
    after = await counters(redis)
    calls, read, written = ((b - a - o) / sample for a, b, o in zip(before, after, own, strict=True))
    return calls, read, written, cpu / sample / 1000


def card() -> ModelCard:
    config = json.loads((DIRECTORY / "tokenizer_config.json").read_text())
    return ModelCard(name=MODEL, device="CPU", servable_type=ServableType.LM_CB, context_length=2048,
                     chat_template=config["chat_template"], bos_token="", eos_token="", created=0)


async def main(lengths: list[int], sample: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models.json"
        models.write_text(json.dumps({"models": {MODEL: {"path": str(DIRECTORY)}}}))
        settings = Settings(config=models)
        server = EmbeddedRedis(Path(tmp) / "redis", appendonly=False)
        url = server.start()
        try:
            redis = aioredis.from_url(url)
            keys = Keys("bench")
            await redis.hset(keys.model(MODEL), "CPU", card().model_dump_json())
            registry = Registry(redis, keys, settings, [MODEL])
            serving = Serving(SimpleNamespace(settings=settings, keys=keys, redis=redis), registry, None)  # type: ignore[arg-type]
            responses = ResponsesServing(serving, ResponseStore(redis, keys, settings),
                                         ConversationTurns(ConversationStore(redis, keys, settings)))
            print("truncation | turns | Redis commands/turn | bytes read/turn | bytes written/turn | API CPU µs/turn")
            for truncation in ("auto", "disabled"):
                arm = Arm(responses, settings, truncation)
                for length in lengths:
                    try:
                        while arm.turns < length:
                            await arm.turn()
                        row: Any = await measure(arm, redis, sample)
                    except OvqError as exc:
                        print(f"{truncation:>10} | {length:5d} | refused: {exc.body.code} (turn {arm.turns + 1})")
                        break
                    print(f"{truncation:>10} | {length:5d} | {row[0]:8.0f} | {row[1]:10.0f} | {row[2]:10.0f} | "
                          f"{row[3]:8.0f}")
            await redis.aclose()
        finally:
            server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="10,100,1000", help="chain lengths to measure at")
    parser.add_argument("--sample", type=int, default=20, help="turns measured at each length")
    args = parser.parse_args()
    asyncio.run(main([int(n) for n in args.lengths.split(",")], args.sample))
