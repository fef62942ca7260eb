"""Servers on other hosts: bearer token and TLS, through the real client."""

from __future__ import annotations

import grpc
import pytest
import trustme
from support.servers import start_server

from roll_lightning.envs import EnvPool, EpisodeFailed, NoEndpointAvailable
from roll_lightning.envs.client import EnvClient


async def test_token_is_required_for_env_calls_but_not_health():
    running = start_server(token="s3cret")
    try:
        stranger = EnvClient(running.address)
        assert await stranger.health() == 1, "health stays open for load balancers"
        with pytest.raises(EpisodeFailed) as info:
            await stranger.server_info()
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        await stranger.close()
        with pytest.raises(NoEndpointAvailable, match="no env endpoint"):  # refused, so never usable
            await EnvPool([running.address], token="wrong", start_timeout_s=1.0).start()
        async with EnvPool([running.address], token="s3cret") as pool:
            session = await pool.open("frozenlake")
            assert (await session.reset(seed=3)).observation
            assert (await session.step("<answer>Up</answer>")).action_valid
    finally:
        running.stop()


async def test_tls_with_a_private_ca():
    ca = trustme.CA()
    cert = ca.issue_cert("env-host.test")
    running = start_server(
        tls_cert=cert.cert_chain_pems[0].bytes() + b"".join(p.bytes() for p in cert.cert_chain_pems[1:]),
        tls_key=cert.private_key_pem.bytes(),
        token="t",
    )
    try:
        async with EnvPool(
            [running.address], tls_root_cert=ca.cert_pem.bytes(), tls_server_name="env-host.test", token="t"
        ) as pool:
            session = await pool.open("sokoban")
            assert "P" in (await session.reset(seed=1)).observation
        plain = EnvClient(running.address)  # a plaintext client cannot talk to a TLS server
        with pytest.raises(EpisodeFailed):
            await plain.health(timeout=1.0)
        await plain.close()
        other_ca = trustme.CA()
        wrong = EnvClient(running.address, tls_root_cert=other_ca.cert_pem.bytes(), tls_server_name="env-host.test")
        with pytest.raises(EpisodeFailed):
            await wrong.health(timeout=1.0)
        await wrong.close()
    finally:
        running.stop()
