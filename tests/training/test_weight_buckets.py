"""Weights streamed in buckets from the trainer's tensors into the engines (`Handover.publish`, `BucketFeed`): the same
model as the full-dict load, every tensor once, buckets within their size, every replica gets every bucket, the
engine keeps its own copy, and a failure on either side ends the stream instead of hanging it."""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from env_servers.ports import free_port
from roll_lightning.models.tiny import tiny_model
from roll_lightning.rollout.engines import EngineRouter, SamplingParams
from roll_lightning.rollout.engines.base import BucketFeed, Weights, iter_buckets
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine
from roll_lightning.rollout.handover import load_buckets
from roll_lightning.training.weights import bucketed, full_state_dict, tensor_bytes, weight_buckets

GREEDY = SamplingParams(max_new_tokens=8, temperature=0)


def _load(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _prompt(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


def _teacher_forced(model: torch.nn.Module, prompt: list[int], reply: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)


async def _stream(engine: Any, trainer: torch.nn.Module, bucket_bytes: int, version: int) -> dict[str, float]:
    """What a publish runs (`load_buckets`): the buckets are made on a thread of their own while the engine loads
    them on this loop."""
    loop = asyncio.get_running_loop()

    def call(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    return await asyncio.to_thread(load_buckets, engine, weight_buckets(trainer, bucket_bytes), version, call)


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.getbasetemp() / "models", seed=1, tie_word_embeddings=True)


@pytest.mark.parametrize("tied", [False, True])
def test_buckets_hold_every_tensor_once_within_the_size(model_dir: Path, tied_dir: Path, tied: bool) -> None:
    model = _load(tied_dir if tied else model_dir)
    state = model.state_dict()
    unique = [name for name in state if not (tied and name == "lm_head.weight")]  # a tied head is the embedding
    largest = max(tensor_bytes(t) for t in state.values())
    for size in (1, 4096, 20_000, largest, largest + 1, 10**12):
        buckets = list(weight_buckets(model, size))
        names = [name for bucket in buckets for name, _ in bucket]
        assert names == unique  # every tensor exactly once, in the state dict's order
        for i, bucket in enumerate(buckets):
            used = sum(tensor_bytes(t) for _, t in bucket)
            assert used <= size or len(bucket) == 1  # over the size only as a single tensor
            if i + 1 < len(buckets):  # full: the next tensor did not fit
                assert used + tensor_bytes(buckets[i + 1][0][1]) > size
            for name, tensor in bucket:  # the trainer's own tensors, not copies
                assert tensor.data_ptr() == state[name].data_ptr()
    assert len(list(weight_buckets(model, 1))) == len(unique) and len(list(weight_buckets(model, 10**12))) == 1


def test_a_tensor_is_gathered_only_when_it_joins_a_bucket() -> None:
    """The size decides a bucket's end before the next tensor is gathered: never more than a bucket at once."""
    entries = [(f"w{i}", torch.zeros(10)) for i in range(6)]  # 40 bytes each
    gathered: list[str] = []
    taken: list[list[str]] = []

    def gather(tensor: torch.Tensor) -> torch.Tensor:
        gathered.append(next(name for name, t in entries if t is tensor))
        return tensor

    for bucket in bucketed(iter(entries), 100, gather=gather):
        taken.append([name for name, _ in bucket])
        assert gathered == [name for names in taken for name in names]  # nothing of the next bucket yet
    assert taken == [["w0", "w1"], ["w2", "w3"], ["w4", "w5"]]


async def test_a_bucketed_sync_loads_what_the_full_dict_loads_and_keeps_its_own_copy(
    model_dir: Path, tied_dir: Path, tokenizer: Any
) -> None:
    """Several small buckets into one engine, the old full CPU dict into another: same greedy tokens and log-probs,
    equal to the trainer's; the trainer's weights are untouched; the engine does not alias them."""
    trainer = _load(tiny_model(model_dir.parent, seed=1))
    before = {k: v.clone() for k, v in trainer.state_dict().items()}
    prompt = _prompt(tokenizer, "#P_X_O#")
    streamed, full = TransformersEngine(model_dir), TransformersEngine(model_dir)
    try:
        start = await streamed.generate(prompt, GREEDY)
        stats = await _stream(streamed, trainer, 20_000, version=4)
        await full.load_weights(full_state_dict(trainer), version=4)
        untouched = all(torch.equal(v, before[k]) for k, v in trainer.state_dict().items())
        a, b = await asyncio.gather(streamed.generate(prompt, GREEDY), full.generate(prompt, GREEDY))
        for tensor in trainer.state_dict().values():  # scramble the trainer: the engine must not notice
            tensor.zero_()
        after_scramble = await streamed.generate(prompt, GREEDY)
    finally:
        await asyncio.gather(streamed.close(), full.close())
    assert stats["buckets"] > 5 and stats["delivered"] == stats["buckets"] and untouched
    assert stats["bytes"] == sum(tensor_bytes(t) for t in before.values())
    assert a.token_ids == b.token_ids and a.policy_version == b.policy_version == 4
    assert a.token_ids != start.token_ids  # the load changed the model
    torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=0, rtol=0)
    trainer.load_state_dict(before)
    torch.testing.assert_close(torch.tensor(a.logprobs), _teacher_forced(trainer, prompt, a.token_ids))
    assert after_scramble.token_ids == a.token_ids and after_scramble.logprobs == a.logprobs


class Recorder:
    """A replica that records each bucket it loads, in a log shared with the producer."""

    def __init__(self, index: int, log: list[tuple[str, int, int]], concurrent: bool = True) -> None:
        self.index, self.log, self.concurrent_loads = index, log, concurrent
        self.policy_version = 0
        self.names: list[str] = []

    async def load_weights(self, weights: Weights, version: int) -> None:
        def take() -> None:
            for bucket in iter_buckets(weights):
                self.names += [name for name, _ in bucket]
                self.log.append(("loaded", self.index, int(bucket[0][0])))

        await asyncio.to_thread(take)
        self.policy_version = version


def _source(log: list[tuple[str, int, int]], count: int) -> Any:
    for k in range(count):
        log.append(("made", -1, k))
        yield [(str(k), torch.full((4,), float(k)))]


@pytest.mark.parametrize("concurrent", [True, False])
async def test_a_router_loads_every_bucket_into_every_replica(concurrent: bool) -> None:
    """Replicas that load side by side get each bucket before the next is made (lock step); others one after the
    other. A stream can be read once either way."""
    log: list[tuple[str, int, int]] = []
    replicas = [Recorder(i, log, concurrent) for i in range(3)]
    router = EngineRouter(replicas)  # type: ignore[list-item]
    await router.load_weights(_source(log, 5), version=3)
    assert all(r.names == [str(k) for k in range(5)] for r in replicas)
    assert router.policy_version == 3
    if concurrent:
        for k in range(1, 5):
            made = log.index(("made", -1, k))
            assert {("loaded", i, k - 1) for i in range(3)} <= set(log[:made])  # all loaded k-1 before k was made


async def test_a_router_of_two_transformers_replicas_matches_the_trainer(model_dir: Path, tokenizer: Any) -> None:
    trainer = _load(tiny_model(model_dir.parent, seed=1))
    prompt = _prompt(tokenizer, "#P_X_O#")
    router = EngineRouter([TransformersEngine(model_dir), TransformersEngine(model_dir)])
    try:
        stats = await _stream(router, trainer, 20_000, version=2)
        replies = [await r.generate(prompt, GREEDY) for r in router.replicas]
    finally:
        await router.close()
    assert stats["buckets"] > 5 and router.policy_version == 2
    for reply in replies:
        assert reply.token_ids == replies[0].token_ids and reply.policy_version == 2
        torch.testing.assert_close(torch.tensor(reply.logprobs), _teacher_forced(trainer, prompt, reply.token_ids))


async def test_an_engine_that_refuses_a_bucket_fails_the_sync_and_keeps_its_version(
    model_dir: Path, tokenizer: Any
) -> None:
    """A wrong tensor shape: the load fails naming it, the producer is not left waiting (it still makes every
    bucket, as FSDP2's gathers need), and the engine keeps its policy version."""
    trainer = _load(tiny_model(model_dir.parent, seed=0, hidden_size=128))  # other shapes
    engine = TransformersEngine(model_dir)
    try:
        with pytest.raises(ValueError, match="wrong shapes"):
            await _stream(engine, trainer, 20_000, version=1)
        gen = await engine.generate(_prompt(tokenizer, "x"), GREEDY)
    finally:
        await engine.close()
    assert engine.policy_version == 0 and gen.policy_version == 0


def test_a_failed_producer_fails_the_consumer() -> None:
    feed = BucketFeed()
    seen: list[Any] = []

    def consume() -> None:
        try:
            for bucket in feed:
                seen.append([name for name, _ in bucket])
        except RuntimeError as err:
            seen.append(err)
        finally:
            feed.stop()

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert feed.put([("a", torch.zeros(1))], timeout=10)
    feed.fail(OSError("gather failed"))
    consumer.join(10)
    assert seen[0] == ["a"] and isinstance(seen[1], RuntimeError) and "gather failed" in str(seen[1])


def test_a_feed_empties_each_bucket_once_it_is_loaded_and_is_read_once() -> None:
    feed = BucketFeed()
    held: list[list[tuple[str, torch.Tensor]]] = []

    def consume() -> None:
        for bucket in feed:
            held.append(bucket)
        feed.stop()

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert feed.put([("a", torch.zeros(1)), ("b", torch.zeros(1))], timeout=10)
    assert held[0] == []  # done with it: no reference to its tensors is left
    feed.close()
    consumer.join(10)
    assert len(held) == 1
    with pytest.raises(RuntimeError, match="once"):
        iter(feed)


def test_a_consumer_that_stops_never_leaves_the_producer_waiting() -> None:
    feed = BucketFeed()

    def fail_after_one() -> None:  # a load that raises while it holds its first bucket
        next(iter(feed))
        feed.stop()

    consumer = threading.Thread(target=fail_after_one)
    consumer.start()
    assert not feed.put([("a", torch.zeros(1))], timeout=10)  # taken, never finished
    assert not feed.put([("b", torch.zeros(1))], timeout=10)  # nobody takes it: at once
    consumer.join(10)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
async def test_vllm_loads_a_bucket_stream_of_a_tied_model(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: Any
) -> None:
    """vLLM's reload fed bucket after bucket (tied embeddings: the head is re-packed from the embedding), equal to
    the trainer's model; the trainer's weights are untouched and the engine keeps its own copy."""
    from roll_lightning.rollout.engines.factory import EngineConfig
    from roll_lightning.rollout.engines.vllm_engine import VLLMEngine

    cache = tmp_path_factory.getbasetemp() / "models"
    a, b = (tiny_model(cache, seed=s, tie_word_embeddings=True) for s in (0, 1))
    trainer = _load(b)
    before = {k: v.clone() for k, v in trainer.state_dict().items()}
    prompt = _prompt(tokenizer, "a long shared history " * 30)  # cached prefix blocks must be dropped too
    config = EngineConfig(kind="vllm", max_model_len=1024, kv_cache_gib=0.25, max_batch_size=8)
    engine, reference = VLLMEngine(a, config=config), TransformersEngine(b)
    try:
        await engine.generate(prompt, GREEDY)
        stats = await _stream(engine, trainer, 20_000, version=1)
        untouched = all(torch.equal(v, before[k]) for k, v in trainer.state_dict().items())
        after = await engine.generate(prompt, GREEDY)
        expected = await reference.generate(prompt, GREEDY)
        for tensor in trainer.state_dict().values():
            tensor.zero_()
        after_scramble = await engine.generate(prompt, GREEDY)
    finally:
        await asyncio.gather(engine.close(), reference.close())
    assert stats["buckets"] > 5 and after.policy_version == 1 and untouched
    assert after.token_ids == expected.token_ids
    torch.testing.assert_close(torch.tensor(after.logprobs), torch.tensor(expected.logprobs), atol=1e-4, rtol=1e-4)
    assert after_scramble.token_ids == after.token_ids
    torch.testing.assert_close(torch.tensor(after_scramble.logprobs), torch.tensor(after.logprobs))


FSDP2_WORKER = r"""
import asyncio, json, sys, threading
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM
from roll_lightning.rollout.handover import feed_buckets
from roll_lightning.training.weights import weight_buckets
from roll_lightning.rollout.engines.base import BucketFeed
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine
from roll_lightning.training.sharding import shard_fsdp2

rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
mesh = init_device_mesh("cpu", (2,))
result = {}
for name, (path, start) in json.loads(sys.argv[4]).items():
    trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    expected = {k: v.clone() for k, v in trainer.state_dict().items()}
    shard_fsdp2(trainer, mesh, "float32")
    engine = TransformersEngine(start)
    feed = BucketFeed()

    errors = []

    async def load():
        try:
            await engine.load_weights(feed, 1)
        except Exception as err:
            errors.append(repr(err))
        finally:
            feed.stop()
            await engine.close()

    loader = threading.Thread(target=lambda: asyncio.run(load()))
    loader.start()
    stats = feed_buckets(weight_buckets(trainer, 20_000), feed)  # the gathers run here, as in a publish
    loader.join(60)
    got = engine.model.state_dict()
    sharded = sum(1 for v in trainer.state_dict().values() if hasattr(v, "full_tensor"))
    result[name] = {
        "buckets": stats["buckets"], "delivered": stats["delivered"], "version": engine.policy_version,
        "equal": all(torch.equal(got[k], v) for k, v in expected.items()), "sharded": sharded, "errors": errors,
    }
json.dump(result, open(f"{out}/rank{rank}.json", "w"))
dist.destroy_process_group()
"""


def test_fsdp2_ranks_each_stream_the_gathered_weights_into_their_engine(
    model_dir: Path, tied_dir: Path, tmp_path: Path
) -> None:
    """Two CPU ranks (gloo), the actor sharded with FSDP2: each parameter is gathered on the trainer's thread into
    the current bucket while each rank's engine loads; both engines end with exactly the unsharded weights."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(FSDP2_WORKER)
    port = str(free_port())
    untied = [tiny_model(model_dir.parent, seed=1), model_dir]  # [trainer, the engine's start]
    tied = [tied_dir, tiny_model(model_dir.parent, seed=0, tie_word_embeddings=True)]
    models = json.dumps({"untied": list(map(str, untied)), "tied": list(map(str, tied))})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), port, str(tmp_path), models],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for name in ("untied", "tied"):
            r = result[name]
            assert r["sharded"] > 0 and r["buckets"] > 5 and r["delivered"] == r["buckets"], (rank, name, r)
            assert r["equal"] and r["version"] == 1, (rank, name, r)
