"""Digests of what a run's numbers depend on: package versions, a model folder's bytes, a tokenizer and its chat
template (`Certificate`'s parts; docs/reliability.md, "Run certificate")."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
# the packages whose versions a run's numbers may depend on; vllm only when it generates
PACKAGES = (
    "roll_lightning",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "lightning",
    "grpcio",
    "protobuf",
)
WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")  # a model folder's weight files, whichever it has
MODEL_CONFIGS = ("config.json", "generation_config.json", "preprocessor_config.json")


def digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def json_digest(value: Any) -> str:
    """The SHA-256 of ``value`` as canonical JSON (sorted keys, no spaces)."""
    return digest(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str))


def package_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Python's version and each installed package's (``extra``: more names, e.g. vllm); absent ones left out."""
    versions = {"python": platform.python_version()}
    for name in (*PACKAGES, *extra):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        import torch

        if torch.cuda.is_available() and torch.version.cuda:
            versions["cuda"] = str(torch.version.cuda)
    except ImportError:
        pass
    return versions


def source_commit() -> str | None:
    """The git commit of roll_lightning's source when it runs from a checkout (a note: the version says less)."""
    folder = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def model_digests(folder: Path) -> dict[str, str]:
    """``weights_sha256``: every weight file's bytes, by name (hashed in full: the size and date of a file say
    nothing of its contents); ``config_sha256``: the architecture's files."""
    weights = sorted({p for pattern in WEIGHTS for p in folder.glob(pattern) if p.is_file()})
    configs = [folder / name for name in MODEL_CONFIGS if (folder / name).is_file()]
    return {
        "weights_sha256": json_digest([[p.name, file_sha256(p)] for p in weights]),
        "weights_files": str(len(weights)),
        "config_sha256": json_digest([[p.name, file_sha256(p)] for p in configs]),
    }


def tokenizer_digests(tokenizer: Any) -> dict[str, str]:
    """``tokenizer_sha256``: its vocabulary, added and special tokens (what the ids mean; the first prompts' ids,
    recorded with each result, catch the rest); ``chat_template_sha256``: the template's text."""
    added = {str(i): str(token) for i, token in sorted(getattr(tokenizer, "added_tokens_decoder", {}).items())}
    special = {k: str(v) for k, v in sorted((getattr(tokenizer, "special_tokens_map", None) or {}).items())}
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates
        template = json.dumps(template, sort_keys=True)
    return {
        "tokenizer_sha256": json_digest({"vocabulary": vocabulary, "added": added, "special": special}),
        "chat_template_sha256": digest(str(template)),
    }
