"""A content-check webhook that allows everything, for measuring what `--check-url` costs
the gateway (gateway/hooks/contentcheck.py).

An aiohttp server in its own process: every `POST /check` with the documented body
(`{"messages": [...]}`) is answered 200 `{"allow": [true, ...]}`, one verdict per
message; anything else is answered 400. It runs on uvloop, keeps connections alive,
decodes no content and logs no requests, so that it takes little of the CPU the gateway
and the load generators share. At exit (SIGINT or SIGTERM) it prints the requests and
messages it answered.

    python -m bench.check_hook --port 18777 &
    imgw bench chat --spawn-gateway --rates 2000 --duration 20 \\
        --gateway-arg=--check-url=http://127.0.0.1:18777/check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from typing import Final

import uvloop
from aiohttp import web

PATH: Final = "/check"


class Verdicts:
    """The handler and what it has answered."""

    def __init__(self) -> None:
        self.requests = 0
        self.messages = 0

    async def handle(self, request: web.Request) -> web.Response:
        try:
            n = len(json.loads(await request.read())["messages"])
        except (ValueError, KeyError, TypeError):
            return web.Response(status=400, text='expected {"messages": [...]}\n')
        self.requests += 1
        self.messages += n
        body = b'{"allow":[' + b",".join([b"true"] * n) + b"]}"
        return web.Response(body=body, content_type="application/json")


async def serve(host: str, port: int) -> Verdicts:
    """Serve until SIGINT or SIGTERM; what was answered."""
    verdicts = Verdicts()
    app = web.Application()
    app.router.add_post(PATH, verdicts.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"check_hook: serving http://{host}:{port}{PATH}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return verdicts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.check_hook",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="listen address (127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="listen port")
    args = p.parse_args(argv)
    verdicts = uvloop.run(serve(args.host, args.port))
    print(
        f"check_hook: answered {verdicts.requests} requests, {verdicts.messages} messages",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
