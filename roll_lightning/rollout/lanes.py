"""The scheduler's per-env state: one `LaneState` per env of the run (one in the single-env form).

Each lane has its own sequence of groups (seeds and resume position), its own queue of complete groups and its
own demand, so every batch holds exactly each env's share and a resume replays each env exactly; lanes share
the engine and the running slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from roll_lightning.env_client import EnvPool, EnvSession
from roll_lightning.rollout.groups import GroupQueue
from roll_lightning.rollout.ledger import GroupSequence
from roll_lightning.rollout.tags import LaneSpec


@dataclass(eq=False)
class LaneState:
    """One env of the scheduler: its settings, servers, group sequence, queue and open demand."""

    spec: LaneSpec
    position: int  # index in the run's env list (a group's ``lane``)
    pool: EnvPool | None  # None: an agent lane (its episodes need no env server)
    queue: GroupQueue
    sequence: GroupSequence = field(default_factory=GroupSequence)
    demand: int = 0  # groups waiting `get_batch` calls still miss
    idle_sessions: list[EnvSession] = field(default_factory=list)

    @property
    def tag(self) -> str:
        return self.spec.tag

    def in_outage(self) -> bool:
        """True while no healthy endpoint serves this lane's env (new sessions wait for one)."""
        return self.pool is not None and not self.pool.healthy_endpoints(self.spec.env_id)


def lane_states(
    lanes: tuple[LaneSpec, ...], pools: EnvPool | dict[str, EnvPool], max_staleness: int, in_start_order: bool = False
) -> list[LaneState]:
    """A `LaneState` per lane; ``pools``: one pool for every lane, or one per tag; ``in_start_order``: the queues
    release the oldest started groups first (`GroupQueue`)."""
    if isinstance(pools, EnvPool):
        pools = {lane.tag: pools for lane in lanes}
    missing = [lane.tag for lane in lanes if lane.tag not in pools and lane.agent is None]
    if missing:
        raise ValueError(f"no env pool for tags {missing}")
    return [
        LaneState(lane, i, pools.get(lane.tag), GroupQueue(max_staleness, in_start_order))
        for i, lane in enumerate(lanes)
    ]
