"""Where a run goes (issue 8: never lose a run): the directory Hydra named for the command,
a fresh=true sibling, or, for mode=eval with evaluation settings on the command line, the
directory the same command without them trained in. What a directory holds decides
(framework/experiment.py): a finished run is not retrained, another config's run is not
trained over."""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from framework.checkpoint import list_broken, list_checkpoints
from framework.cli import dirname, removable_up_to
from framework.config import ConfigError
from framework.experiment import (
    EVAL_SETTINGS,
    fresh_dir,
    read_results,
    remove_if_empty,
    run_hashes,
    start_blocker,
    trained_as,
    under,
    unfinished_fresh_run,
)


def prepare_run_dir(cfg: dict[str, Any], run_dir: Path) -> Path | None:
    """The run directory for this config (Hydra's `run_dir`, or a fresh=true sibling), or
    None if this exact run already finished. mode=eval with evaluation settings among the
    overrides (task.final_segments=2, ...): the trained run's directory
    (`trained_run_dir`)."""
    mode = cfg.get("mode", "train")
    if mode == "eval" and not list_checkpoints(run_dir) and not list_broken(run_dir):
        trained = trained_run_dir(cfg, run_dir)
        if trained is not None:
            print(f"mode=eval: evaluating the run in {trained} (evaluation settings do not "
                  f"name a run)")
            remove_if_empty(run_dir, removable_up_to())  # the one Hydra made for this name
            return trained
    if mode != "train":
        return run_dir
    return choose_run_dir(cfg, run_dir)


def names_without_eval_settings(overrides: list[str], exclude_keys: list[str],
                                item_sep: str = ",", kv_sep: str = "=") -> list[list[str]]:
    """Run directory names (Hydra's override_dirname, then `dirname`) of these command-line
    overrides with some of their evaluation settings (EVAL_SETTINGS) left out: those
    leaving one out, then those leaving two out, ... The training command may have set
    some of them too (task.val_segments=1), which then name its directory."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    named = [o for o in OverridesParser.create().parse_overrides(overrides)
             if o.key_or_group not in exclude_keys]
    evals = [i for i, o in enumerate(named) if under(o.key_or_group, EVAL_SETTINGS)]
    return [[dirname(item_sep.join(sorted(o.input_line for i, o in enumerate(named)
                                          if i not in left_out)).replace("=", kv_sep))
             for left_out in itertools.combinations(evals, n)]
            for n in range(1, len(evals) + 1)]


def trained_run_dir(cfg: dict[str, Any], run_dir: Path) -> Path | None:
    """mode=eval of a single run whose directory has no checkpoint: the run its command
    trained, when evaluation settings among the overrides (task.final_segments=2) gave
    Hydra's directory another name. The candidates leaving out the fewest settings win;
    one of them must have trained this config (experiment.trained_as), or None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.RUN:
        return None
    hc = HydraConfig.get()
    spec = hc.job.config.override_dirname
    # runs/<name>/<overrides>: with no overrides left, runs/<name> itself
    return pick_trained(cfg, run_dir.parent, names_without_eval_settings(
        list(hc.overrides.task), list(spec.exclude_keys), spec.item_sep, spec.kv_sep))


def pick_trained(cfg: dict[str, Any], base: Path, candidates: list[list[str]]
                 ) -> Path | None:
    """The one directory base/<name> that trained `cfg`, from the first group of candidate
    names that has any (None: none, or two in one group)."""
    for names in candidates:
        found = {base / n for n in names if trained_as(base / n, cfg)}
        if found:
            return found.pop() if len(found) == 1 else None
    return None


def choose_run_dir(cfg: dict[str, Any], run_dir: Path) -> Path | None:
    """Where a training run goes (None: it already finished). Under several processes
    (torchrun, Slurm) rank 0 decides, and creates a fresh=true directory, then tells the
    others: deciding alone, each rank would take the next free sibling for itself."""
    from framework.distributed import broadcast_from_main, init_distributed
    from framework.trainer import resolve_device

    info = init_distributed(resolve_device(cfg["trainer"]["device"]).type)
    decision: tuple[str | None, str | None] = (None, None)
    if info.is_main:
        try:
            chosen = _choose_run_dir(cfg, run_dir)
            decision = (None if chosen is None else str(chosen), None)
        except Exception as e:  # every rank must stop, not wait for rank 0's answer
            decision = (None, str(e) if isinstance(e, (ConfigError, OSError)) else
                        f"choosing the run directory failed: {type(e).__name__}: {e}")
    chosen, error = broadcast_from_main(decision)
    if error is not None:
        raise ConfigError(error)
    return None if chosen is None else Path(chosen)


def _choose_run_dir(cfg: dict[str, Any], run_dir: Path) -> Path | None:
    done = read_results(run_dir)
    started = done is not None or list_checkpoints(run_dir)
    blocker = None if started else start_blocker(run_dir, cfg)
    if cfg.get("fresh") and (started or blocker):
        if (again := unfinished_fresh_run(run_dir, cfg)) is not None:
            print(f"fresh=true: {run_dir} is kept; resuming the unfinished run that an "
                  f"earlier fresh=true started in {again}")
            return again
        new = fresh_dir(run_dir)
        print(f"fresh=true: {run_dir} is kept; starting a new run in {new}")
        new.mkdir(parents=True)
        return new
    if done is not None:
        if done.get("config_hash") in run_hashes(cfg):
            metric = done.get("metric", "loss")
            try:
                numbers = (f": valid {metric} {done['valid'][metric]:.4f}, test {metric} "
                           f"{done['test'][metric]:.4f}")
            except (KeyError, TypeError, ValueError):  # an edited or foreign results.json
                numbers = ""
            print(f"this run already finished{numbers}; results in "
                  f"{run_dir / 'results.json'} (fresh=true starts a new run)")
            return None
        blocker = f"{run_dir} holds a finished run with another config"
    if blocker:
        raise ConfigError(f"{blocker}; pass fresh=true (a new sibling directory) or choose "
                          f"another directory (hydra.run.dir; in a sweep, hydra.sweep.dir)")
    return run_dir
