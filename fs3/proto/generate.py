"""Generate the Python modules of ``proto/*.proto`` into ``fs3/proto`` (run by ``make proto``).

The .proto files live in the repository's top-level ``proto/`` folder and import each other as
``fs3/proto/<name>.proto``; protoc is told that ``proto/`` *is* ``fs3/proto`` so that the generated
modules import each other as ``fs3.proto.<name>_pb2``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"


def generate(out_dir: Path, proto_dir: Path = PROTO_DIR) -> list[Path]:
    """Run protoc over every .proto in ``proto_dir``; return the files written under ``out_dir``."""
    import grpc_tools
    from grpc_tools import protoc  # dev dependency, imported only here

    protos = sorted(proto_dir.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files in {proto_dir}")
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-Ifs3/proto={proto_dir}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[f"fs3/proto/{p.name}" for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out_dir / "fs3" / "proto").glob("*_pb2*.py*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="directory that receives fs3/proto/*")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
