"""Tasks: `TASKS` maps `task.kind` to a `run(cfg, run_dir)` function (explicit imports)."""
from sigma_moe.framework.registry import Registry

TASKS: Registry = Registry(
    "task", "decorate its run function with @TASKS.register({name!r}) and import its "
    "module in sigma_moe/tasks/__init__.py")

from sigma_moe.tasks import lm_run  # noqa: E402,F401  (fill the registry)

__all__ = ["TASKS"]
