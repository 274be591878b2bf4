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
import shutil
from pathlib import Path
from typing import Any

import yaml

from sigma_moe.framework.checkpoint import atomic_write_bytes, list_broken, list_checkpoints
from sigma_moe.framework.config import ConfigError

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
EVAL_SETTINGS = ("ffn.backend", "task.eval_mem_segments", "task.eval_batch_size",
                 "task.val_segments", "task.final_segments")
EVAL_FREE = (*VOLATILE, "name", "trainer", *EVAL_SETTINGS)
# the dotted keys config_hash leaves out: those that never name a run
NOT_IDENTITY = (*VOLATILE, *(f"trainer.{k}" for k in VOLATILE_TRAINER))


def saved_config(run_dir: Path) -> dict[str, Any] | None:
    """The config a training run started with in run_dir (its config.yaml); None where
    there is none, or it is not a readable config."""
    from omegaconf import OmegaConf

    try:
        saved = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    except (OSError, ValueError, yaml.YAMLError):  # missing, unreadable, not YAML
        return None
    return saved if isinstance(saved, dict) else None


def under(key: str, prefixes: tuple[str, ...]) -> bool:
    """Whether a dotted key is one of `prefixes` or inside one of them."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _flat(node: Any, key: str = "") -> dict[str, Any]:
    """{"a.b": leaf} of a nested dict."""
    if not isinstance(node, dict) or not node:
        return {key: node}
    return {k: v for name, child in node.items()
            for k, v in _flat(child, f"{key}.{name}" if key else str(name)).items()}


def _differences(saved: dict[str, Any], cfg: dict[str, Any], free: tuple[str, ...]
                 ) -> list[tuple[str, Any, Any]]:
    """(key, saved value, this value) of the keys outside `free` whose values differ
    between two configs, sorted by key."""
    saved, now = _flat(saved), _flat(cfg)
    return sorted((k, saved.get(k, "<unset>"), now.get(k, "<unset>"))
                  for k in saved.keys() | now.keys()
                  if not under(k, free) and saved.get(k, "<unset>") != now.get(k, "<unset>"))


def check_trained_as(run_dir: Path, cfg: dict[str, Any]) -> None:
    """mode=eval: the config must describe the model the run trained (its config.yaml), up
    to the EVAL_FREE keys; an evaluation of another model would be filed under this run."""
    from omegaconf import OmegaConf

    path = run_dir / "config.yaml"
    if not path.exists():
        return
    saved = OmegaConf.to_container(OmegaConf.load(path))
    diff = _differences(saved, cfg, EVAL_FREE)
    if diff:
        k, saved_v, now_v = diff[0]
        more = f" (and {len(diff) - 1} more keys)" if len(diff) > 1 else ""
        raise ConfigError(
            f"mode=eval: {run_dir} was trained with {k}={saved_v}, not {now_v}{more}; "
            f"evaluate it with the experiment and overrides it was trained with")


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
    except ValueError:  # not JSON, or not UTF-8 (UnicodeDecodeError): as if unfinished
        return None


def finished_as(done: dict[str, Any] | None, cfg: dict[str, Any]) -> bool:
    """Whether `done` (read_results) is a finished run of `cfg`: its config hash, today's or
    an earlier version's (run.py then says "already finished"; the sweep launchers skip it)."""
    return done is not None and done.get("config_hash") in run_hashes(cfg)


def trained_as(run_dir: Path, cfg: dict[str, Any]) -> bool:
    """Whether run_dir holds checkpoints of a run that trained `cfg` (its config.yaml), up to
    the evaluation settings (EVAL_SETTINGS) and the keys that never name a run."""
    saved = saved_config(run_dir) if list_checkpoints(run_dir) else None
    return saved is not None and not _differences(saved, cfg, (*NOT_IDENTITY, *EVAL_SETTINGS))


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


def saved_config_matches(run_dir: Path, cfg: dict[str, Any]) -> bool | None:
    """Whether the config a training run started with in run_dir (its config.yaml) is
    `cfg`; None where there is no config.yaml, False where it cannot be read."""
    if not (run_dir / "config.yaml").is_file():
        return None
    saved = saved_config(run_dir)
    try:
        return saved is not None and config_hash(saved) in run_hashes(cfg)
    except AttributeError:  # a mapping, but not a config of ours
        return False


def _first_difference(run_dir: Path, cfg: dict[str, Any]) -> str:
    """The clause ', which has KEY=VALUE; this config: VALUE' for the first key of run_dir's
    config.yaml that names a run and differs; '' where there is none to show."""
    saved = saved_config(run_dir)
    diff = [] if saved is None else _differences(saved, cfg, NOT_IDENTITY)
    if not diff:
        return ""
    key, was, now = diff[0]
    return f", which has {key}={was}; this config: {now}"


def unfinished_fresh_run(run_dir: Path, cfg: dict[str, Any]) -> Path | None:
    """The newest fresh=true sibling when it has not finished and trains this config (its
    config.yaml): rerunning an interrupted or requeued fresh=true command resumes it
    instead of starting yet another run."""
    newest = _newest_fresh_sibling(run_dir)[1]
    if newest is None or (newest / "results.json").exists():
        return None
    if list_broken(newest) and not list_checkpoints(newest):  # fresh=true: past it, anew
        return None
    return newest if saved_config_matches(newest, cfg) else None


def start_blocker(run_dir: Path, cfg: dict[str, Any]) -> str | None:
    """Why a training run of `cfg` may not start from step 0 in run_dir, which holds no
    checkpoint and no results; None where it may (nothing there, or an earlier start of
    this same config that stopped before its first checkpoint, which it replaces)."""
    if broken := list_broken(run_dir):
        return (f"{run_dir}: its checkpoints do not load ({', '.join(p.name for p in broken)}; "
                f"see the warnings of the run that found them); to resume, repair one and "
                f"rename it back to *.pt")
    same = saved_config_matches(run_dir, cfg)
    if same is False:
        return (f"{run_dir} holds the start of a run with another config (its config.yaml"
                f"{_first_difference(run_dir, cfg)}; no checkpoint, so "
                f"deleting the directory loses nothing)")
    if same is None and (run_dir / "metrics.jsonl").exists():
        return f"{run_dir} holds the metrics.jsonl of another run (and no config.yaml)"
    return None

