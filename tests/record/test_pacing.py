"""When the sampler's thread polls for ended cells instead of being woken (record/pacing.py)."""

import pytest

from jax_nbmem.record.pacing import POLL_S, WINDOW_S, Pacing, next_deadline


def test_the_schedule_keeps_its_grid_and_skips_a_backlog_instead_of_bursting():
    assert next_deadline(10.0, now=10.03, interval=0.1) == pytest.approx(10.1)
    assert next_deadline(10.0, now=10.12, interval=0.1) == pytest.approx(10.1)  # no sleep
    assert next_deadline(10.0, now=12.0, interval=0.1) == 12.0  # stalled: restart from now


def passes(pacing, now, **given):
    flags = {"read_for_cells": False, "woken": False, "polled": False, "cell_running": False}
    return pacing.after_pass(now, **{**flags, **given})


def test_polling_begins_only_when_a_cell_s_end_woke_the_thread_for_its_reading():
    pacing = Pacing()
    assert passes(pacing, 1.0, read_for_cells=True) is None  # a tick found it: back to back
    assert passes(pacing, 1.0, woken=True) is None  # a request, no cell
    assert not pacing.active and pacing.next_wake(1.0, deadline=1.1) == (1.1, False)
    assert passes(pacing, 1.0, read_for_cells=True, woken=True) is True
    assert pacing.active and pacing.next_wake(1.0, deadline=1.1) == (1.0 + POLL_S, True)
    assert pacing.next_wake(1.098, deadline=1.1) == (1.1, False)  # the tick is as near


def test_cells_a_short_pause_apart_keep_it_polling_and_a_quiet_spell_ends_it():
    pacing = Pacing()
    passes(pacing, 1.0, read_for_cells=True, woken=True)
    now = 1.0
    for _ in range(50):  # cells a short pause apart, each read by the fourth poll
        for _ in range(3):
            now += POLL_S
            assert passes(pacing, now, polled=True) is None
        now += POLL_S
        assert passes(pacing, now, polled=True, read_for_cells=True) is None
    assert pacing.active
    assert passes(pacing, now + WINDOW_S - 0.001, polled=True) is None
    assert passes(pacing, now + WINDOW_S, polled=True) is False and not pacing.active


def test_a_poll_that_lands_on_a_short_cell_is_chance_and_two_in_a_row_end_it():
    pacing = Pacing()
    passes(pacing, 1.0, read_for_cells=True, woken=True)
    assert passes(pacing, 1.005, polled=True, cell_running=True) is None
    assert passes(pacing, 1.010, polled=True, read_for_cells=True) is None
    assert passes(pacing, 1.015, polled=True, cell_running=True) is None
    assert passes(pacing, 1.020, cell_running=True) is None  # a tick is no poll
    assert passes(pacing, 1.025, polled=True, cell_running=True) is False  # long or back to back
    assert not pacing.active


def test_a_poll_while_cells_come_back_to_back_ends_the_polling_at_once():
    # A kernel's round trip: each start reads its own boundary, so a poll would only take the
    # GIL and a core from the cells; a tick (no poll) leaves the polling as it is.
    pacing = Pacing()
    passes(pacing, 1.0, read_for_cells=True, woken=True)
    assert passes(pacing, 1.005, back_to_back=True) is None and pacing.active
    assert passes(pacing, 1.010, polled=True, back_to_back=False, read_for_cells=True) is None
    assert passes(pacing, 1.020, polled=True, back_to_back=True, read_for_cells=True) is False
    assert not pacing.active
