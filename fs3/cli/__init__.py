"""The ``fs3`` command line, and the argparse types its commands share."""

from __future__ import annotations

import argparse
import math

__all__ = ["parse_size", "positive_seconds", "seconds"]


def parse_size(text: str) -> int:
    """``65536``, ``64K``, ``4M``, ``1GiB``: bytes (K, M, G are powers of 1024). Raises
    ArgumentTypeError (argparse's ``type=`` reports it as the option's error)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    digits = t[:-1] if t[-1:] in units else t
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or a number with K, M or G)")
    return int(digits) * units.get(t[-1:], 1)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    return value


def seconds(text: str) -> float:
    """An argparse type: a finite, non-negative number of seconds (0 where 0 means none, as a
    token's ttl)."""
    value = _number(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a finite, non-negative number of seconds")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 (how long to wait: 0, a negative or an
    infinite wait either gave up at once or never did)."""
    value = _number(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, not {text}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: a whole number above 0 (a count, a size in MiB)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number above 0, not {text}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a whole number above 0, not {text}")
    return value
