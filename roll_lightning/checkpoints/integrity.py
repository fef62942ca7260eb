"""Checkpoint files that are complete or absent, and checked before use (docs/reliability.md).

The SHA-256 is the zip comment of the archive ``torch.save`` writes (``torch.load`` skips it), so file and
checksum land in one rename and cannot disagree the way a sidecar file could after a kill.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

MARKER = b"roll_lightning-checkpoint "
ZIP_START = b"PK\x03\x04"
END_RECORD = b"PK\x05\x06"  # zip end of central directory: 22 bytes, the last 2 the comment length
END_RECORD_SIZE = 22
CHUNK = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or used (a one-line message)."""


@dataclass(frozen=True)
class Stamp:
    """A checkpoint's digest of its torch bytes and the step it holds (``global_step``: optimiser steps)."""

    sha256: str
    global_step: int
    rollout_step: int | None = None

    def encode(self) -> bytes:
        fields: dict[str, object] = {"sha256": self.sha256, "global_step": self.global_step}
        if self.rollout_step is not None:
            fields["rollout_step"] = self.rollout_step
        return MARKER + json.dumps(fields).encode()

    @classmethod
    def decode(cls, comment: bytes) -> Stamp:
        fields = json.loads(comment[len(MARKER) :])
        rollout = fields.get("rollout_step")
        return cls(str(fields["sha256"]), int(fields["global_step"]), None if rollout is None else int(rollout))

    def describe(self) -> str:
        return (
            f"rollout step {self.rollout_step}" if self.rollout_step is not None else f"global step {self.global_step}"
        )


def _real_cause(err: BaseException) -> BaseException:
    """What stopped a write, under the "unexpected pos" error torch's zip writer raises over it: a process stop
    first, then an OS error, else ``err``."""
    chain: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__context__
    stops = [e for e in chain if not isinstance(e, Exception)]
    return (stops or [e for e in chain if isinstance(e, OSError)] or [err])[0]


def temporary_path(path: Path) -> Path:
    """Hidden, and no ``*.ckpt`` name to resume from."""
    return path.with_name(f".{path.name}.tmp")


def write_checkpoint(checkpoint: dict[str, Any], path: Path) -> Stamp:
    """Save ``checkpoint`` at ``path`` atomically, stamped with its checksum; on failure ``path`` is unchanged.

    torch writes by file name, not through a Python file object: a raising SIGTERM handler run inside torch's
    write callback had its ``SystemExit`` masked (1 run in 4 exited 1, not 143). So the digest is read back."""
    with _replacing(path) as temporary:
        try:
            torch.save(checkpoint, str(temporary))
        except BaseException as err:
            cause = _real_cause(err)
            if cause is err:
                raise
            raise cause from None
        size = temporary.stat().st_size
        if _comment(temporary) != b"":
            raise RuntimeError("torch.save did not end its archive with an empty-comment end record")
        rollout = checkpoint.get("rollout_steps")  # AgentRLModule.on_save_checkpoint
        stamp = Stamp(
            _digest(temporary, size - 2),
            int(checkpoint.get("global_step", -1)),
            None if rollout is None else int(rollout),
        )
        comment = stamp.encode()
        with open(temporary, "r+b") as file:
            file.seek(size - 2)
            file.write(len(comment).to_bytes(2, "little") + comment)
            file.flush()
            os.fsync(file.fileno())
    return stamp


def write_text(path: Path, text: str) -> None:
    """``text`` at ``path`` atomically and durably (`_replacing`)."""
    with _replacing(path) as temporary, temporary.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def _replacing(path: Path) -> Iterator[Path]:
    """A hidden temporary to write ``path``'s new content to (synced by the writer): renamed over ``path`` when the
    block succeeds, then the folder synced; removed when it fails, so ``path`` is never half written."""
    temporary = temporary_path(path)
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable across a power cut."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_verified: dict[tuple[str, int, int, int], Stamp | None] = {}


def verify(path: Path) -> Stamp | None:
    """Raise `CheckpointError` unless ``path`` is whole and matches its stamp; return the stamp (None: unstamped).

    An unchanged file (inode, size, mtime) is not hashed twice: the CLI and the load both verify it."""
    try:
        info = path.stat()
        key = (str(path.resolve()), info.st_ino, info.st_size, info.st_mtime_ns)
    except OSError:
        key = None
    if key is not None and key in _verified:
        return _verified[key]
    problem, stamp = _inspect(path)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} {problem}; {describe_intact_sibling(path)}")
    if key is not None:
        _verified[key] = stamp
    return stamp


def read_stamp(path: Path) -> Stamp | None:
    """The stamp, without checking the digest."""
    try:
        comment = _comment(path)
    except OSError:
        return None
    if comment is None or not comment.startswith(MARKER):
        return None
    try:
        return Stamp.decode(comment)
    except (ValueError, KeyError, TypeError):
        return None


def _inspect(path: Path) -> tuple[str | None, Stamp | None]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            start = file.read(len(ZIP_START))
        comment = _comment(path)
    except FileNotFoundError:
        return "does not exist", None
    except OSError as err:
        return f"cannot be read ({err.strerror or err})", None
    if size == 0:
        return "is empty (0 bytes)", None
    if start != ZIP_START:
        return "is not a checkpoint: its bytes are not the zip archive torch.save writes", None
    if comment is None:
        return f"is truncated: its {size} bytes end before the archive's end record", None
    if not comment.startswith(MARKER):
        return None, None
    try:
        stamp = Stamp.decode(comment)
    except (ValueError, KeyError, TypeError):
        return "is damaged: its checksum stamp cannot be read", None
    if _digest(path, size - len(comment) - 2) != stamp.sha256:
        return "is damaged: its bytes no longer match the SHA-256 written with it", stamp
    return None, stamp


def _comment(path: Path) -> bytes | None:
    """The zip comment, or None when no end record closes the file."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        file.seek(max(0, size - END_RECORD_SIZE - 0xFFFF))
        tail = file.read()
    at = tail.rfind(END_RECORD)
    while at >= 0:
        length = int.from_bytes(tail[at + 20 : at + 22], "little")
        if at + END_RECORD_SIZE + length == len(tail):
            return tail[at + END_RECORD_SIZE :]
        at = tail.rfind(END_RECORD, 0, at)
    return None


def _digest(path: Path, body: int) -> str:
    """SHA-256 of the file as torch wrote it: ``body`` bytes plus an empty comment length."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        left = body
        while left > 0:
            chunk = file.read(min(CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    digest.update(b"\0\0")
    return digest.hexdigest()


def describe_intact_sibling(path: Path) -> str:
    """The newest other intact checkpoint beside ``path``, as the end of an error message."""
    best: tuple[int, Path, Stamp | None] | None = None
    for other in sorted(path.parent.glob("*.ckpt")):
        if other.resolve() == path.resolve():
            continue
        if other.is_dir():  # sharded: whole once it has meta.pt
            if (other / "meta.pt").is_file() and best is None:
                best = (-1, other, None)
            continue
        problem, stamp = _inspect(other)
        step = stamp.global_step if stamp is not None else -1
        if problem is None and (best is None or step > best[0]):
            best = (step, other, stamp)
    if best is None:
        return f"no intact checkpoint beside it in {path.parent}"
    step_note = f" ({best[2].describe()})" if best[2] is not None and best[0] >= 0 else ""
    return f"{best[1]}{step_note} is intact: resume from it with --ckpt_path {best[1]}"
