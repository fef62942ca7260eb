"""`RolloutLoop`'s SIGTERM bridge, with real signals to this process: a signal cancels the rollout in flight; with
none in flight it exits at once, unless a trainer's steps run, whose step in progress it lets finish (the next
rollout, or Lightning between steps, then stops the run, and the step is checkpointed)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest
from lightning.pytorch.utilities.exceptions import SIGTERMException

from roll_lightning.rollout.runtime.loop import RolloutLoop


@pytest.fixture
def loop() -> Iterator[RolloutLoop]:
    """A loop whose handler chains to no other (as in ``python -m roll_lightning`` before Lightning's)."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    loop = RolloutLoop("test-loop")
    yield loop
    loop.close()
    signal.signal(signal.SIGTERM, previous)


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.01)  # the handler runs in the main thread at the next bytecode boundary


async def rollout() -> None:
    await asyncio.sleep(60)


def test_with_no_rollout_in_flight_a_signal_exits_at_once(loop: RolloutLoop) -> None:
    with pytest.raises(SystemExit) as stop:
        sigterm()
    assert type(stop.value) is SystemExit and stop.value.code == 128 + signal.SIGTERM


def test_while_steps_run_a_signal_lets_the_step_finish_and_the_next_rollout_stops(loop: RolloutLoop) -> None:
    loop.stop_between_steps = True
    sigterm()  # e.g. during an update: returns, so the update finishes
    assert loop.terminating == signal.SIGTERM
    with pytest.raises(SIGTERMException) as stop:
        loop.call(rollout(), interruptible=True)
    assert stop.value.code == 128 + signal.SIGTERM
