"""`ovq redis`: the embedded redis-server in the foreground (for a Procfile), append-only, data in the cache dir."""
from __future__ import annotations

import argparse
import os
import sys

from common.redis.client import embedded_socket
from common.redis.server import server_args
from common.settings import Settings


def run(args: argparse.Namespace) -> int:
    settings = Settings()
    socket = embedded_socket(settings)
    socket.parent.mkdir(parents=True, exist_ok=True)
    socket.unlink(missing_ok=True)
    argv = server_args(socket.parent, args.port, socket, appendonly=not args.no_appendonly)
    where = f"{socket}" + (f" and 127.0.0.1:{args.port}" if args.port else "")
    print(f"ovq redis: listening on {where}, data in {socket.parent}", file=sys.stderr, flush=True)
    os.execv(argv[0], argv)  # redis-server itself answers SIGTERM (it saves and exits 0)
    return 1


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("redis", help="the embedded Redis in the foreground (the tiers' default REDIS_URL)")
    p.add_argument("--port", type=int, default=0, help="also listen on loopback TCP (default: socket only)")
    p.add_argument("--no-appendonly", action="store_true", help="keep no append-only file (queued jobs are lost "
                   "when it stops)")
    p.set_defaults(func=run)
