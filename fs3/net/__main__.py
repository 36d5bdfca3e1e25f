"""A standalone fs3 RPC endpoint, for health checks, tests and the benchmark.

    python -m fs3.net serve --listen 127.0.0.1:0        # prints "listening HOST:PORT", serves the system service
    python -m fs3.net ping HOST:PORT [--count N]

The cluster secret comes from ``--secret-file`` or the environment variable FS3_CLUSTER_SECRET,
never from the command line (which other users of the machine can read).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path

import uvloop

from fs3.cli import positive_int, positive_seconds
from fs3.errors import FS3Error
from fs3.net.client import RpcClient
from fs3.net.frame import RpcLimits
from fs3.net.server import RpcServer
from fs3.net.system import PING
from fs3.proto import rpc_pb2

log = logging.getLogger("fs3.net.main")


def _secret(args: argparse.Namespace) -> bytes:
    if args.secret_file:
        return Path(args.secret_file).read_bytes().strip()
    env = os.environ.get("FS3_CLUSTER_SECRET")
    if not env:
        raise SystemExit("no cluster secret: use --secret-file or set FS3_CLUSTER_SECRET")
    return env.encode()


async def _serve(args: argparse.Namespace) -> int:
    limits = RpcLimits(max_payload_bytes=args.max_payload_mib << 20)
    server = RpcServer(_secret(args), identity=args.identity, limits=limits)
    host, port = await server.start(args.listen)
    print(f"listening {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()
    return 0


async def _ping(args: argparse.Namespace) -> int:
    async with RpcClient(_secret(args), identity="fs3-net-ping") as client:
        for _ in range(args.count):
            start = time.perf_counter()
            try:
                response, _ = await client.call(
                    args.address, PING, rpc_pb2.PingRequest(), timeout=args.timeout
                )
            except FS3Error as e:
                print(f"{args.address}: {e}", file=sys.stderr)
                return 1
            print(f"{args.address}: {response.identity} in {(time.perf_counter() - start) * 1e6:.0f} us")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fs3.net", description=__doc__.split("\n\n")[0])
    parser.add_argument("--secret-file", help="file holding the cluster secret")
    parser.add_argument("--log-level", default="WARNING")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the system service")
    serve.add_argument("--listen", default="127.0.0.1:0")
    serve.add_argument("--identity", default="fs3-net")
    serve.add_argument("--max-payload-mib", type=positive_int, default=64)
    ping = sub.add_parser("ping", help="ping a server")
    ping.add_argument("address")
    ping.add_argument("--count", type=positive_int, default=1)
    ping.add_argument("--timeout", type=positive_seconds, default=5.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return uvloop.run(_serve(args) if args.command == "serve" else _ping(args))


if __name__ == "__main__":
    sys.exit(main())
