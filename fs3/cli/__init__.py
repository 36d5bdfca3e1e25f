"""The ``fs3`` command line."""

from __future__ import annotations

import argparse

__all__ = ["parse_size"]


def parse_size(text: str) -> int:
    """``65536``, ``64K``, ``4M``, ``1GiB``: bytes (K, M, G are powers of 1024). Raises
    ArgumentTypeError (argparse's ``type=`` reports it as the option's error)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    digits = t[:-1] if t[-1:] in units else t
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or a number with K, M or G)")
    return int(digits) * units.get(t[-1:], 1)
