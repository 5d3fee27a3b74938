"""The HTTP server's own floor: what uvicorn costs to stream a chat completion's frames, with nothing of ovq.

A bare ASGI app on the server ovq's API runs on (uvicorn with uvloop and httptools, no access log) reads the JSON
body and streams what ovq streams for it: the head with the role chunk, then `frames` writes of content deltas
`gap_s` apart, the last with the finish chunk, the usage chunk and `[DONE]`. `benchmarks/scale.py --floor` runs it
at the request rate ovq reached, on the same client: a cost per request here is one no change to ovq's own code
can go below without another server. Its CPU per request grows as the rate falls (fewer requests share each of the
event loop's wake-ups), so it is only comparable at the same rate.

  python benchmarks/bare_server.py --rate 600 --frames 2    # alone: its CPU per request at 600 requests/s
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving import cpu_seconds, free_port  # noqa: E402
from sse_client import closed_loop  # noqa: E402

HEAD = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no")]


def frame(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The frames of one streamed chat completion, paced by OVQ_BARE_GAP_S and OVQ_BARE_FRAMES."""
    if scope["type"] != "http":
        return
    gap, frames = float(os.environ.get("OVQ_BARE_GAP_S", "0")), int(os.environ.get("OVQ_BARE_FRAMES", "1"))
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = orjson.loads(body)
    base = {"id": "chatcmpl-bare", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": request["model"]}
    await send({"type": "http.response.start", "status": 200, "headers": HEAD})
    await send({"type": "http.response.body", "more_body": True,
                "body": frame({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})})
    for i in range(frames):
        await asyncio.sleep(gap)
        data = frame({**base, "choices": [{"index": 0, "delta": {"content": "tok"}}]})
        last = i == frames - 1
        if last:
            usage = {"prompt_tokens": 19, "completion_tokens": frames, "total_tokens": 19 + frames}
            data += frame({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}) \
                + frame({**base, "choices": [], "usage": usage}) + b"data: [DONE]\n\n"
        await send({"type": "http.response.body", "body": data, "more_body": not last})


def measure(bodies: list[dict], streams: int, rate: float, frames: int, duration: float,
            processes: int = 1) -> dict[str, float]:
    """The bare server's CPU per request at about `rate` requests/s: `streams` closed-loop streams, each request
    lasting streams / rate seconds (its `frames` writes spread evenly over it)."""
    port = free_port()
    env = {**os.environ, "OVQ_BARE_GAP_S": str(streams / rate / max(frames, 1)), "OVQ_BARE_FRAMES": str(frames)}
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "bare_server:app", "--port", str(port),
                               "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level",
                               "warning", "--workers", str(processes)],
                              cwd=Path(__file__).resolve().parent, env=env)
    try:
        _wait(port)
        asyncio.run(closed_loop("127.0.0.1", port, bodies, streams, 1.0))  # warm-up
        tree = [psutil.Process(server.pid), *psutil.Process(server.pid).children(recursive=True)]
        before = cpu_seconds(tree)
        results, wall = asyncio.run(closed_loop("127.0.0.1", port, bodies, streams, duration))
        used = cpu_seconds(tree) - before
    finally:
        server.terminate()
        server.wait(30)
    ok = [r for r in results if r.ok]
    n = max(len(ok), 1)
    # What the client saw, as it counts ovq's streams: content events and the usage chunk's tokens per request.
    return {"req_s": len(ok) / wall, "us_per_request": used / n * 1e6, "failed": len(results) - len(ok),
            "events_per_request": sum(len(r.times) for r in ok) / n,
            "tokens_per_request": sum(r.tokens for r in ok) / n}


def _wait(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the bare server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=600.0, help="requests/s to pace the streams to")
    parser.add_argument("--frames", type=int, default=2, help="content writes per request")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--duration", type=float, default=12.0)
    args = parser.parse_args()
    body = {"model": "bare", "messages": [{"role": "user", "content": "Tell me about the number 7"}], "stream": True}
    print(measure([body], args.streams, args.rate, args.frames, args.duration))


if __name__ == "__main__":
    main()
