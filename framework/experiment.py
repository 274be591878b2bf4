"""Run directories: identity (config hash), safety checks and results (issue: never lose a run).

A run directory is derived from the experiment name and the command-line overrides
(configs/config.yaml, `hydra.run.dir`), so running the same command again finds the same
directory and resumes; a finished run (results.json with the same config hash) is not
retrained unless `fresh=true`, which starts over in a new sibling directory.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from framework.checkpoint import atomic_write_bytes
from framework.config import ConfigError

# Keys that do not change what is computed, so they do not change the run's identity
# (nan_policy only acts once a step is non-finite: rerunning a diverged run with
# trainer.nan_policy=skip resumes it from its last good checkpoint; grad_accum splits the
# same batch into micro-batches for the same optimizer step: a run that ran out of memory
# resumes with trainer.grad_accum=2, and counts as its experiment's run in the tables).
VOLATILE = ("logger", "mode", "fresh", "paper", "sweep_name")
VOLATILE_TRAINER = ("progress", "log_every", "device", "nan_policy", "grad_accum")
# earlier VOLATILE_TRAINER sets, newest first: runs started before a key joined keep their
# old hash
EARLIER_VOLATILE_TRAINER = (("progress", "log_every", "device", "nan_policy"),
                            ("progress", "log_every", "device"))


def config_hash(cfg: dict[str, Any], volatile_trainer: tuple[str, ...] = VOLATILE_TRAINER
                ) -> str:
    ident = {k: v for k, v in cfg.items() if k not in VOLATILE}
    ident["trainer"] = {k: v for k, v in cfg.get("trainer", {}).items()
                        if k not in volatile_trainer}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]


def run_hashes(cfg: dict[str, Any]) -> tuple[str, ...]:
    """The hashes a run of `cfg` may carry: today's first, then those of earlier versions."""
    return (config_hash(cfg), *(config_hash(cfg, v) for v in EARLIER_VOLATILE_TRAINER))


# What an evaluation of a trained run may set differently: how it evaluates, not what was
# trained (mode=eval checks the rest against the run's config.yaml)
EVAL_FREE = (*VOLATILE, "name", "trainer", "ffn.backend", "task.eval_mem_segments",
             "task.eval_batch_size", "task.val_segments", "task.final_segments")


def _flat(node: Any, key: str = "") -> dict[str, Any]:
    """{"a.b": leaf} of a nested dict."""
    if not isinstance(node, dict) or not node:
        return {key: node}
    return {k: v for name, child in node.items()
            for k, v in _flat(child, f"{key}.{name}" if key else str(name)).items()}


def check_trained_as(run_dir: Path, cfg: dict[str, Any]) -> None:
    """mode=eval: the config must describe the model the run trained (its config.yaml), up
    to the EVAL_FREE keys; an evaluation of another model would be filed under this run."""
    from omegaconf import OmegaConf

    path = run_dir / "config.yaml"
    if not path.exists():
        return
    saved, now = _flat(OmegaConf.to_container(OmegaConf.load(path))), _flat(cfg)
    free = lambda k: any(k == f or k.startswith(f + ".") for f in EVAL_FREE)  # noqa: E731
    diff = sorted(k for k in saved.keys() | now.keys()
                  if not free(k) and saved.get(k, "<unset>") != now.get(k, "<unset>"))
    if diff:
        k = diff[0]
        more = f" (and {len(diff) - 1} more keys)" if len(diff) > 1 else ""
        raise ConfigError(
            f"mode=eval: {run_dir} was trained with {k}={saved.get(k, '<unset>')}, not "
            f"{now.get(k, '<unset>')}{more}; evaluate it with the experiment and overrides "
            f"it was trained with")


def check_writable(run_dir: Path, min_free_mb: int = 100) -> None:
    """Fail before any training if the run directory cannot hold checkpoints."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"run directory {run_dir} is not writable ({e.strerror}); "
                          f"set hydra.run.dir=<writable path>") from None
    free_mb = shutil.disk_usage(run_dir).free // 2**20
    if free_mb < min_free_mb:
        raise ConfigError(f"only {free_mb} MB free under {run_dir} (need {min_free_mb} MB for "
                          f"checkpoints); free space or set hydra.run.dir elsewhere")


def read_results(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "results.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def write_results(run_dir: Path, results: dict[str, Any], name: str = "results.json") -> Path:
    path = run_dir / name
    atomic_write_bytes(path, (json.dumps(results, indent=2) + "\n").encode())
    return path


def _newest_fresh_sibling(run_dir: Path) -> tuple[int, Path | None]:
    """(N, run_dir-N) of the existing sibling with the highest N; (1, None) if none."""
    suffixes = (p.name[len(run_dir.name) + 1:]
                for p in run_dir.parent.glob(f"{glob.escape(run_dir.name)}-*"))
    n = max((int(s) for s in suffixes if s.isdigit()), default=1)
    return n, run_dir.with_name(f"{run_dir.name}-{n}") if n > 1 else None


def fresh_dir(run_dir: Path) -> Path:
    """A new sibling run_dir-N, N above every existing one (fresh=true never overwrites a
    run, and the highest N is always the newest)."""
    return run_dir.with_name(f"{run_dir.name}-{_newest_fresh_sibling(run_dir)[0] + 1}")


def unfinished_fresh_run(run_dir: Path, cfg: dict[str, Any]) -> Path | None:
    """The newest fresh=true sibling when it has not finished and trains this config (its
    config.yaml): rerunning an interrupted or requeued fresh=true command resumes it
    instead of starting yet another run."""
    from omegaconf import OmegaConf

    newest = _newest_fresh_sibling(run_dir)[1]
    if newest is None or (newest / "results.json").exists():
        return None
    try:
        saved = OmegaConf.to_container(OmegaConf.load(newest / "config.yaml"))
    except (OSError, ValueError):  # no config.yaml (yet), or an unreadable one
        return None
    return newest if config_hash(saved) in run_hashes(cfg) else None


def remove_if_empty(run_dir: Path, up_to: Path | None = None) -> None:
    """Remove a run directory that a failed start left empty (no fake-looking runs), and
    its parents that are empty then, below `up_to` (the ones Hydra made for it)."""
    d, stop = run_dir.resolve(), None if up_to is None else up_to.resolve()
    while True:
        try:
            if not d.is_dir() or any(d.iterdir()):
                return
            os.rmdir(d)
        except OSError:
            return
        d = d.parent
        if stop is None or stop not in d.parents:
            return
