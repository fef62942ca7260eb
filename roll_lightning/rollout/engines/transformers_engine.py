"""`TransformersEngine`: `model.generate` on batches of waiting requests; starts fast, for CPUs and tests."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from roll_lightning.rollout.engines.base import (
    FinishReason,
    Generation,
    SamplingParams,
    Weights,
    iter_buckets,
    stop_string_end,
)
from roll_lightning.rollout.engines.cached_decode import Row, decode, supports_turn_cache
from roll_lightning.rollout.engines.threaded import Request, ThreadedEngine
from roll_lightning.rollout.engines.turn_cache import TurnCache
from roll_lightning.rollout.prompts.vision import images_of, model_inputs, vision_token_ids

if TYPE_CHECKING:
    from roll_lightning.rollout.engines.config import EngineConfig

log = logging.getLogger(__name__)


class TransformersEngine(ThreadedEngine):
    name = "transformers"

    @classmethod
    def from_settings(
        cls, config: EngineConfig, model: str | Path, *, device: str, seed: int, local_world_size: int
    ) -> TransformersEngine:
        """One replica of ``data.engine``."""
        return cls(
            model,
            device=device,
            dtype=config.weights_dtype(device),
            max_batch_size=config.max_batch_size,
            seed=seed,
            turn_cache_gib=config.turn_cache_gib,
        )

    def __init__(
        self,
        model: str | Path | torch.nn.Module,
        *,
        tokenizer: Any = None,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 64,
        seed: int = 0,
        threads: int | None = None,
        turn_cache_gib: float = 1.0,
    ) -> None:
        """``model``: a folder, or a model object with its ``tokenizer``; ``threads``: torch's (None: unchanged);
        ``turn_cache_gib``: memory for conversations' keys/values kept between their turns (`TurnCache`; 0: off)."""
        super().__init__()
        from transformers import AutoTokenizer

        from roll_lightning.models.resolve import load_policy

        if isinstance(model, torch.nn.Module):
            self.model = model
        else:
            self.model = load_policy(model, dtype)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model))
        if tokenizer is None:
            raise ValueError("TransformersEngine: pass a tokenizer with a model object")
        self.model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.eos_ids = _eos_ids(tokenizer, self.model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.max_batch_size = max_batch_size
        self._image_token_id = getattr(self.model.config, "image_token_id", None)
        self._suppressed = list(vision_token_ids(self.model.config))  # never sampled (`vision_token_ids`)
        self._generator_seed = seed
        self._batches = 0
        self._threads = threads
        self._waiting: list[Request] = []
        self.turn_cache = TurnCache(turn_cache_gib if supports_turn_cache(self.model) else 0)
        self._start_worker()

    # -- engine interface ----------------------------------------------------------------------------

    async def load_weights(self, weights: Weights, version: int) -> None:
        await self.run_on_worker(lambda: self._load(weights, version))

    @torch.no_grad()
    def _load(self, weights: Weights, version: int) -> None:
        """Copy in place, each bucket checked first. Unless every tensor was written the load fails and the version
        stays, but the weights may be mixed: do not generate until a load succeeds."""
        targets = self.model.state_dict(keep_vars=True)
        if isinstance(weights, Mapping):
            _check(weights.items(), targets, every=True)
        written: set[int] = set()
        for bucket in iter_buckets(weights):
            _copy_bucket(bucket, targets, written)
        missing = [name for name, target in targets.items() if id(target) not in written]
        if missing:
            raise ValueError(f"load_weights: missing {missing[:5]} ({len(missing)} tensors were not loaded)")
        self.turn_cache.clear()  # keys/values of the old weights
        self.policy_version = version

    async def sleep(self) -> None:
        if self.device.type != "cuda":
            log.info("transformers engine: sleep is a no-op on %s", self.device)
        elif not self.asleep:
            await self.run_on_worker(lambda: (self.turn_cache.clear(), self.model.to("cpu"), torch.cuda.empty_cache()))
            self.asleep = True

    async def wake(self) -> None:
        if self.asleep:
            await self.run_on_worker(lambda: self.model.to(self.device))
            self.asleep = False

    async def reset_prefix_cache(self) -> None:
        await self.run_on_worker(self.turn_cache.clear)

    def stats(self) -> dict[str, float]:
        out = super().stats()
        out.update({f"turn_cache_{name}": float(n) for name, n in self.turn_cache.counters.items()})
        out["turn_cache_bytes"] = float(self.turn_cache.nbytes)
        return out

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    # -- worker --------------------------------------------------------------------------------------

    def _busy(self) -> bool:
        return bool(self._waiting)

    def _in_flight(self) -> list[Request]:
        return self._waiting

    def _work(self, new: list[Request]) -> None:
        if self._threads is not None:
            torch.set_num_threads(self._threads)
            self._threads = None
        self._waiting = [r for r in self._waiting + new if not r.cancelled]
        for request in [r for r in self._waiting if self._interrupted(r)]:  # stopped before it began
            self._stopped_early(request, [], [])
        self._waiting = [r for r in self._waiting if not self._interrupted(r)]
        if not self._waiting:
            return
        key = _batch_key(self._waiting[0].params)
        batch = [r for r in self._waiting if _batch_key(r.params) == key][: self.max_batch_size]
        chosen = set(map(id, batch))
        self._waiting = [r for r in self._waiting if id(r) not in chosen]
        self._run_batch(batch, self._generate)

    def _generate(self, batch: list[Request]) -> list[Generation]:
        seed = self._generator_seed * 1_000_003 + self._batches
        # torch.manual_seed's draws, without its lazy CUDA seeding: that formats a stack trace on every call in a
        # process without CUDA (5% of the tiny model's engine thread)
        torch.default_generator.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed_all(seed)
        self._batches += 1
        epoch = min(r.epoch for r in batch)  # an interrupt since any was asked stops the batch
        if self.turn_cache.enabled and not any(images_of(r.prompt_ids) for r in batch):
            return self._generate_cached(batch, epoch)
        return self._generate_uncached(batch, epoch)

    def _generate_cached(self, batch: list[Request], epoch: int) -> list[Generation]:
        """`decode` from each conversation's cached keys/values; each row's are kept for its next turn."""
        params = batch[0].params
        rows = []
        for request in batch:
            prompt = list(request.prompt_ids)
            past, reused = self.turn_cache.take(request.key, prompt, self.policy_version)
            rows.append(Row(prompt, request.params.max_new_tokens, past, reused))
        decoded = decode(
            self.model,
            rows,
            params,
            stops={*self.eos_ids, *params.stop_token_ids},
            suppressed=self._suppressed,
            pad_id=self.pad_id,
            version=self.policy_version,
            stopped_by_text=_StopStrings.tail_check(self._decode, params.stop),
            interrupted=lambda: self._epoch != epoch,
        )
        results = []
        for request, out in zip(batch, decoded, strict=True):
            ids, logprobs = out.token_ids, out.logprobs
            cut = stop_string_end(self._decode, ids, params.stop)
            if cut is not None:
                ids, logprobs = ids[:cut], logprobs[:cut]
            self.turn_cache.put(request.key, out.kv)
            results.append(
                Generation(ids, logprobs, out.reason, self.policy_version, prompt_tokens=len(request.prompt_ids))
            )
        return results

    @torch.no_grad()
    def _generate_uncached(self, batch: list[Request], epoch: int) -> list[Generation]:
        """One `model.generate` for requests alike but for their token budgets (each row stops at its own)."""
        params = batch[0].params
        budgets = [r.params.max_new_tokens for r in batch]
        width = max(len(r.prompt_ids) for r in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, request in enumerate(batch):  # left padding
            input_ids[row, width - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            attention[row, width - len(request.prompt_ids) :] = 1
        pictures = model_inputs(input_ids, [images_of(r.prompt_ids) for r in batch], self._image_token_id)
        stops = list(dict.fromkeys([*self.eos_ids, *params.stop_token_ids]))
        greedy = params.temperature == 0
        stopping: list[Any] = [_Interrupted(self, epoch)]
        if params.stop:
            stopping.append(_StopStrings(self._decode, params.stop, width))
        if len(set(budgets)) > 1:
            stopping.append(_RowBudgets(budgets, width))
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            **{name: value.to(self.device) for name, value in pictures.items()},
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy else params.top_p,
            top_k=None if greedy else params.top_k,  # 0 = off; None would let generation_config's default in
            max_new_tokens=max(budgets),
            eos_token_id=stops,
            suppress_tokens=self._suppressed or None,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_scores=True,
            stopping_criteria=stopping,
        )
        interrupted = self._epoch != epoch
        new_tokens = out.sequences[:, width:].cpu()
        # `scores` are after the warpers: the sampled distribution
        scores = torch.stack(out.scores, dim=1).float().cpu()  # [B, T, V]
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1)
        results = []
        stop_set = set(stops)
        for row, budget in enumerate(budgets):
            ids = new_tokens[row, :budget].tolist()  # a row past its budget is padded
            reason: FinishReason = "length"
            for i, token in enumerate(ids):
                if token in stop_set:
                    ids, reason = ids[: i + 1], "stop"
                    break
            cut = stop_string_end(self._decode, ids, params.stop)  # rows finished early are padded: cut first
            if cut is not None:
                ids, reason = ids[:cut], "stop"
            if reason == "length" and interrupted and len(ids) < budget:
                reason = "abort"  # stopped where it was: `on_suspend: keep` asks on from here
            results.append(
                Generation(
                    token_ids=ids,
                    logprobs=logprobs[row, : len(ids)].tolist(),
                    finish_reason=reason,
                    policy_version=self.policy_version,
                    prompt_tokens=len(batch[row].prompt_ids),
                )
            )
        return results


def _batch_key(params: SamplingParams) -> SamplingParams:
    """Requests whose sampling differs only in their token budget share a batch."""
    return params.replace(max_new_tokens=1)


class _RowBudgets:
    """A row is done once it has its own ``max_new_tokens`` (the batch runs to the largest)."""

    def __init__(self, budgets: list[int], prompt_width: int) -> None:
        self.budgets, self.width = torch.tensor(budgets), prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        return (input_ids.shape[1] - self.width >= self.budgets).to(input_ids.device)


class _Interrupted:
    """Every row is done once the engine was interrupted (`ThreadedEngine.interrupt`) after this batch began."""

    def __init__(self, engine: TransformersEngine, epoch: int) -> None:
        self.engine, self.epoch = engine, epoch

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.engine._epoch != self.epoch, device=input_ids.device)


class _StopStrings:
    """A row is done once its reply's text contains a stop string."""

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...], prompt_width: int) -> None:
        self.width, self.found = prompt_width, self.tail_check(decode, stop)

    @staticmethod
    def tail_check(decode: Callable[[list[int]], str], stop: tuple[str, ...]) -> Callable[[list[int]], bool]:
        """For a reply checked after every token: does its tail's text contain a stop string?"""
        span = max((len(s) for s in stop), default=0) + 8  # a stop string spans few tokens
        return lambda ids: bool(stop) and any(s in decode(ids[-span:]) for s in stop)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        replies = input_ids[:, self.width :].tolist()
        return torch.tensor([self.found(ids) for ids in replies], device=input_ids.device)


def _eos_ids(tokenizer: Any, model: torch.nn.Module) -> list[int]:
    ids: list[int] = []
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    ids.extend(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the tokenizer and generation config name no eos token: replies could never stop")
    return list(dict.fromkeys(ids))


def _copy_bucket(bucket: Iterable[tuple[str, Any]], targets: Mapping[str, torch.Tensor], written: set[int]) -> None:
    """(Its own function, so no local keeps the bucket alive.)"""
    _check(bucket, targets)
    for name, tensor in bucket:
        target = targets[name]
        target.data.copy_(tensor)
        written.add(id(target))


def _check(pairs: Iterable[tuple[str, Any]], targets: Mapping[str, torch.Tensor], every: bool = False) -> None:
    """Refuse unknown names, wrong shapes and (``every``) missing tensors."""
    pairs = list(pairs)
    unexpected = [name for name, _ in pairs if name not in targets]
    shapes = [
        f"{name} {tuple(tensor.shape)} != {tuple(targets[name].shape)}"
        for name, tensor in pairs
        if name in targets and tuple(tensor.shape) != tuple(targets[name].shape)
    ]
    missing: list[str] = []
    if every:
        given = {id(targets[name]) for name, _ in pairs if name in targets}
        missing = [name for name, target in targets.items() if id(target) not in given]
    if unexpected or shapes or missing:
        raise ValueError(f"load_weights: missing {missing[:5]}, unexpected {unexpected[:5]}, wrong shapes {shapes[:5]}")
