"""The ``fs3`` command: one entry point for every daemon and tool (DESIGN §9).

Each subcommand lives in its own module exposing ``main(argv: list[str]) -> int``; this module only
dispatches. A subcommand whose module is not in this build says so and exits with EX_UNAVAILABLE (69)
instead of failing obscurely.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import NamedTuple

from fs3 import __version__
from fs3.errors import FS3Error

EX_UNAVAILABLE = 69


class Subcommand(NamedTuple):
    module: str
    summary: str
    issue: int  # where its work is tracked, for the "not in this build" message


SUBCOMMANDS: dict[str, Subcommand] = {
    "local": Subcommand(
        "fs3.local", "start, inspect and stop a whole cluster on this machine (up|down|status)", 8
    ),
    "mount": Subcommand("fs3.client.mount", "mount the file system with FUSE", 7),
    "umount": Subcommand("fs3.cli.umount", "unmount an fs3 mount; --force for one that is stuck", 7),
    "mgmtd": Subcommand("fs3.mgmtd.main", "run the cluster manager daemon", 4),
    "meta": Subcommand("fs3.meta.main", "run the metadata service daemon", 6),
    "storage": Subcommand("fs3.storage.main", "run the storage daemon", 5),
    "admin": Subcommand("fs3.cli.admin", "manage the cluster: nodes, targets, chains, users, files", 8),
    "bench": Subcommand("fs3.cli.bench", "run the benchmarks of bench/ against a cluster", 8),
    "config-template": Subcommand(
        "fs3.cli.config_template", "print a documented config file for a service", 2
    ),
}


def _parser() -> argparse.ArgumentParser:
    width = max(len(n) for n in SUBCOMMANDS)
    listing = "\n".join(f"  {n.ljust(width)}  {s.summary}" for n, s in SUBCOMMANDS.items())
    p = argparse.ArgumentParser(
        prog="fs3",
        description="fs3: a distributed file system for AI training and inference.",
        epilog=f"commands:\n{listing}\n\nRun 'fs3 COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"fs3 {__version__}")
    p.add_argument(
        "command", metavar="COMMAND", choices=sorted(SUBCOMMANDS), help="one of the commands below"
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    if not argv:  # argparse would name its internal "args" among what is missing
        parser.print_usage(sys.stderr)
        print("fs3: error: a COMMAND is needed; 'fs3 --help' lists them", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    sub = SUBCOMMANDS[args.command]
    if importlib.util.find_spec(sub.module) is None:
        print(
            f"fs3 {args.command}: not available in this build of fs3 {__version__} "
            f"(module {sub.module} is not written yet; tracked in issue {sub.issue})",
            file=sys.stderr,
        )
        return EX_UNAVAILABLE
    # No fs3 command needs gRPC in a forked child, and a non-root mount forks (libfuse runs
    # fusermount3) after its mgmtd client started: gRPC's fork handlers printed a line of their
    # own on the user's terminal. Set before the command imports gRPC.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    try:
        # in the try: Ctrl-C while the command's modules load (grpc, protobuf: most of a short
        # command's time) ends it as Ctrl-C later does, with 130 and no traceback
        module = importlib.import_module(sub.module)
        return int(module.main(args.args) or 0)
    except FS3Error as e:
        print(f"fs3 {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`fs3 admin list-chains | head`): as other tools, quietly; output
        # still buffered for the closed pipe must not fail again at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool the signal ended


if __name__ == "__main__":
    sys.exit(main())
