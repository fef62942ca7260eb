"""The client trusts nothing a server says (issue 17): echoed ids are checked, transports are used only when
advertised, a malformed stream answer fails one call and not the stream, and a draining endpoint is left at once
for new episodes while its episodes in progress finish. Servers are real (tests/support/misbehaving.py)."""

from __future__ import annotations

import grpc
import pytest
from support.misbehaving import FirstStreamAnswerEmpty, ServerWideReplay, UnaryOnly, start_misbehaving

from roll_lightning.env_client import EchoMismatch, EnvOutage, EnvPool, EpisodeFailed


@pytest.mark.parametrize("transport", ["batch", "stream", "unary"])
async def test_a_server_that_replays_across_sessions_fails_the_episode_naming_the_mismatch(transport: str) -> None:
    """Before: the second session got the first one's episode id, seed and steps, and trained on them."""
    running = start_misbehaving(ServerWideReplay)
    try:
        async with EnvPool([running.address], transport=transport) as pool:
            first, second = await pool.open("frozenlake"), await pool.open("frozenlake")
            await first.reset(seed=1)  # request id "1" in its session
            with pytest.raises(EchoMismatch) as mismatch:
                await second.reset(seed=2)  # request id "1" in its own session: answered with the first's
            assert mismatch.value.field == "session_id" and mismatch.value.got == first.session_id
            assert "session_id" in str(mismatch.value) and isinstance(mismatch.value, EpisodeFailed)
    finally:
        running.stop()


async def test_a_step_answer_about_another_step_is_refused() -> None:
    running = start_misbehaving(ServerWideReplay)
    try:
        async with EnvPool([running.address], transport="unary") as pool:
            session = await pool.open("frozenlake")
            await session.reset(seed=1)
            await session.step("<answer>Up</answer>")  # request "2"
            session._request_ids = iter(["2"])  # a client that reuses an id: the server replays step 0
            with pytest.raises(EchoMismatch) as mismatch:
                await session.step("<answer>Up</answer>")
            assert mismatch.value.field == "step_index" and (mismatch.value.expected, mismatch.value.got) == (1, 0)
    finally:
        running.stop()


@pytest.mark.parametrize("transport", ["batch", "stream"])
async def test_a_server_without_the_transport_is_driven_by_unary_calls(transport: str) -> None:
    """Before: the pool sent BatchStep/Stream to a server that never offered them, and every episode failed."""
    running = start_misbehaving(UnaryOnly)
    try:
        async with EnvPool([running.address], transport=transport) as pool:
            assert pool.endpoints[0].capabilities == frozenset()
            session = await pool.open("frozenlake")
            first = await session.reset(seed=3)
            outcome = await session.step("<answer>Up</answer>")
            assert first.observation and outcome.action_valid
    finally:
        running.stop()


async def test_a_stream_answer_without_a_result_fails_that_call_and_the_stream_goes_on() -> None:
    """Before: the reader died on a TypeError, the stream was never marked broken, and every later call on it
    waited out its deadline."""
    running = start_misbehaving(FirstStreamAnswerEmpty)
    try:
        async with EnvPool([running.address], transport="stream", reset_timeout_s=60.0) as pool:
            session = await pool.open("frozenlake")
            with pytest.raises(EpisodeFailed) as failed:
                await session.reset(seed=1)
            assert failed.value.code == grpc.StatusCode.INTERNAL and "without a result" in failed.value.detail
            again = await session.reset(seed=1)  # the same stream, which answers normally from now on
            assert again.seed == 1 and again.episode_id
    finally:
        running.stop()


async def test_draining_refusals_are_not_retried_and_the_endpoint_takes_no_new_sessions(server) -> None:
    """Unary transport, long deadlines: before, a Reset refused by a draining server was retried on the same
    endpoint until its 120 s deadline, and `open` kept placing sessions there."""
    pool = EnvPool(
        [server.address], transport="unary", reset_timeout_s=120.0, health_interval_s=60.0, outage_timeout_s=1
    )
    async with pool:
        playing, idle = await pool.open("frozenlake"), await pool.open("frozenlake")
        await playing.reset(seed=1)
        server.server.service.draining = True  # what SIGTERM does first (the whole drain is tested in test_pool)
        with pytest.raises(EpisodeFailed) as refused:
            await idle.reset(seed=2)
        assert refused.value.draining and refused.value.code == grpc.StatusCode.UNAVAILABLE
        assert not pool.endpoints[0].accepting, "no new sessions go to a draining endpoint"
        assert (await playing.step("<answer>Up</answer>")).action_valid, "its episode in progress goes on"
        with pytest.raises(EnvOutage):  # nowhere else to go: the outage path (bounded), not this endpoint
            await pool.open("frozenlake")
