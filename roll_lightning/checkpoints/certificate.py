"""`Certificate`: what a run's held-out numbers depend on, and those numbers, kept beside its checkpoints as
``run.json`` (docs/reliability.md, "Run certificate"); `certificate_check.compare` says item by item whether a
replay on another machine matches."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from roll_lightning.checkpoints import integrity
from roll_lightning.checkpoints.fingerprint import json_digest

CERTIFICATE = "run.json"
FORMAT = "roll_lightning run certificate 1"
SHORT = 12  # hex digits kept of each episode's digests


class CertificateError(ValueError):
    """A certificate that cannot be read or used (a one-line message)."""


def plain(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples as lists, keys as strings), so a record equals its reading."""
    return json.loads(json.dumps(value, default=str))


@dataclass(frozen=True)
class Outcome:
    """One held-out episode: its env's tag and seed, success, return, and digests of its first prompt's token ids
    and of every turn's prompt and reply ids."""

    tag: str
    seed: int
    success: bool
    ret: float
    prompt: str
    tokens: str

    def row(self) -> list[Any]:
        return [self.tag, self.seed, int(self.success), round(self.ret, 6), self.prompt, self.tokens]

    @classmethod
    def of_row(cls, row: list[Any]) -> Outcome:
        tag, seed, success, ret, prompt, tokens = row
        return cls(str(tag), int(seed), bool(success), float(ret), str(prompt), str(tokens))


@dataclass(frozen=True)
class HeldOut:
    """One held-out evaluation: the weights that played it (rollout step, optimiser step, the checkpoint's SHA-256
    when one holds them) and each episode's outcome; ``by``: the subcommand that played it."""

    step: int
    global_step: int
    outcomes: tuple[Outcome, ...]
    checkpoint_sha256: str | None = None
    by: str = "fit"

    @property
    def episodes(self) -> int:
        return len(self.outcomes)

    @property
    def successes(self) -> int:
        return sum(o.success for o in self.outcomes)

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.outcomes else 0.0

    @property
    def panel(self) -> dict[str, list[int]]:
        """The held-out seeds played, by env tag."""
        out: dict[str, list[int]] = {}
        for o in sorted(self.outcomes, key=lambda o: (o.tag, o.seed)):
            out.setdefault(o.tag, []).append(o.seed)
        return out

    @property
    def prompts_sha256(self) -> str:
        return json_digest(sorted([o.tag, o.seed, o.prompt] for o in self.outcomes))

    @property
    def tokens_sha256(self) -> str:
        return json_digest(sorted([o.tag, o.seed, o.tokens] for o in self.outcomes))

    @classmethod
    def merged(cls, parts: list[HeldOut]) -> HeldOut:
        """Every rank's share of one evaluation as one."""
        outcomes = sorted((o for part in parts for o in part.outcomes), key=lambda o: (o.tag, o.seed))
        return replace(parts[0], outcomes=tuple(outcomes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "global_step": self.global_step,
            "checkpoint_sha256": self.checkpoint_sha256,
            "by": self.by,
            "episodes": self.episodes,
            "success_rate": round(self.success_rate, 6),
            "prompts_sha256": self.prompts_sha256,
            "tokens_sha256": self.tokens_sha256,
            "outcomes": [o.row() for o in self.outcomes],  # tag, seed, success, return, prompt, tokens
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeldOut:
        outcomes = tuple(Outcome.of_row(row) for row in data["outcomes"])
        sha = data.get("checkpoint_sha256")
        return cls(int(data["step"]), int(data["global_step"]), outcomes, sha and str(sha), str(data.get("by", "")))


@dataclass(frozen=True)
class Setup:
    """What held-out numbers depend on (each field a JSON object); runs with equal setups evaluate alike."""

    versions: dict[str, str]  # python, roll_lightning, torch, transformers, ... (vllm when it generates)
    model: dict[str, str]  # weights_sha256, config_sha256
    tokenizer: dict[str, str]  # tokenizer_sha256, chat_template_sha256
    episode: dict[str, Any]  # the evaluation's episode settings: layout, turns, context, prompt
    envs: dict[str, Any]  # by tag: env_id and the spec its server reports (version, config, ...)
    seeds: dict[str, Any]  # run_seed, the seed stream, its salts
    engine: dict[str, Any]  # kind, dtype, device, replicas
    decoding: dict[str, Any]  # the evaluation's sampling: temperature, max_new_tokens, top_p, top_k, stops

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, plain(getattr(self, f.name)))

    @property
    def greedy(self) -> bool:
        """Every held-out env decodes at temperature 0 (``decoding`` is one setting, or one per env tag)."""
        each = self.decoding.values() if "temperature" not in self.decoding else [self.decoding]
        return all(isinstance(d, dict) and float(d.get("temperature", 1.0)) == 0.0 for d in each)


@dataclass
class Certificate:
    """A run's `Setup` and its held-out results; ``notes`` are shown, never compared (the model's path, the source
    commit, which subcommand wrote it)."""

    setup: Setup
    results: list[HeldOut] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    def add(self, result: HeldOut) -> None:
        """Record ``result``, in place of an earlier one of the same weights and subcommand."""
        self.results = [r for r in self.results if (r.step, r.checkpoint_sha256, r.by) != _key(result)] + [result]

    def result_for(self, checkpoint_sha256: str | None, step: int | None) -> HeldOut | None:
        """The latest result of these weights: by the checkpoint's digest, else by its rollout step."""
        found = [r for r in self.results if checkpoint_sha256 is not None and r.checkpoint_sha256 == checkpoint_sha256]
        found = found or [r for r in self.results if r.step == step]
        return found[-1] if found else None

    def to_dict(self) -> dict[str, Any]:
        latest = self.results[-1].panel if self.results else {}
        return {"format": FORMAT, "notes": self.notes, **asdict(self.setup), "panel": latest,
                "results": [r.to_dict() for r in self.results]}  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any, source: str) -> Certificate:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CertificateError(f'{source} is not a run certificate (no "format": {FORMAT!r})')
        names = [f.name for f in fields(Setup)]
        missing = [name for name in [*names, "results"] if name not in data]
        if missing:
            raise CertificateError(f"{source} is not a whole run certificate: it has no {', '.join(missing)}")
        try:
            setup = Setup(**{name: data[name] for name in names})
            results = [HeldOut.from_dict(r) for r in data["results"]]
        except (KeyError, TypeError, ValueError) as err:
            raise CertificateError(f"{source} is not a readable run certificate: {type(err).__name__} {err}") from err
        return cls(setup, results, dict(data.get("notes") or {}))

    @classmethod
    def read(cls, path: Path) -> Certificate:
        """The certificate at ``path``; `CertificateError` (one line) when it is missing or not one."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise CertificateError(f"run certificate {path} cannot be read: {reason}") from err
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise CertificateError(f"run certificate {path} is not valid JSON: {err}") from err
        return cls.from_dict(data, f"run certificate {path}")

    def write(self, path: Path) -> None:
        """Write atomically and durably (`integrity.write_text`)."""
        integrity.write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")


def _key(result: HeldOut) -> tuple[int, str | None, str]:
    return result.step, result.checkpoint_sha256, result.by


def continue_or_set_aside(path: Path, setup: Setup) -> tuple[list[HeldOut], Path | None]:
    """The results already at ``path`` when they were played with ``setup``; else none, the file moved aside to
    ``run.N.json`` (returned) so a changed setup never mixes with the old results."""
    if not path.exists():
        return [], None
    try:
        earlier = Certificate.read(path)
    except CertificateError:
        earlier = None
    if earlier is not None and earlier.setup == setup:
        return earlier.results, None
    n = 1
    while (aside := path.with_name(f"{path.stem}.{n}{path.suffix}")).exists():
        n += 1
    os.replace(path, aside)
    return [], aside
