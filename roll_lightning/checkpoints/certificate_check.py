"""`compare`: a replayed held-out evaluation against a run certificate, one line per item, then a verdict
(docs/reliability.md, "Run certificate").

Greedy evaluations (temperature 0 on both sides) must be identical, episode by episode, token for token. Sampled
ones must agree within `NOISE_SE` binomial standard errors of the difference of the two success rates (pooled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from roll_lightning.checkpoints.certificate import HeldOut, Setup

NOISE_SE = 3.0
SHOWN = 5  # seeds, keys named in one line


@dataclass(frozen=True)
class Item:
    """One compared item: ``detail`` is what follows ``match`` or ``differs:``; ``dependency``: what the numbers
    depend on (the verdict names those that changed), else the result itself."""

    label: str
    matches: bool
    detail: str
    dependency: bool = True

    def line(self, width: int) -> str:
        said = f"match ({self.detail})" if self.matches else f"differs: {self.detail}"
        return f"  {(self.label + ':').ljust(width + 1)} {said}"


@dataclass(frozen=True)
class CheckReport:
    items: tuple[Item, ...]
    rule: str

    @property
    def matches(self) -> bool:
        return all(item.matches for item in self.items)

    @property
    def changed(self) -> list[str]:
        return [item.label for item in self.items if item.dependency and not item.matches]

    def verdict(self) -> str:
        result = next(item for item in self.items if not item.dependency)
        if self.matches:
            return f"verdict: match: the same dependencies, policy, boards, prompt bytes and result ({self.rule})"
        outcome = "the held-out result matches" if result.matches else "the held-out result differs"
        cause = f"changed: {', '.join(self.changed)}" if self.changed else (
            "no recorded dependency changed (unrecorded ones remain: the hardware's arithmetic, the env servers' code)"
        )  # fmt: skip
        return f"verdict: differs: {outcome} ({self.rule}); {cause}"

    def lines(self) -> list[str]:
        width = max(len(item.label) for item in self.items)
        return [item.line(width) for item in self.items] + [self.verdict()]


def compare(was: Setup, was_result: HeldOut, now: Setup, now_result: HeldOut) -> CheckReport:
    """``was`` (the certificate's) against ``now`` (this run's), dependencies first, then the result."""
    items = [same(name, was.versions.get(name, "absent"), now.versions.get(name, "absent")) for name in
             dict.fromkeys([*was.versions, *now.versions])]  # fmt: skip
    items += [
        same("model weights", short(was.model.get("weights_sha256")), short(now.model.get("weights_sha256"))),
        same("model config", short(was.model.get("config_sha256")), short(now.model.get("config_sha256"))),
        same("tokenizer", short(was.tokenizer.get("tokenizer_sha256")), short(now.tokenizer.get("tokenizer_sha256"))),
        same("chat template", *(short(s.tokenizer.get("chat_template_sha256")) for s in (was, now))),
        settings("episode settings", was.episode, now.episode),
    ]
    items += [settings(f"env {tag}", was.envs.get(tag, {}), now.envs.get(tag, {})) for tag in
              dict.fromkeys([*was.envs, *now.envs])]  # fmt: skip
    items += [
        same("run seed", str(was.seeds.get("run_seed")), str(now.seeds.get("run_seed"))),
        settings("seed stream", _without(was.seeds, "run_seed"), _without(now.seeds, "run_seed")),
        same("engine", engine_text(was.engine), engine_text(now.engine), was.engine == now.engine),
        same("decoding", decoding_text(was.decoding), decoding_text(now.decoding), was.decoding == now.decoding),
        panel_item(was_result, now_result),
        prompts_item(was_result, now_result),
        checkpoint_item(was_result, now_result),
    ]
    greedy = was.greedy and now.greedy
    result, rule = greedy_result(was_result, now_result) if greedy else sampled_result(was_result, now_result, now)
    return CheckReport((*items, result), rule)


def same(label: str, was: str, now: str, equal: bool | None = None) -> Item:
    """``was`` and ``now`` as shown; ``equal``: whether they match, when the texts alone do not say."""
    matches = was == now if equal is None else equal
    return Item(label, matches, now if matches else f"was {was}, now {now}")


def short(sha: Any) -> str:
    return f"sha256 {str(sha)[:12]}" if sha else "none"


def settings(label: str, was: dict[str, Any], now: dict[str, Any]) -> Item:
    """Two settings objects: the keys that differ, each with both values."""
    flat_was, flat_now = _flatten(was), _flatten(now)
    keys = [k for k in dict.fromkeys([*flat_was, *flat_now]) if flat_was.get(k) != flat_now.get(k)]
    if not keys:
        summary = ", ".join(f"{k} {flat_now[k]}" for k in ("env_id", "version") if k in flat_now)
        return Item(label, True, summary or "the same")
    named = "; ".join(f"{k} was {flat_was.get(k, 'absent')!r}, now {flat_now.get(k, 'absent')!r}" for k in keys[:SHOWN])
    return Item(label, False, named + (f"; {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""))


def _flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict) and item:
            out.update(_flatten(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


def _without(value: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k != key}


def engine_text(engine: dict[str, Any]) -> str:
    replicas = int(engine.get("replicas", 1))
    text = f"{engine.get('kind')} {engine.get('dtype')} on {engine.get('device')}"
    return (
        text
        + (f" ({engine['accelerator']})" if engine.get("accelerator") else "")
        + (f", {replicas} replicas" if replicas > 1 else "")
    )


def decoding_text(decoding: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in decoding.items())


def _seeds(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds[:SHOWN])) + (", ..." if len(seeds) > SHOWN else "")


def _panel_text(result: HeldOut) -> str:
    parts = [f"{tag} {_seeds(seeds)}" for tag, seeds in result.panel.items()]
    return f"{result.episodes} seeds: {'; '.join(parts)}"


def panel_item(was: HeldOut, now: HeldOut) -> Item:
    if was.panel == now.panel:
        return Item("seed panel", True, _panel_text(now))
    common = {(o.tag, o.seed) for o in was.outcomes} & {(o.tag, o.seed) for o in now.outcomes}
    return Item("seed panel", False, f"was {_panel_text(was)}, now {_panel_text(now)} ({len(common)} in common)")


def _by_seed(result: HeldOut) -> dict[tuple[str, int], Any]:
    return {(o.tag, o.seed): o for o in result.outcomes}


def prompts_item(was: HeldOut, now: HeldOut) -> Item:
    """The token ids of each episode's first prompt: the env's board through the prompt settings, the chat
    template and the tokenizer."""
    if was.prompts_sha256 == now.prompts_sha256:
        return Item("first prompts", True, f"token ids of {now.episodes} first prompts, {short(now.prompts_sha256)}")
    before, after = _by_seed(was), _by_seed(now)
    differ = sorted(k for k in before.keys() & after.keys() if before[k].prompt != after[k].prompt)
    seeds = _seeds(sorted(seed for _, seed in differ))
    common = len(before.keys() & after.keys())
    detail = f"{len(differ)} of {common} episodes saw other token ids (seeds {seeds or 'none'})"
    return Item("first prompts", False, f"{detail}: was {short(was.prompts_sha256)}, now {short(now.prompts_sha256)}")


def checkpoint_item(was: HeldOut, now: HeldOut) -> Item:
    def text(result: HeldOut) -> str:
        held = f"rollout step {result.step}"
        return f"{short(result.checkpoint_sha256)}, {held}" if result.checkpoint_sha256 else f"none, {held}"

    return same("checkpoint", text(was), text(now))


def _rate(result: HeldOut) -> str:
    return f"{result.successes}/{result.episodes} ({100 * result.success_rate:.1f}%)"


def greedy_result(was: HeldOut, now: HeldOut) -> tuple[Item, str]:
    """Greedy: every episode identical, outcome and token ids."""
    rule = "greedy: every episode must be identical, token for token"
    before, after = _by_seed(was), _by_seed(now)
    both = sorted(before.keys() & after.keys())
    played = [seed for key, seed in ((k, k[1]) for k in both) if before[key] != after[key]]
    alone = len(before.keys() ^ after.keys())
    if not played and not alone:
        return Item("held-out result", True, f"{_rate(now)}, every episode the same", dependency=False), rule
    rates = f"{_rate(now)} both" if (was.successes, was.episodes) == (now.successes, now.episodes) else (
        f"was {_rate(was)}, now {_rate(now)}"
    )  # fmt: skip
    ended = [k for k in both if (before[k].success, before[k].ret) != (after[k].success, after[k].ret)]
    detail = f"{rates}; of the {len(both)} episodes played on both sides {len(ended)} ended otherwise, "
    detail += f"{len(played)} differ in token ids" + (f" (seeds {_seeds(sorted(played))})" if played else "")
    detail += f", {alone} played on one side only" if alone else ""
    return Item("held-out result", False, detail, dependency=False), rule


def sampled_result(was: HeldOut, now: HeldOut, setup: Setup) -> tuple[Item, str]:
    """Sampled: the success rates agree within `NOISE_SE` standard errors of their difference (pooled)."""
    temperature = setup.decoding.get("temperature")
    rule = f"sampled at temperature {temperature}: |difference| <= {NOISE_SE:g} binomial standard errors"
    n1, n2 = was.episodes, now.episodes
    pooled = (was.successes + now.successes) / max(n1 + n2, 1)
    se = math.sqrt(pooled * (1 - pooled) * (1 / max(n1, 1) + 1 / max(n2, 1)))
    diff = abs(was.success_rate - now.success_rate)
    within = diff <= NOISE_SE * se + 1e-12
    detail = f"was {_rate(was)}, now {_rate(now)}: |difference| {100 * diff:.1f} points {'<=' if within else '>'} " \
             f"{NOISE_SE:g} SE = {100 * NOISE_SE * se:.1f} points"  # fmt: skip
    return Item("held-out result", within, detail, dependency=False), rule
