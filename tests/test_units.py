import time

import pytest

from jax_nbmem.units import (
    MISSING,
    format_bytes,
    format_bytes_delta,
    format_duration,
    format_time_of_day,
    parse_bytes,
)

GIB = 1024**3
MIB = 1024**2


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (12.3 * MIB, "12.3 MiB"),
        (123 * MIB, "123 MiB"),
        (1023.9 * MIB, "1.00 GiB"),  # rounds up into the next unit instead of "1024 MiB"
        (80 * GIB, "80.0 GiB"),
        (141 * GIB, "141 GiB"),
        (2 * 1024 * GIB, "2.00 TiB"),
        (-3 * GIB, "-3.00 GiB"),
    ],
)
def test_bytes_read_like_a_person_would_say_them(count, text):
    assert format_bytes(count) == text


def test_unknown_bytes_are_shown_as_missing_not_zero():
    assert format_bytes(None) == MISSING == "—"
    assert format_bytes(None, missing="n/a") == "n/a"
    assert format_bytes(float("nan")) == MISSING
    assert format_bytes(0) != MISSING


def test_deltas_carry_their_sign():
    assert format_bytes_delta(GIB) == "+1.00 GiB"
    assert format_bytes_delta(-12 * MIB) == "-12.0 MiB"
    assert format_bytes_delta(0) == "0 B"
    assert format_bytes_delta(None) == MISSING


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0004, "0.40 ms"),
        (0.85, "850 ms"),
        (0.9996, "1.00 s"),
        (1.25, "1.25 s"),
        (42, "42.0 s"),
        (59.97, "1 min 00 s"),
        (125, "2 min 05 s"),
        (3720, "1 h 02 min"),
        (-2, "-2.00 s"),
    ],
)
def test_durations_pick_a_readable_unit(seconds, text):
    assert format_duration(seconds) == text


def test_unknown_duration_is_missing():
    assert format_duration(None) == MISSING


def test_time_of_day_is_local_clock_time():
    moment = time.mktime((2024, 5, 17, 14, 3, 9, 0, 0, -1))
    assert format_time_of_day(moment) == "14:03:09"
    assert format_time_of_day(None) == MISSING


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("4GiB", 4 * GIB),
        ("4 gib", 4 * GIB),
        ("2g", 2 * GIB),
        ("512MB", 512_000_000),
        ("1.5 GiB", int(1.5 * GIB)),
        ("100", 100),
        (1024, 1024),
    ],
)
def test_sizes_parse_with_binary_and_decimal_units(text, count):
    assert parse_bytes(text) == count


@pytest.mark.parametrize("bad", ["", "lots", "4 XB", "-1GiB", -5, True, "1.2.3G"])
def test_bad_sizes_are_refused_with_a_reason(bad):
    with pytest.raises(ValueError):
        parse_bytes(bad)


def test_formatting_round_trips_through_parsing():
    for count in (GIB, 80 * GIB, 3 * MIB):
        assert parse_bytes(format_bytes(count).replace(" ", "")) == count
