"""`RolloutConfig`: everything about how episodes are collected, validated up front with errors that name the key."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from roll_lightning.env_client.pool import Transport
from roll_lightning.rollout.config.branching import BranchSettings
from roll_lightning.rollout.config.envs import (
    EvalEnv,
    LaneSpec,
    RolloutConfigError,
    TrainEnv,
    check_episode,
    resolve,
    split_evenly,
)
from roll_lightning.rollout.episodes.episode import EpisodeSettings
from roll_lightning.rollout.groups.filters import GroupFilterConfig
from roll_lightning.settings import check, choice

if TYPE_CHECKING:
    from roll_lightning.env_client import EnvPool

__all__ = ["EnvsConfig", "EvalConfig", "RolloutConfig", "RolloutConfigError"]

DEFAULT_ENV = "sokoban"


OnSuspend = Literal["wait", "abort", "keep"]  # what a suspend does to the replies in flight (`GenerationGate`)


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are collected (docs/training.md says why each setting exists and what it costs).

    Args:
        env_id: the env every episode plays, as registered on the env servers: ``sokoban``, ``frozenlake``,
            ``webshop``, ``calculator``, ``lookup``, ``gem:<id>``, ``gym:<id>``, ``textarena:<id>``,
            ``openenv:...``, ``mcp:...``; ``python -m env_servers describe ID`` prints its spec and config keys.
        env_config: per-session env config (validated by the server against its schema).
        envs: several envs in one run, instead of ``env_id``/``env_config``: a list of ``{tag, env_id,
            env_config, groups, episode, endpoints}`` (`rollout.config.envs.TrainEnv`).
        group_size: episodes per group; all start from the same seed.
        group_redundancy: extra members started per group; the first ``group_size`` to finish are kept.
        batch_size: episodes per `get_batch`; a multiple of ``group_size``.
        concurrent_episodes: episodes running at once (async mode).
        max_staleness: how many policy versions old a group's oldest reply may be (0 = on-policy).
        staleness: ``admit`` (batches take the oldest started groups; none goes stale) or ``drop`` (batches take
            the first groups to finish; stale ones are dropped).
        episode_retries: replays of a failed episode (same seed, fresh session) before its group is dropped.
        retry_backoff_s: wait before the first replay; doubled per further failure (at most 30 s), with jitter.
        max_failed_groups_in_a_row: `get_batch` raises after this many groups dropped for failures in a row.
        turn_timeout_s: deadline of one reply from the engine.
        episode_timeout_s: deadline of one whole episode.
        mode: ``async`` (every episode on its own) or ``lockstep`` (every episode of a batch takes turn k before
            any takes turn k+1).
        on_suspend: the replies in flight when generation is suspended (before a weight load or the engine's
            sleep): ``wait`` lets them finish with the old weights; ``abort`` cancels them and asks those turns
            again after the resume, with the new weights; ``keep`` stops each where it is and continues it after
            the resume from the tokens it kept, with the new weights (each token keeps the log-prob of the
            weights that sampled it; a reply counts as old as its oldest token).
        seed: the run's seed; group g's seed is derived from (seed, g), so runs and resumes are reproducible.
        group_filter: dynamic sampling (`rollout.groups.filters`): ``zero_variance`` or ``top_p_variance``; off by
            default.
        episode: layout, max turns, context budget, sampling, prompt rendering.
        branch: branching rollouts (`rollout.config.branching`): members forked from another mid-episode; off by
            default.
    """

    env_id: str | None = None
    env_config: dict[str, Any] = field(default_factory=dict)
    envs: list[TrainEnv] = field(default_factory=list)
    group_size: int = 8
    group_redundancy: int = 0
    batch_size: int = 64
    concurrent_episodes: int = 64
    max_staleness: int = 0
    staleness: Literal["drop", "admit"] = "admit"
    episode_retries: int = 2
    retry_backoff_s: float = 0.5
    max_failed_groups_in_a_row: int = 8
    turn_timeout_s: float = 600.0
    episode_timeout_s: float = 3600.0
    mode: Literal["async", "lockstep"] = "async"
    on_suspend: OnSuspend = "wait"
    seed: int = 0
    episode: EpisodeSettings = field(default_factory=EpisodeSettings)
    group_filter: GroupFilterConfig = field(default_factory=GroupFilterConfig)
    branch: BranchSettings = field(default_factory=BranchSettings)

    def __post_init__(self) -> None:
        if isinstance(self.branch, dict):  # Python callers; the CLI builds the dataclass
            object.__setattr__(self, "branch", BranchSettings(**self.branch))
        object.__setattr__(
            self, "envs", [_entry(TrainEnv, e, f"data.rollout.envs[{i}]") for i, e in enumerate(self.envs)]
        )
        rules = {
            **{k: (getattr(self, k) >= 1, ">= 1") for k in ("group_size", "batch_size", "concurrent_episodes")},
            "max_failed_groups_in_a_row": (self.max_failed_groups_in_a_row >= 1, ">= 1"),
            **{k: (getattr(self, k) >= 0, ">= 0") for k in ("group_redundancy", "max_staleness", "episode_retries")},
            "retry_backoff_s": (self.retry_backoff_s >= 0, ">= 0"),
            **{k: choice(self, k) for k in ("mode", "staleness", "on_suspend")},
            **{k: (getattr(self, k) > 0, "> 0") for k in ("turn_timeout_s", "episode_timeout_s")},
        }
        check("data.rollout", self, rules, RolloutConfigError)
        if self.batch_size % self.group_size:
            raise RolloutConfigError(
                f"data.rollout.batch_size={self.batch_size} is not divisible by "
                f"data.rollout.group_size={self.group_size}: a batch holds whole groups"
            )
        check_episode(self.episode, "data.rollout.episode")
        self.group_filter.check(self.group_size)
        _ = self.lanes  # resolve (and check) the env list now, not at the first batch
        self._check_branch()

    def _check_branch(self) -> None:
        branch = self.branch
        if not branch.on:
            return
        why = ""
        if branch.spines >= self.group_size:
            why = f"its spines ({branch.spines}) leave no member of a group of {self.group_size} for copies"
        elif self.mode != "async":
            why = "it needs data.rollout.mode: async"
        elif self.group_redundancy:
            why = "it cannot be combined with data.rollout.group_redundancy"
        elif any(lane.agent is not None for lane in self.lanes):
            why = "an agent's episodes cannot be forked (the agent program holds their state)"
        if why:
            raise RolloutConfigError(f"data.rollout.branch: {why}")

    @property
    def groups_per_batch(self) -> int:
        return self.batch_size // self.group_size

    @cached_property
    def lanes(self) -> tuple[LaneSpec, ...]:
        """The envs this rollout plays, each with its groups per batch (one lane in the single-env form)."""
        if not self.envs:
            env_id = self.env_id or DEFAULT_ENV
            lane = LaneSpec(
                env_id, env_id, dict(self.env_config), self.groups_per_batch, self.episode, None, None, "data.rollout"
            )
            return (lane,)
        if self.env_id is not None or self.env_config:
            raise RolloutConfigError(
                "data.rollout.env_id/env_config and data.rollout.envs are both set: give one env (env_id) or a "
                "list (envs); a config that adds envs on top of one with an env (configs/tiny.yaml) sets env_id: null"
            )
        given = [entry.groups for entry in self.envs]
        if all(g is None for g in given):
            shares = split_evenly(self.groups_per_batch, len(self.envs), "data.rollout.envs")
        elif any(g is None for g in given):
            missing = ", ".join(f"data.rollout.envs[{i}]" for i, g in enumerate(given) if g is None)
            raise RolloutConfigError(f"{missing}: no 'groups'; give every entry its groups per batch, or none")
        else:
            shares = [int(g) for g in given]  # type: ignore[arg-type]
            for i, g in enumerate(shares):
                if g < 1:
                    raise RolloutConfigError(f"data.rollout.envs[{i}].groups must be >= 1, got {g}")
            if sum(shares) != self.groups_per_batch:
                raise RolloutConfigError(
                    f"data.rollout.envs: the groups per batch ({' + '.join(map(str, shares))} = {sum(shares)}) "
                    f"must sum to data.rollout.batch_size / data.rollout.group_size = {self.batch_size} / "
                    f"{self.group_size} = {self.groups_per_batch}"
                )
        return resolve(list(self.envs), shares, self.episode, "data.rollout.envs")

    @property
    def tagged(self) -> bool:
        """True when the config names its envs (``envs``): each tag then gets its own metrics."""
        return bool(self.envs)


@dataclass(frozen=True)
class EnvsConfig:
    """Where the env servers are.

    Args:
        endpoints: ``local`` (this process starts ``local_servers`` servers for the run's envs and stops them at
            the end) or a list of ``host:port`` of servers started with ``python -m env_servers serve``. An env
            of ``rollout.envs`` may name its own (``endpoints`` in its entry); sessions of an env go only to
            servers that list it in their ServerInfo.
        local_servers: server processes per rank when ``endpoints`` is ``local``.
        local_args: extra ``serve`` arguments for local servers (e.g. ``["--import", "my_envs"]``).
        token: bearer token for remote servers; tls_root_cert: PEM file to verify them (enables TLS).
        transport: ``batch`` (concurrent calls share one RPC), ``stream`` or ``unary``.
        call_timeout_s / reset_timeout_s: deadline of a step / a reset.
        start_timeout_s: how long the run's start waits for a first reachable, serving endpoint (servers may
            still be loading); longer, and the run stops with a message naming the endpoints.
        outage_timeout_s: when every endpoint is down (unreachable, frozen, restarting, draining), new episodes
            wait this long for one to come back, without using their retries; longer, and the run stops with a
            message naming the endpoints and how long they were down (0 = stop at once).
    """

    endpoints: str | list[str] = "local"
    local_servers: int = 1
    local_args: list[str] = field(default_factory=list)
    token: str | None = None
    tls_root_cert: str | None = None
    tls_server_name: str | None = None
    transport: Transport = "batch"
    call_timeout_s: float = 30.0
    reset_timeout_s: float = 120.0
    start_timeout_s: float = 30.0
    outage_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        rules = {
            "transport": choice(self, "transport"),
            "call_timeout_s": (self.call_timeout_s > 0, "> 0"),
            "reset_timeout_s": (self.reset_timeout_s > 0, "> 0"),
            "start_timeout_s": (self.start_timeout_s > 0, "> 0"),
            "outage_timeout_s": (self.outage_timeout_s >= 0, ">= 0"),
        }
        check("data.envs", self, rules, RolloutConfigError)

    def pool(self, endpoints: str | tuple[str, ...], env_ids: list[str]) -> EnvPool:
        """A pool over ``endpoints`` (``local``: servers started here for ``env_ids``)."""
        from roll_lightning.env_client import EnvPool

        cert = Path(self.tls_root_cert).read_bytes() if self.tls_root_cert else None
        return EnvPool(
            endpoints if isinstance(endpoints, str) else list(endpoints),
            local_envs=env_ids,
            local_servers=self.local_servers,
            local_args=self.local_args,
            token=self.token,
            tls_root_cert=cert,
            tls_server_name=self.tls_server_name,
            transport=self.transport,
            call_timeout_s=self.call_timeout_s,
            reset_timeout_s=self.reset_timeout_s,
            start_timeout_s=self.start_timeout_s,
            outage_timeout_s=self.outage_timeout_s,
        )


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation episodes (``validate``, and during ``fit`` every ``trainer.val_check_interval`` steps).

    Args:
        episodes: episodes per evaluation, one per held-out start (seeds disjoint from every training seed; the
            same starts at every evaluation, so results compare across steps).
        temperature: sampling temperature (0 = greedy: the policy's best guess).
        max_new_tokens: reply budget (None = the training rollout's).
        during_fit: also evaluate during ``fit`` (every ``trainer.val_check_interval`` training steps; set both).
            Off by default: evaluation episodes are whole rollouts, and Lightning would otherwise run them at
            the end of every fit.
        at_fit_start: also evaluate once before the first update of a fresh ``fit`` (logged at step 0), so a
            learning curve starts from the untrained policy. Not repeated when a run resumes.
        envs: held-out envs (ROLL's validation tags), e.g. sizes training never plays: a list of ``{tag, env_id,
            env_config, episodes, episode, endpoints}`` (`rollout.config.envs.EvalEnv`); metrics per tag under
            ``eval/<tag>/...``. Empty: the training envs, ``episodes`` held-out starts each.
        show_episodes: ``validate`` prints this many of the episodes it played, call by call, as training would
            record them (what each turn showed, the reply, rows, rewards, an agent's refused calls): an env or an
            agent tried against the current policy, or a checkpoint, without an update.
    """

    episodes: int = 32
    temperature: float = 0.0
    max_new_tokens: int | None = None
    during_fit: bool = False
    at_fit_start: bool = False
    envs: list[EvalEnv] = field(default_factory=list)
    show_episodes: int = 0

    def __post_init__(self) -> None:
        rules = {
            "episodes": (self.episodes >= 1, ">= 1"),
            "show_episodes": (self.show_episodes >= 0, ">= 0"),
            "temperature": (self.temperature >= 0, ">= 0 (0 = greedy)"),
            "max_new_tokens": (self.max_new_tokens is None or self.max_new_tokens >= 1, ">= 1, or null"),
        }
        check("data.evaluation", self, rules, RolloutConfigError)
        object.__setattr__(
            self, "envs", [_entry(EvalEnv, e, f"data.evaluation.envs[{i}]") for i, e in enumerate(self.envs)]
        )
        for i, entry in enumerate(self.envs):
            if entry.episodes is not None and entry.episodes < 1:
                raise RolloutConfigError(f"data.evaluation.envs[{i}].episodes must be >= 1, got {entry.episodes}")

    def rollout(self, train: RolloutConfig) -> RolloutConfig:
        """The evaluation as a rollout: groups of one, each held-out start once, no filter, no run-ahead."""
        sampling = train.episode.sampling.replace(
            temperature=self.temperature, max_new_tokens=self.max_new_tokens or train.episode.sampling.max_new_tokens
        )
        episode = replace(train.episode, sampling=sampling)
        entries = self.entries(train)
        if entries:
            shares = [e.episodes or self.episodes for e in entries]
            resolve(entries, shares, episode, "data.evaluation.envs")  # checked here, so errors name these keys
            envs = [
                TrainEnv(e.tag, e.env_id, e.env_config, e.episode, e.endpoints, e.agent, groups=n)
                for e, n in zip(entries, shares, strict=True)
            ]
            total, single = sum(shares), {"env_id": None, "env_config": {}}
        else:
            envs, total, single = [], self.episodes, {}
        return replace(
            train,
            **single,
            envs=envs,
            group_size=1,
            group_redundancy=0,
            batch_size=total,
            concurrent_episodes=max(train.concurrent_episodes, total),
            max_staleness=0,  # start exactly the held-out groups asked for, no run-ahead
            group_filter=GroupFilterConfig(),  # every held-out start counts, whatever its members scored
            branch=BranchSettings(),  # one member per held-out start: nothing to fork into
            episode=episode,
        )

    def entries(self, train: RolloutConfig) -> list[EvalEnv]:
        """The held-out envs: ``envs``, else the training list's envs (none for a single-env run)."""
        if self.envs:
            return list(self.envs)
        return [EvalEnv(e.tag, e.env_id, e.env_config, e.episode, e.endpoints, e.agent) for e in train.envs]


def _entry(kind: type[Any], value: Any, key: str) -> Any:
    """An env list entry from a mapping (Python callers) or as given (the CLI builds the dataclass)."""
    if isinstance(value, kind):
        return value
    if not isinstance(value, dict):
        raise RolloutConfigError(f"{key} must be a mapping with tag, env_id, ...; got {value!r}")
    try:
        return kind(**value)
    except TypeError as err:
        raise RolloutConfigError(f"{key}: {err}") from err
