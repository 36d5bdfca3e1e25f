"""Placement files and the commands that write and read them: gen-chains, create-targets,
upload-chains, upload-chain-table.

``gen-chains`` writes three CSV files (with a header line; ``#`` comments and blank lines are
ignored when read back), the counterpart of 3FS's ``gen_chain_table.py`` output:

* ``targets.csv``:      ``target_id,node_id,disk_index`` — what ``create-targets --file`` reads;
* ``chains.csv``:       ``chain_id,target_1,...,target_R`` (head first) — ``upload-chains`` reads it;
* ``chain-table.csv``:  ``chain_id``, one per line in table order — ``upload-chain-table`` reads it.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Callable, Iterator
from pathlib import Path

from fs3.cli.admin import (
    EX_OK,
    Connection,
    Progress,
    Result,
    UsageError,
    command,
    int_list,
    natural,
    u32,
    utf8_text,
)

TARGETS_FILE = "targets.csv"
CHAINS_FILE = "chains.csv"
CHAIN_TABLE_FILE = "chain-table.csv"
TARGETS_HEADER = ["target_id", "node_id", "disk_index"]
BATCH = 256  # targets per CreateTargets call, so a large cluster shows progress


def _rows(path: Path, first: Callable[[str], int] = natural) -> Iterator[tuple[int, list[int]]]:
    """(line number, whole numbers) for each data line; the header is the first non-comment line.
    ``first`` reads the first column (a narrower field's type, u32), ``natural`` the others."""
    try:
        text = path.read_text()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path} is not text (not valid UTF-8 at byte {e.start})") from None
    seen_header = False
    for lineno, row in enumerate(csv.reader(text.splitlines()), 1):
        cells = [c.strip() for c in row]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        if not seen_header and not cells[0].lstrip("-").isdigit():
            seen_header = True
            continue
        seen_header = True
        try:
            yield lineno, [(natural if i else first)(c) for i, c in enumerate(c for c in cells if c)]
        except argparse.ArgumentTypeError as e:
            raise UsageError(
                f"{path}:{lineno}: expected whole numbers, got {','.join(cells)!r}: {e}"
            ) from None


def read_targets(path: Path) -> list[tuple[int, int, int]]:
    out = []
    for lineno, nums in _rows(path):
        if len(nums) != 3:
            raise UsageError(f"{path}:{lineno}: expected target_id,node_id,disk_index")
        if nums[1] >= 1 << 32 or nums[2] >= 1 << 32:
            raise UsageError(f"{path}:{lineno}: node_id and disk_index must fit 32 bits")
        out.append((nums[0], nums[1], nums[2]))
    return out


def read_chains(path: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for lineno, nums in _rows(path, u32):
        if len(nums) < 2:
            raise UsageError(f"{path}:{lineno}: expected chain_id,target_1[,target_2...]")
        if nums[0] in out:
            raise UsageError(f"{path}:{lineno}: chain {nums[0]} appears twice")
        out[nums[0]] = nums[1:]
    return out


def read_chain_table(path: Path) -> list[int]:
    out = []
    for lineno, nums in _rows(path, u32):
        if len(nums) != 1:
            raise UsageError(f"{path}:{lineno}: expected one chain id per line")
        out.append(nums[0])
    return out


def write_placement(placement, out_dir: Path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Write the three files of ``placement`` (a :class:`fs3.placement.Placement`) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    replicas = max((len(c.target_ids) for c in placement.chains), default=0)
    paths = {
        k: out_dir / f
        for k, f in (("targets", TARGETS_FILE), ("chains", CHAINS_FILE), ("chain_table", CHAIN_TABLE_FILE))
    }
    with paths["targets"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TARGETS_HEADER)
        for t in placement.targets:
            w.writerow([t.target_id, t.node_id, t.disk_index])
    with paths["chains"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["chain_id", *(f"target_{i + 1}" for i in range(replicas))])
        for c in placement.chains:
            w.writerow([c.chain_id, *c.target_ids])
    with paths["chain_table"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["chain_id"])
        for cid in placement.chain_table:
            w.writerow([cid])
    return {k: str(v) for k, v in paths.items()}


# -- gen-chains -----------------------------------------------------------------------------------


def _gen_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=natural, required=True, help="storage nodes")
    p.add_argument("--disks", type=natural, required=True, help="disks per node")
    p.add_argument("--targets-per-disk", type=natural, required=True, help="targets on each disk")
    p.add_argument("--replicas", type=natural, required=True, help="targets per chain (replication factor)")
    p.add_argument("--node-ids", help="comma-separated node ids (default 10001, 10002, ...)")
    p.add_argument("--seed", type=natural, default=0, help="seed of the search (same seed, same output)")
    p.add_argument("--out", default=".", help="directory for the three files (default: here)")


@command(
    "gen-chains",
    "generate balanced targets, chains and a chain table as upload files",
    _gen_args,
    offline=True,
)
async def gen_chains(conn: Connection, args: argparse.Namespace) -> Result:
    from fs3.placement import generate_chains

    node_ids = int_list(args.node_ids, "--node-ids", u32) if args.node_ids else None
    try:
        placement = generate_chains(
            args.nodes, args.disks, args.targets_per_disk, args.replicas, node_ids=node_ids, seed=args.seed
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        files = write_placement(placement, Path(args.out))
    except OSError as e:  # a path to mend, like the other usage errors (it was a bare errno, exit 1)
        raise UsageError(f"cannot write the files into --out {args.out}: {e.strerror}") from None
    lo, hi = placement.pair_spread
    value = {
        "targets": len(placement.targets),
        "chains": len(placement.chains),
        "pair_chains_min": lo,
        "pair_chains_max": hi,
        "files": files,
    }
    msg = (
        f"{len(placement.targets)} targets, {len(placement.chains)} chains of {args.replicas}; "
        f"every pair of nodes shares {lo}..{hi} chains\n"
        f"wrote {files['targets']}, {files['chains']}, {files['chain_table']}\n"
        f"next: fs3 admin create-targets --file {files['targets']}; "
        f"fs3 admin upload-chains {files['chains']}; "
        f"fs3 admin upload-chain-table 1 {files['chain_table']}"
    )
    return Result(value=value, message=msg)


# -- uploads --------------------------------------------------------------------------------------


def _create_targets_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--file", help=f"a {TARGETS_FILE} (target_id,node_id,disk_index per line)")
    p.add_argument("--target-id", type=natural, help="one target: its id")
    p.add_argument("--node-id", type=u32, help="one target: its storage node")
    p.add_argument("--disk-index", type=u32, default=0, help="one target: its disk slot (default 0)")


@command(
    "create-targets",
    "create targets (from a targets file, or one with --target-id --node-id)",
    _create_targets_args,
)
async def create_targets(conn: Connection, args: argparse.Namespace) -> Result:
    from fs3.proto import mgmtd_pb2

    if args.file:
        specs = read_targets(Path(args.file))
        if not specs:  # as upload-chains refuses a file of no chains
            raise UsageError(f"{args.file} holds no targets")
    elif args.target_id is not None and args.node_id is not None:
        specs = [(args.target_id, args.node_id, args.disk_index)]
    else:
        raise UsageError("give --file FILE, or --target-id and --node-id")
    client = conn.mgmtd_client()
    # mgmtd takes a target that exists as it is as done: say which were new
    existed = {t.target_id for t in await client.list_targets()} & {t for t, _, _ in specs}
    progress = Progress("creating targets", len(specs))
    for i in range(0, len(specs), BATCH):
        batch = specs[i : i + BATCH]
        await client.create_targets(
            [mgmtd_pb2.TargetSpec(target_id=t, node_id=n, disk_index=d) for t, n, d in batch]
        )
        progress.step(len(batch))
    progress.finish()
    created = len(specs) - len(existed)
    message = f"created {created} targets" + (f" ({len(existed)} existed already)" if existed else "")
    return Result(value={"created": created, "existed": len(existed)}, message=message, status=EX_OK)


def _upload_chains_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help=f"a {CHAINS_FILE} (chain_id,target_1,...,target_R per line, head first)")
    p.add_argument(
        "--set-preferred-order", action="store_true", help="record each chain's order as its preferred order"
    )


@command(
    "upload-chains",
    "create chains from a chains file (one that exists only unchanged: change it with update-chain)",
    _upload_chains_args,
)
async def upload_chains(conn: Connection, args: argparse.Namespace) -> Result:
    chains = read_chains(Path(args.file))
    if not chains:
        raise UsageError(f"{args.file} holds no chains")
    await conn.mgmtd_client().upload_chains(chains, set_preferred_order=args.set_preferred_order)
    return Result(value={"chains": len(chains)}, message=f"uploaded {len(chains)} chains")


def _upload_table_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("table_id", type=u32, help="chain table id")
    p.add_argument("file", help=f"a {CHAIN_TABLE_FILE} (one chain id per line, in table order)")
    p.add_argument("--desc", type=utf8_text, default="", help="description")


@command("upload-chain-table", "upload a new version of a chain table", _upload_table_args)
async def upload_chain_table(conn: Connection, args: argparse.Namespace) -> Result:
    chain_ids = read_chain_table(Path(args.file))
    if not chain_ids:
        raise UsageError(f"{args.file} holds no chain ids")
    version = await conn.mgmtd_client().upload_chain_table(args.table_id, chain_ids, args.desc)
    return Result(
        value={"table_id": args.table_id, "version": version, "chains": len(chain_ids)},
        message=f"chain table {args.table_id} version {version}: {len(chain_ids)} chains",
    )
