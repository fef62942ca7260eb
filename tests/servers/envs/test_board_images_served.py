"""FrozenLake's and Sokoban's board pictures through real servers on 127.0.0.1: over every client transport the
observation and PNG bytes are the ones the env makes locally, the image metrics arrive, and the conformance
suite (its `images` rule included) passes with `render: image` and `both`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.conformance import conforms
from support.servers import start_server

from env_servers.api import Observation
from env_servers.registry import get_env
from env_servers.server import RunningServer
from roll_lightning.env_client import EnvPool, ObservationImage

CASES = [
    ("frozenlake", {"render": "image", "observation": "board+words", "size": 5}, "<answer>Down</answer>"),
    ("sokoban", {"render": "both"}, "<answer>Left</answer>"),
]


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    server = start_server(env_ids=("frozenlake", "sokoban"), max_sessions=20, session_ttl_s=2)
    yield server
    server.stop()


def local(obs: Observation) -> tuple[str, tuple[ObservationImage, ...]]:
    return obs.text, tuple(ObservationImage(image.data, image.media_type) for image in obs.images)


@pytest.mark.parametrize("transport", ["unary", "batch", "stream"])
@pytest.mark.parametrize(("env_id", "config", "action"), CASES)
async def test_pictures_arrive_as_the_env_made_them(running, transport, env_id, config, action) -> None:
    entry = get_env(env_id)
    env = entry.env_cls(entry.make_config(config))
    async with EnvPool([running.address], transport=transport) as pool:
        session = await pool.open(env_id, config)
        for seed in (1, 2):
            first = await session.reset(seed=seed)
            obs, info = env.reset(seed)
            assert (first.observation, first.images) == local(obs)
            assert first.info["image_bytes"] == len(first.images[0].data) and first.info["image_encode_s"] > 0
            for _ in range(3):
                out = await session.step(action)
                obs, *_, done, cut, info = env.step(action)
                assert (out.observation, out.images) == local(obs)
                assert out.metrics["image_bytes"] == len(out.images[0].data) and out.metrics["image_encode_s"] > 0
                if out.done:
                    assert done or cut
                    break


@pytest.mark.parametrize(("env_id", "config"), [("frozenlake", {"render": "both"}), ("sokoban", {"render": "image"})])
def test_conformance_passes_with_board_pictures(running, env_id, config) -> None:
    second = start_server(env_ids=(env_id,), max_sessions=20, session_ttl_s=2)
    try:
        conforms(running.address, env_id, config=config, second=second.address, passed=["images"])
    finally:
        second.stop()
