"""The progress line's ETA: this fit's pace times the steps left, capped by what ``trainer.max_time`` leaves."""

from __future__ import annotations

import pytest

from roll_lightning.callbacks.progress import _eta


def test_the_eta_is_this_fit_s_pace_times_the_steps_left() -> None:
    assert _eta(elapsed=100.0, done_here=50, left=450, time_left=None) == pytest.approx(900.0)


def test_a_resumed_run_s_restored_steps_do_not_count_in_its_pace() -> None:
    """Seen on a resumed run: 1 s after resuming at step 409 of 5000 the ETA read 0:13 (410 steps "done" in 1 s),
    and it then grew with every line. The pace is the steps of this fit alone."""
    resumed = _eta(elapsed=30.0, done_here=36, left=5000 - 445, time_left=None)
    assert resumed == pytest.approx(30.0 / 36 * 4555)
    assert _eta(elapsed=1.0, done_here=1, left=4590, time_left=None) == pytest.approx(4590.0)


def test_max_time_caps_the_eta_and_no_step_yet_means_no_pace() -> None:
    assert _eta(elapsed=100.0, done_here=50, left=450, time_left=300.0) == 300.0
    assert _eta(elapsed=5.0, done_here=0, left=450, time_left=1200.0) == 1200.0
    assert _eta(elapsed=5.0, done_here=0, left=450, time_left=None) is None
    assert _eta(elapsed=5.0, done_here=3, left=None, time_left=None) is None  # no step limit, no max_time
    assert _eta(elapsed=5.0, done_here=3, left=None, time_left=-2.0) == 0.0  # past max_time: never negative
