"""``fs3 admin COMMAND``: manage an fs3 cluster (DESIGN §5, §9; 3FS's admin_cli, reference §9.4).

Connection settings, first found wins:

* mgmtd addresses: ``--mgmtd host:port[,host:port...]``, ``$FS3_MGMTD_ADDRESSES``, a local cluster's
  (``--local-dir``, ``$FS3_LOCAL_DIR`` or the default ``fs3 local`` directory when it holds one),
  else ``127.0.0.1:8000``;
* credentials: ``--token-file``, ``$FS3_TOKEN_FILE``, ``$FS3_TOKEN``, the local cluster's admin token;
  ``--secret-file`` / ``$FS3_CLUSTER_SECRET_FILE`` / the local cluster's secret (needed by
  init-cluster, and by ls/stat/checksum to speak fs3 RPC to meta and storage).

A ``--local-dir`` given on the command line names the cluster: its settings come before the
``$FS3_*`` variables (not before other flags), which would otherwise reach another cluster.

Output is a table for people, or JSON with ``--json`` (an object or a list of objects per command).
Exit status: 0 done, 1 the operation failed (one line on standard error says why), 2 usage error,
69 a service could not be reached, 3 ``checksum`` found replicas that differ (or could not read
every replica).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fs3.cli import positive_seconds
from fs3.config import _host_port, env_list
from fs3.errors import FS3Error, StatusCode
from fs3.net.transport import format_address

EX_OK = 0
EX_FAILED = 1
EX_USAGE = 2
EX_MISMATCH = 3
EX_UNAVAILABLE = 69
DEFAULT_MGMTD = "127.0.0.1:8000"

# Codes that mean "could not reach a service" rather than "the service said no".
UNREACHABLE = frozenset(
    {
        StatusCode.UNAVAILABLE,
        StatusCode.DEADLINE_EXCEEDED,
        StatusCode.RPC_CONNECT_FAILED,
        StatusCode.RPC_CONNECTION_CLOSED,
    }
)


class UsageError(Exception):
    """Bad arguments found after parsing (exit status 2)."""


MAX_ID = (1 << 64) - 1  # the widest id field (u64); a narrower one's limit is checked where it is set


def _whole(text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{value} is out of range ({low} to {high})")
    return value


def natural(text: str) -> int:
    """An argparse type: a whole number from 0 to MAX_ID (ids, counts, versions are none of them
    negative; protobuf refused one with a traceback)."""
    return _whole(text, 0, MAX_ID)


def positive(text: str) -> int:
    """An argparse type: a whole number from 1 to MAX_ID (a limit of 0 would mean nothing)."""
    return _whole(text, 1, MAX_ID)


def u32(text: str) -> int:
    """An argparse type: a whole number that fits 32 bits (node, chain and table ids, uids, gids)."""
    return _whole(text, 0, (1 << 32) - 1)


def utf8_text(value: str) -> str:
    """An argparse type: text that is UTF-8 (Python hands bytes that are not on as surrogates, which
    the protobuf request refused with a traceback: a description, a user name)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{value!r} is not valid UTF-8") from None
    return value


def int_list(text: str, option: str, item: Callable[[str], int] = natural) -> list[int]:
    """A comma-separated list of whole numbers (each read by ``item``) from option ``option``
    (UsageError if it is not one)."""
    try:
        return [item(x) for x in text.split(",") if x.strip()]
    except argparse.ArgumentTypeError:
        raise UsageError(f"{option} takes comma-separated whole numbers, not {text!r}") from None


@dataclass
class Result:
    """What a command shows: rows under ``columns`` (a table, or a JSON list), or one ``value``
    (a JSON object) with a ``message`` for people; ``status`` is the exit status."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    columns: Sequence[str] = ()
    value: dict[str, Any] | None = None
    message: str = ""
    status: int = EX_OK


@dataclass
class Connection:
    """Where the cluster is and who we are to it."""

    mgmtd: list[str]
    token: str | None
    secret: bytes | None
    local_dir: Path | None
    timeout_s: float
    _mgmtd_client: Any = None
    token_source: str = ""  # where the token came from, for messages

    def mgmtd_client(self, *, with_secret: bool = False):  # type: ignore[no-untyped-def]
        """A MgmtdClient with the token (or, for init-cluster, the cluster secret)."""
        from fs3.client.mgmtd_client import MgmtdClient

        if self._mgmtd_client is None:
            use_secret = with_secret or not self.token
            self._mgmtd_client = MgmtdClient(
                self.mgmtd,
                token=None if with_secret else self.token,
                cluster_secret=self.secret if use_secret else None,
                timeout_s=self.timeout_s,
                log_outages=False,  # the command reports the error itself
            )
        return self._mgmtd_client

    async def close(self) -> None:
        if self._mgmtd_client is not None:
            await self._mgmtd_client.close()
            self._mgmtd_client = None


def _read_file(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path} is not text (not valid UTF-8 at byte {e.start})") from None


def _local_dir(args: argparse.Namespace) -> Path | None:
    if args.local_dir:
        d = Path(args.local_dir)
        if not (d / "local.json").exists():
            raise UsageError(f"{d} holds no fs3 local cluster (no local.json)")
        return d
    if args.mgmtd is not None or os.environ.get("FS3_MGMTD_ADDRESSES"):
        return None
    from fs3.cli.local_cluster import default_dir

    d = default_dir()
    return d if (d / "local.json").exists() else None


def connection(args: argparse.Namespace) -> Connection:
    """Resolve the connection settings (see the module docstring)."""
    local = _local_dir(args)
    mgmtd: list[str] = []
    # the cluster a --local-dir flag names is the one meant, whatever the environment says
    env: Mapping[str, str] = {} if args.local_dir else os.environ
    if args.mgmtd is not None:
        mgmtd = [a.strip() for a in args.mgmtd.split(",") if a.strip()]
        if not mgmtd:  # `--mgmtd "$UNSET_VAR"`: not the default cluster, which nobody named
            raise UsageError(f"--mgmtd {args.mgmtd!r} names no address: give host:port[,host:port...]")
    elif env.get("FS3_MGMTD_ADDRESSES"):
        # the same forms the daemons and clients take (fs3.config): a TOML array or a comma list
        found = env_list(env["FS3_MGMTD_ADDRESSES"])
        mgmtd = [str(a) for a in found] if isinstance(found, list) else [str(found)]
    elif local is not None:
        try:
            state = json.loads((local / "local.json").read_text())
            mgmtd = [format_address(state["host"], state["ports"]["mgmtd"])]
        except (OSError, ValueError, KeyError, TypeError) as e:
            what = f"no {e} in it" if isinstance(e, KeyError) else str(e)
            raise UsageError(
                f"cannot read {local / 'local.json'} ({what}): the fs3 local cluster's state file; "
                "pass --mgmtd, or --local-dir for another cluster"
            ) from None
    mgmtd = [a.strip() for a in mgmtd if a.strip()] or [DEFAULT_MGMTD]
    for address in mgmtd:  # as the daemons' configs take them (a bare host went to port 443)
        if why := _host_port(address):
            raise UsageError(f"--mgmtd (or $FS3_MGMTD_ADDRESSES) {why}")
    token: str | None = None
    token_file = args.token_file or env.get("FS3_TOKEN_FILE")
    source = ""
    if token_file:
        token = _read_file(token_file, "token file")
        if not token:
            raise UsageError(f"token file {token_file} is empty")
        source = f"{'--token-file' if args.token_file else '$FS3_TOKEN_FILE'} {token_file}"
    elif env.get("FS3_TOKEN"):
        token = env["FS3_TOKEN"].strip()
        source = "$FS3_TOKEN"
    elif local is not None and (local / "admin.token").exists():
        token = _read_file(local / "admin.token", "token file")
        source = f"the local cluster's {local / 'admin.token'}"
    secret: bytes | None = None
    secret_file = args.secret_file or env.get("FS3_CLUSTER_SECRET_FILE")
    if not secret_file and local is not None:
        secret_file = str(local / "cluster.secret")
    if secret_file:
        secret = _read_file(secret_file, "cluster secret file").encode()
        if len(secret) < 16:
            raise UsageError(f"cluster secret file {secret_file}: a secret has at least 16 bytes")
    return Connection(mgmtd, token, secret, local, args.timeout, token_source=source)


# -- output ---------------------------------------------------------------------------------------


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned columns under an upper-case header."""
    cells = [[str(c).upper() for c in columns]]
    for row in rows:
        cells.append([_cell(row.get(c, "")) for c in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _cell(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return str(v)


def emit(result: Result, as_json: bool) -> None:
    if as_json:
        payload: Any = result.value if result.value is not None else result.rows
        print(json.dumps(payload, indent=2, default=str))
        return
    if result.columns:
        print(render_table(result.rows, result.columns))
    elif result.value is not None and not result.message:
        for k, v in result.value.items():
            print(f"{k}: {_cell(v)}")
    if result.message:
        print(result.message)


class Progress:
    """``what: done/total`` on standard error while something long runs (only on a terminal, so
    scripts and logs stay clean)."""

    def __init__(self, what: str, total: int) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self.enabled = sys.stderr.isatty() and total > 1

    def step(self, n: int = 1) -> None:
        self.done += n
        if self.enabled:
            sys.stderr.write(f"\r{self.what}: {self.done}/{self.total}")
            sys.stderr.flush()

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


# -- commands -------------------------------------------------------------------------------------

Handler = Callable[[Connection, argparse.Namespace], Awaitable[Result]]


@dataclass
class Command:
    name: str
    help: str
    handler: Handler
    setup: Callable[[argparse.ArgumentParser], None] = lambda p: None
    needs_connection: bool = True


COMMANDS: dict[str, Command] = {}


def command(
    name: str,
    help: str,
    setup: Callable[[argparse.ArgumentParser], None] = lambda p: None,
    *,
    offline: bool = False,
) -> Callable[[Handler], Handler]:
    """Register ``fs3 admin NAME``: ``setup`` adds its arguments, the handler returns a Result."""

    def register(fn: Handler) -> Handler:
        COMMANDS[name] = Command(name, help, fn, setup, not offline)
        return fn

    return register


def _common(p: argparse.ArgumentParser, *, before_command: bool) -> None:
    """Connection and output flags, accepted before the command and after it. After it they
    default to SUPPRESS, so that a subcommand does not reset what was given before it."""

    def d(value: object) -> object:
        return value if before_command else argparse.SUPPRESS

    g = p.add_argument_group("connection")
    g.add_argument(
        "--mgmtd",
        metavar="ADDRS",
        default=d(None),
        help="mgmtd host:port list, comma separated ($FS3_MGMTD_ADDRESSES)",
    )
    g.add_argument(
        "--token-file", metavar="FILE", default=d(None), help="file holding a user token ($FS3_TOKEN_FILE)"
    )
    g.add_argument(
        "--secret-file",
        metavar="FILE",
        default=d(None),
        help="cluster secret file ($FS3_CLUSTER_SECRET_FILE)",
    )
    g.add_argument(
        "--local-dir",
        metavar="DIR",
        default=d(None),
        help="use the settings of the 'fs3 local' cluster in DIR",
    )
    g.add_argument(
        "--timeout", type=positive_seconds, default=d(15.0), help="seconds to keep retrying (default 15)"
    )
    p.add_argument("--json", action="store_true", default=d(False), help="print JSON instead of a table")


def parser() -> argparse.ArgumentParser:
    import importlib

    # importing registers the commands; this order is the order --help lists them in
    for module in ("admin_cluster", "admin_placement", "admin_fs"):
        importlib.import_module(f"fs3.cli.{module}")

    p = argparse.ArgumentParser(
        prog="fs3 admin",
        description="Manage an fs3 cluster: nodes, targets, chains, users, configs and files.",
        epilog=(
            "Connection: --mgmtd or $FS3_MGMTD_ADDRESSES, --token-file or $FS3_TOKEN_FILE, --secret-file or "
            "$FS3_CLUSTER_SECRET_FILE; without them, the 'fs3 local' cluster's settings. Exit status: 0 ok, "
            "1 failed, 2 usage, 3 checksum mismatch, 69 unreachable. Run 'fs3 admin COMMAND --help' for more."
        ),
    )
    _common(p, before_command=True)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        cmd = COMMANDS[name]
        sp = sub.add_parser(name, help=cmd.help, description=cmd.help)
        cmd.setup(sp)
        _common(sp, before_command=False)
        sp.set_defaults(_command=cmd)
    return p


async def _run(cmd: Command, args: argparse.Namespace) -> Result:
    conn = connection(args) if cmd.needs_connection else Connection([], None, None, None, args.timeout)
    try:
        return await cmd.handler(conn, args)
    finally:
        await conn.close()


def _has_credentials(args: argparse.Namespace) -> bool:
    try:
        conn = connection(args)
    except UsageError:
        return False
    return bool(conn.token)


def _unreachable_hint(args: argparse.Namespace) -> str:
    """What to check when mgmtd did not answer: which cluster was tried, and how to name another."""
    try:
        conn = connection(args)
    except UsageError:
        return ""
    named = args.mgmtd or (None if args.local_dir else os.environ.get("FS3_MGMTD_ADDRESSES"))
    if conn.local_dir is not None and not named:
        d = conn.local_dir
        return f" (is the fs3 local cluster in {d} running? start it with: fs3 local up --dir {d})"
    if conn.mgmtd == [DEFAULT_MGMTD] and not named:
        return (
            f" (no cluster was named, so the default {DEFAULT_MGMTD} was tried: pass --mgmtd or "
            "$FS3_MGMTD_ADDRESSES, or --local-dir or $FS3_LOCAL_DIR for a local cluster's directory)"
        )
    return ""


def _local_path(path: object) -> bool:
    """Whether ``path`` (a command's fs3 path) names something on this machine, below its root:
    most likely a path through a mount, given where a path inside fs3 belongs."""
    return isinstance(path, str) and path.startswith("/") and path.strip("/") != "" and os.path.exists(path)


def main(argv: list[str]) -> int:
    """Entry point of ``fs3 admin``; returns the exit status."""
    args = parser().parse_args(argv)
    cmd: Command = args._command
    try:
        result = asyncio.run(_run(cmd, args))
    except UsageError as e:
        print(f"fs3 admin {cmd.name}: {e}", file=sys.stderr)
        return EX_USAGE
    except FS3Error as e:
        hint = ""
        if e.code in (StatusCode.UNAUTHENTICATED, StatusCode.PERMISSION_DENIED) and not _has_credentials(
            args
        ):
            hint = " (no token given: --token-file, $FS3_TOKEN_FILE or --local-dir)"
        elif e.code in UNREACHABLE:
            hint = _unreachable_hint(args)
        elif e.code == StatusCode.NOT_FOUND and _local_path(getattr(args, "path", None)):
            hint = (
                f" ({args.path} is a path on this machine, a mount's perhaps: fs3 admin takes paths "
                "inside fs3, from its root)"
            )
        print(f"fs3 admin {cmd.name}: {e}{hint}", file=sys.stderr)
        return EX_UNAVAILABLE if e.code in UNREACHABLE else EX_FAILED
    except OSError as e:
        print(f"fs3 admin {cmd.name}: {e}", file=sys.stderr)
        return EX_FAILED
    emit(result, args.json)
    return result.status
