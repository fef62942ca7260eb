"""LoRA on the policy with PEFT (``model.lora``). Functions that gather are FSDP2 collectives. Export an adapter:

python -m roll_lightning.training.lora runs/x/checkpoints/last.ckpt OUT_DIR
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from roll_lightning.training.config import LoraConfig

ADAPTER = "default"  # PEFT's adapter name
PEFT_PREFIX = "base_model.model."


def apply_lora(model: torch.nn.Module, config: LoraConfig, seed: int = 0) -> torch.nn.Module:
    """``model`` with LoRA adapters (``B = 0``; ``A`` from ``seed``, alike on every rank), the base frozen."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = config.target_modules
    peft_config = PeftLoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=targets if isinstance(targets, str) else list(targets),
        bias="none",  # vLLM takes no adapter biases
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, peft_config)


def is_lora(model: torch.nn.Module | None) -> bool:
    return model is not None and hasattr(model, "peft_config")


def base_name(name: str) -> str:
    name = name.removeprefix(PEFT_PREFIX)
    return name.replace(".base_layer.", ".")


def _full(value: torch.Tensor) -> torch.Tensor:
    """The whole tensor, detached (a collective for a DTensor)."""
    with torch.no_grad():
        return (value.full_tensor() if hasattr(value, "full_tensor") else value).detach()


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights under PEFT's names, copied: vLLM scales them in place."""
    from peft import get_peft_model_state_dict

    return {name: _full(value).clone() for name, value in get_peft_model_state_dict(model).items()}


def adapter_config(model: torch.nn.Module) -> dict[str, Any]:
    config = model.peft_config[ADAPTER].to_dict()
    for key, value in config.items():
        if isinstance(value, set):
            config[key] = sorted(value)
    return config


def merged_entries(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(base name, W + B A * scale)`` per base weight, each gathered only when its turn comes."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import transpose

    from roll_lightning.training.weights import state_entries

    layers = {f"{name}.base_layer.weight": m for name, m in model.named_modules() if isinstance(m, LoraLayer)}
    for name, value in state_entries(model):
        if ".lora_" in name:
            continue
        layer = layers.get(name)
        tensor = _full(value)
        if layer is not None and not layer.disable_adapters:
            if ADAPTER not in layer.lora_A:  # e.g. an embedding's adapter
                raise NotImplementedError(f"model.lora.target_modules: {name} is not a linear layer (not merged)")
            delta = _full(layer.lora_B[ADAPTER].weight) @ _full(layer.lora_A[ADAPTER].weight)
            delta = transpose(delta, layer.fan_in_fan_out) * layer.scaling[ADAPTER]
            tensor = tensor + delta.to(tensor.dtype)
        yield base_name(name), tensor


def trainable_keys(module: torch.nn.Module, prefix: str) -> set[str]:
    return {f"{prefix}{name}" for name, p in module.named_parameters() if p.requires_grad}


def keep_only_adapters(owner: torch.nn.Module, attribute: str = "actor") -> None:
    """Checkpoints hold the adapters: the frozen base leaves ``owner``'s state dict, and loads may miss only that."""
    prefix = f"{attribute}."

    def frozen(keys: Any, child: torch.nn.Module) -> set[str]:
        kept = trainable_keys(child, prefix)
        return {k for k in keys if k.startswith(prefix) and k not in kept}

    def drop(module: torch.nn.Module, state: dict[str, Any], prefix_: str, *_: Any) -> None:
        child = getattr(module, attribute, None)
        if is_lora(child):
            for key in frozen([k.removeprefix(prefix_) for k in state], child):
                del state[prefix_ + key]

    def check(module: torch.nn.Module, incompatible: Any) -> None:
        child = getattr(module, attribute, None)
        if is_lora(child):
            base = frozen(incompatible.missing_keys, child)
            incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if k not in base]
        if incompatible.missing_keys or incompatible.unexpected_keys:
            raise RuntimeError(
                f"checkpoint does not fit the model (model.lora as in the run?): missing "
                f"{incompatible.missing_keys[:4]}, unexpected {incompatible.unexpected_keys[:4]}"
            )

    owner.register_state_dict_post_hook(drop)
    owner.register_load_state_dict_post_hook(check)


def export_adapter(checkpoint: str | Path, out: str | Path, model: str | Path | None = None) -> Path:
    """Write a single-file checkpoint's adapter to ``out`` as ``save_pretrained`` does."""
    from transformers import AutoModelForCausalLM

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    recorded = state.get("lora")
    if not recorded:
        raise ValueError(f"{checkpoint}: not a LoRA checkpoint (model.lora.rank was 0)")
    base_path = str(model or recorded["model"])
    config = LoraConfig(**{f.name: recorded["config"][f.name] for f in dataclasses.fields(LoraConfig)})
    peft_model = apply_lora(AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32), config)
    weights = {k.removeprefix("actor."): v for k, v in state["state_dict"].items() if k.startswith("actor.")}
    incompatible = peft_model.load_state_dict(weights, strict=False)
    if incompatible.unexpected_keys or any(".lora_" in k for k in incompatible.missing_keys):
        raise ValueError(f"{checkpoint}: its adapter does not fit {base_path}: {incompatible}")
    peft_model.peft_config[ADAPTER].base_model_name_or_path = base_path
    peft_model.save_pretrained(str(out))
    return Path(out)


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m roll_lightning.training.lora",
        description="Export a LoRA run's adapter (from a checkpoint) as a PEFT folder.",
    )
    parser.add_argument("checkpoint", help="a checkpoint file of a run with model.lora.rank > 0")
    parser.add_argument("out", help="the folder to write (adapter_config.json, adapter_model.safetensors)")
    parser.add_argument("--model", default=None, help="the base model folder (default: the run's model.model)")
    parsed = parser.parse_args(args)
    print(export_adapter(parsed.checkpoint, parsed.out, parsed.model))


if __name__ == "__main__":
    main()
