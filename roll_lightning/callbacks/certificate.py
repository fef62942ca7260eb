"""`RunCertificate`: every run keeps ``<root>/checkpoints/run.json``, what its held-out numbers depend on and the
numbers as they come in; ``validate --certificate FILE`` replays a certificate's result and says what differs
(docs/reliability.md, "Run certificate")."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn

from roll_lightning.checkpoints.callback import LAST, PREVIOUS, checkpoint_dir
from roll_lightning.checkpoints.certificate import (
    CERTIFICATE,
    Certificate,
    CertificateError,
    HeldOut,
    Setup,
    continue_or_set_aside,
)
from roll_lightning.checkpoints.certificate_check import CheckReport, compare
from roll_lightning.checkpoints.fingerprint import model_digests, package_versions, source_commit, tokenizer_digests
from roll_lightning.checkpoints.integrity import read_stamp, verify
from roll_lightning.rollout.datamodule import SetUpRollout, rollout_of
from roll_lightning.rollout.engines.factory import resolve_device
from roll_lightning.training.module import AgentRLModule

SEED_STREAM = "group_seed: numpy SeedSequence([run_seed, salt, index]) -> 31 bits, odd for held-out"


@dataclasses.dataclass(frozen=True)
class Expected:
    """The certificate a ``validate`` run is checked against, and its result for the weights it plays."""

    source: Path
    certificate: Certificate
    result: HeldOut


class RunCertificate(L.Callback):
    """Writes ``run.json`` on rank 0 at set-up and after each held-out evaluation (atomically); with `expect`, a
    ``validate`` run compares its evaluation with the certificate's (`report`)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.certificate: Certificate | None = None
        self.expected: Expected | None = None
        self.report: CheckReport | None = None
        self._seen = 0  # `fit_record.held_out` entries recorded

    def expect(self, source: str, ckpt_path: str | None) -> None:
        """Check this ``validate`` run against the certificate at ``source``, read now so bad input stops it before
        any server starts; its result for ``ckpt_path``'s weights (None: the untrained model) must be there."""
        certificate = Certificate.read(Path(source))
        sha, step = checkpoint_identity(ckpt_path)
        result = certificate.result_for(sha, step)
        if result is None:
            held = ", ".join(str(r.step) for r in certificate.results) or "none"
            weights = f"checkpoint {ckpt_path} (rollout step {step}, sha256 {sha[:12]})" if sha else "no checkpoint"
            raise CertificateError(
                f"run certificate {source} holds no held-out result for {weights}; it holds results for rollout "
                f"steps: {held}. Evaluate those weights where they were trained first (validate --ckpt_path ... adds "
                "its result to that run's run.json), or check one of those"
            )
        self.expected = Expected(Path(source), certificate, result)

    def report_lines(self) -> list[str]:
        """The check's output: a head line, one line per item, the verdict ([] when nothing was compared)."""
        if self.report is None or self.expected is None or self.certificate is None:
            return []
        notes, result = self.expected.certificate.notes, self.expected.result
        lines = [
            f"certificate {self.expected.source} (written {notes.get('written') or '?'} by {result.by or '?'}), "
            "item by item: was = that run, now = this one"
        ]
        was, now = notes.get("source_commit"), self.certificate.notes.get("source_commit")
        if was and now and was != now:
            lines.append(f"  (not compared: roll_lightning's source was commit {was}, now {now}; its version is)")
        return lines + self.report.lines()

    # -- hooks ---------------------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        rollout = rollout_of(trainer)
        if not isinstance(pl_module, AgentRLModule) or rollout is None:
            return
        self._seen = len(pl_module.fit_record.held_out)
        if not trainer.is_global_zero:
            return
        setup = describe(trainer, rollout, pl_module)
        notes = {"by": stage, "written": "", "model_path": str(rollout.model), "source_commit": source_commit()}
        self.path, results = checkpoint_dir(trainer) / CERTIFICATE, []
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            results, aside = continue_or_set_aside(self.path, setup)
            if aside is not None:
                _say(f"{self.path} was written with another setup: kept as {aside}")
        except OSError as err:
            _say(f"the run certificate {self.path} cannot be written ({err.strerror or err}); the run goes on without")
            self.path = None
        self.certificate = Certificate(setup, list(results), notes)
        self._write()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        self._update(trainer, pl_module)  # before this step's checkpoint: the evaluated step's file is final

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._update(trainer, pl_module, stamps=trainer.state.fn != TrainerFn.FITTING)
        if trainer.state.fn == TrainerFn.VALIDATING and self.expected is not None and self.certificate is not None:
            now = self.certificate.results[-1] if self.certificate.results else None
            if now is not None and now.by == "validate":
                expected = self.expected
                self.report = compare(expected.certificate.setup, expected.result, self.certificate.setup, now)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._update(trainer, pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        try:
            self._update(trainer, pl_module)
        except Exception as err:  # never over the run's own failure
            _say(f"the run certificate was not updated: {err}")

    # -- recording -----------------------------------------------------------------------------------

    def _update(self, trainer: L.Trainer, pl_module: L.LightningModule, stamps: bool = True) -> None:
        """Record new evaluations; ``stamps``: fill in the checkpoints that hold them (not while a fit's evaluated
        step is still to be written again with its evaluation)."""
        if not isinstance(pl_module, AgentRLModule):
            return
        new = pl_module.fit_record.held_out[self._seen :]
        self._seen = len(pl_module.fit_record.held_out)
        if self.certificate is None:
            return
        validating = trainer.state.fn == TrainerFn.VALIDATING
        stamp = read_stamp(Path(trainer.ckpt_path)) if validating and _is_file(trainer.ckpt_path) else None
        sha = stamp.sha256 if stamp is not None else None  # verified before the load
        for result in new:
            self.certificate.add(dataclasses.replace(result, checkpoint_sha256=sha))
        filled = self._fill_checkpoints(trainer) if stamps and not validating else False
        if new or filled:
            self._write()

    def _fill_checkpoints(self, trainer: L.Trainer) -> bool:
        """A fit's results get the SHA-256 of ``last.ckpt`` or ``previous.ckpt`` when it holds their step."""
        assert self.certificate is not None
        folder = checkpoint_dir(trainer)
        held = {}
        for name in (PREVIOUS, LAST):
            stamp = read_stamp(folder / name) if (folder / name).is_file() else None
            if stamp is not None and stamp.rollout_step is not None:
                held[stamp.rollout_step] = stamp.sha256
        results, changed = self.certificate.results, False
        for i, result in enumerate(results):
            if result.checkpoint_sha256 is None and result.by == "fit" and result.step in held:
                results[i], changed = dataclasses.replace(result, checkpoint_sha256=held[result.step]), True
        return changed

    def _write(self) -> None:
        if self.certificate is None or self.path is None:
            return
        self.certificate.notes["written"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
        try:
            self.certificate.write(self.path)
        except OSError as err:
            _say(f"the run certificate {self.path} was not written ({err.strerror or err})")


def checkpoint_identity(ckpt_path: str | None) -> tuple[str | None, int]:
    """A checkpoint file's SHA-256 and rollout step, verified (None, 0: no checkpoint, the untrained model)."""
    if ckpt_path is None:
        return None, 0
    path = Path(ckpt_path)
    if path.is_dir():
        raise CertificateError(
            f"checkpoint {path} is a sharded folder, which carries no checksum: a certificate check needs a "
            "single-file checkpoint"
        )
    stamp = verify(path)
    if stamp is None:
        raise CertificateError(f"checkpoint {path} carries no checksum (written before checkpoints had one)")
    return stamp.sha256, stamp.rollout_step if stamp.rollout_step is not None else stamp.global_step


def describe(trainer: L.Trainer, rollout: SetUpRollout, module: AgentRLModule) -> Setup:
    """This run's `Setup`, from what is set up: the model folder, tokenizer, env specs, engine, settings."""
    engine = rollout.engine
    replicas = list(getattr(engine, "replicas", [engine]))
    kind = str(getattr(replicas[0], "name", type(replicas[0]).__name__))
    lanes = rollout.eval_lanes()
    envs: dict[str, Any] = {}
    for lane in lanes:
        spec = rollout.servers.spec_of(lane) if rollout.servers is not None else None
        envs[lane.tag] = env_entry(lane.env_id, spec, lane.agent)
    samplings = {lane.tag: dataclasses.asdict(lane.episode.sampling) for lane in lanes}
    first = next(iter(samplings.values()))
    device = resolve_device(rollout.engine_config.device, str(trainer.strategy.root_device)).split(":")[0]
    extra = ("vllm",) if kind == "vllm" else ()
    return Setup(
        versions=package_versions(extra + (("peft",) if module.lora.enabled else ())),
        model=model_digests(Path(rollout.model)),
        tokenizer=tokenizer_digests(rollout.tokenizer),
        episode={lane.tag: _episode(lane.episode) for lane in lanes},
        envs=envs,
        seeds={
            "run_seed": rollout.rollout.seed,
            "engine_seed": rollout.engine_config.seed,
            "stream": SEED_STREAM,
            "salts": {lane.tag: lane.seed_salt for lane in lanes},
        },  # fmt: skip
        engine={
            "kind": kind,
            "dtype": rollout.engine_config.weights_dtype(device),
            "device": device,
            "replicas": len(replicas),
            "accelerator": _accelerator(device),
        },  # fmt: skip
        decoding=first if all(s == first for s in samplings.values()) else samplings,
    )


def env_entry(env_id: str, spec: Any, agent: Any) -> dict[str, Any]:
    """An env as its server described it (`EnvSpec`: version, the config in effect, rules, tools...)."""
    if agent is not None:
        return {"env_id": env_id, "agent": list(getattr(agent, "command", []))}
    if spec is None:
        return {"env_id": env_id, "version": "unknown"}
    from google.protobuf.json_format import MessageToDict

    described = MessageToDict(spec, preserving_proto_field_name=True)
    return {"env_id": env_id, "version": spec.version, "config": described.pop("config", {}),
            "spec": {k: v for k, v in described.items() if k not in ("env_id", "version")}}  # fmt: skip


def _episode(settings: Any) -> dict[str, Any]:
    values = dataclasses.asdict(settings)
    values.pop("sampling", None)  # `decoding`
    return values


def _accelerator(device: str) -> str:
    if device != "cuda":
        return ""
    import torch

    return str(torch.cuda.get_device_name())


def _say(message: str) -> None:
    print(f"roll_lightning: {message}", file=sys.stderr, flush=True)


def _is_file(path: str | None) -> bool:
    return path is not None and Path(path).is_file()
