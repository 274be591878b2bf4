"""Entry point: `python run.py [+exp=NAME] [overrides]` (docs/DESIGN.md "How data flows").

With no `+exp=`, the main job `+exp=mini_moe` runs. Errors a user can fix (config typos,
missing data, bad checkpoints, divergence) end with one line and exit code 1.
"""
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from framework.cli import exit_if_jobs_failed, handle_errors, prepare_argv, prepare_run_dir
from framework.experiment import remove_if_empty

prepare_argv(sys.argv)


@hydra.main(version_base=None, config_path="configs", config_name="config")
def main(cfg: DictConfig):
    from tasks import TASKS

    with handle_errors():
        plain = OmegaConf.to_container(cfg, resolve=True)
        run_dir = prepare_run_dir(plain)
        if run_dir is None:  # already finished: nothing to do
            return None
        try:
            return TASKS.get(plain["task"]["kind"])(plain, run_dir)
        finally:
            # mode=params writes nothing: leave no empty dir (nor runs/NAME/ of a single
            # run; a sweep's parents stay: another job may be creating its dir in them)
            remove_if_empty(run_dir, None if HydraConfig.get().mode == RunMode.MULTIRUN
                            else Path.cwd())


if __name__ == "__main__":
    main()
    exit_if_jobs_failed()
