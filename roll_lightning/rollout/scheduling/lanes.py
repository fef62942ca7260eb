"""The scheduler's per-env state: each env's own groups, queue and demand."""

from __future__ import annotations

from dataclasses import dataclass, field

from roll_lightning.env_client import EnvPool, EnvSession
from roll_lightning.rollout.config.envs import LaneSpec
from roll_lightning.rollout.groups.queue import GroupQueue
from roll_lightning.rollout.scheduling.ledger import GroupSequence


@dataclass(eq=False)
class LaneState:
    spec: LaneSpec
    position: int  # a group's ``lane``
    pool: EnvPool | None  # None: an agent lane (its episodes need no env server)
    queue: GroupQueue
    sequence: GroupSequence = field(default_factory=GroupSequence)
    demand: int = 0  # groups waiting `get_batch` calls still miss
    idle_sessions: list[EnvSession] = field(default_factory=list)

    @property
    def tag(self) -> str:
        return self.spec.tag

    def in_outage(self) -> bool:
        """True while no healthy endpoint serves this lane's env."""
        return self.pool is not None and not self.pool.healthy_endpoints(self.spec.env_id)


def lane_states(
    lanes: tuple[LaneSpec, ...], pools: EnvPool | dict[str, EnvPool], max_staleness: int, in_start_order: bool = False
) -> list[LaneState]:
    """A `LaneState` per lane; ``pools``: one for every lane, or one per tag."""
    if isinstance(pools, EnvPool):
        pools = {lane.tag: pools for lane in lanes}
    missing = [lane.tag for lane in lanes if lane.tag not in pools and lane.agent is None]
    if missing:
        raise ValueError(f"no env pool for tags {missing}")
    return [
        LaneState(lane, i, pools.get(lane.tag), GroupQueue(max_staleness, in_start_order))
        for i, lane in enumerate(lanes)
    ]
