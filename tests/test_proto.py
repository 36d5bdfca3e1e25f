"""The generated modules in fs3/proto match proto/*.proto (run `make proto` when this fails)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fs3.proto.generate import PROTO_DIR, ROOT, generate

pytest.importorskip("grpc_tools", reason="grpcio-tools (the dev extra) generates the protobuf modules")


@pytest.mark.timeout(120)
def test_generated_modules_are_not_stale(tmp_path):
    fresh = {p.name: p.read_bytes() for p in generate(tmp_path)}
    committed_dir = ROOT / "fs3" / "proto"
    committed = {p.name: p.read_bytes() for p in committed_dir.glob("*_pb2*.py*")}
    stale = sorted(n for n in fresh if committed.get(n) != fresh[n])
    orphans = sorted(set(committed) - set(fresh))
    assert not stale, f"stale generated modules, run `make proto`: {stale}"
    assert not orphans, f"generated modules without a .proto, delete them: {orphans}"
    assert {Path(n).stem.split("_pb2")[0] for n in fresh} == {p.stem for p in PROTO_DIR.glob("*.proto")}


def test_every_proto_imports_cleanly():
    import importlib

    for proto in PROTO_DIR.glob("*.proto"):
        importlib.import_module(f"fs3.proto.{proto.stem}_pb2")
