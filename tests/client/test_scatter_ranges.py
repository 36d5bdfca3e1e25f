"""The scattered write buffer's range map (client.file._put_range, _cut_range) against a byte model."""

from __future__ import annotations

import random

import pytest

from fs3.client.file import _cut_range, _put_range

SIZE = 4096


def check(ranges: list[list], model: list[int | None]) -> None:
    """``ranges`` are sorted and apart, and hold exactly the model's written bytes."""
    seen: list[int | None] = [None] * SIZE
    end = -1
    for offset, data in ranges:
        assert data and offset > end, ranges  # none empty, none touching or overlapping
        end = offset + len(data)
        seen[offset:end] = list(data)
    assert seen == model


@pytest.mark.parametrize("seed", range(20))
def test_random_puts_and_cuts_match_a_byte_model(seed: int) -> None:
    rng = random.Random(seed)
    ranges: list[list] = []
    model: list[int | None] = [None] * SIZE
    held = 0
    for step in range(300):
        begin = rng.randrange(SIZE)
        end = min(SIZE, begin + rng.choice([1, 2, 7, 64, 300, 1500]))
        if rng.random() < 0.75:
            data = bytes([step % 251 + 1]) * (end - begin)
            held += _put_range(ranges, begin, memoryview(data))
            model[begin:end] = list(data)
        else:
            held -= _cut_range(ranges, begin, end)
            model[begin:end] = [None] * (end - begin)
        check(ranges, model)
        assert held == sum(b is not None for b in model)


def test_touching_ranges_join_and_cuts_split() -> None:
    ranges: list[list] = []
    assert _put_range(ranges, 10, memoryview(b"ab")) == 2
    assert _put_range(ranges, 12, memoryview(b"cd")) == 2  # touching: one range
    assert _put_range(ranges, 5, memoryview(b"xyzw")) == 4
    assert ranges == [[5, bytearray(b"xyzw")], [10, bytearray(b"abcd")]]
    assert _put_range(ranges, 8, memoryview(b"12345")) == 1  # fills the one-byte gap, over w, a, b, c
    assert ranges == [[5, bytearray(b"xyz12345d")]]
    assert _cut_range(ranges, 7, 9) == 2
    assert ranges == [[5, bytearray(b"xy")], [9, bytearray(b"2345d")]]
    assert _cut_range(ranges, 0, 100) == 7 and ranges == []
