"""Entry point: `python run.py [+exp=NAME] [overrides]` (docs/DESIGN.md "How data flows").

With no `+exp=`, the main job `+exp=mini_moe` runs. Errors a user can fix (config typos,
missing data, bad checkpoints, divergence) end with one line and exit code 1.
"""
import sys
from contextlib import ExitStack
from pathlib import Path

try:  # a Ctrl-C while Python imports (torch: a second or two) is one line, not a traceback
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    from sigma_moe.framework.cli import (
        exit_if_jobs_failed,
        handle_errors,
        prepare_argv,
        removable_up_to,
    )
    from sigma_moe.framework.config import check_top_level
    from sigma_moe.framework.run_dirs import prepare_run_dir, remove_if_empty
except KeyboardInterrupt:
    sys.exit(130)

prepare_argv(sys.argv)


@hydra.main(version_base=None, config_path="configs", config_name="config")
def main(cfg: DictConfig):
    with handle_errors():
        plain = OmegaConf.to_container(cfg, resolve=True)
        run_dir = Path(HydraConfig.get().runtime.output_dir)  # Hydra has created it
        try:
            # imported here (a second or so), so that a Ctrl-C meanwhile leaves no empty dir
            from sigma_moe.framework.loggers import console_logging
            from sigma_moe.tasks import TASKS

            console_logging()
            # a training run locks its directory until it ends (each job of a sweep in
            # this process too), also when it fails
            with ExitStack() as held:
                check_top_level(plain)
                chosen = prepare_run_dir(plain, run_dir, held)
                if chosen is None:  # already finished: nothing to do
                    return None
                run_dir = chosen
                return TASKS.get(plain["task"]["kind"])(plain, run_dir)
        finally:  # a failed start, or mode=params, wrote nothing: leave no empty dirs
            remove_if_empty(run_dir, removable_up_to())


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # while Hydra composes, before main's own handle_errors
        sys.exit(130)
    exit_if_jobs_failed()
