"""Run logging: a JSONL metrics file in the run directory (always) and wandb (optional).

`logger=wandb` with `logger.mode` online / offline / disabled (offline and disabled need
no network); `logger=none` keeps only the JSONL file. On resume the JSONL file is cut back
to its size when the checkpoint was written (rows of steps that are redone, and a row half
written by a kill, go) and then appended to, and the same wandb run id is reused, so a
resumed run is one run (wandb keeps the first values it got for a redone step).
"""
from __future__ import annotations

import json
import logging
import math
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from sigma_moe.framework.checkpoint import atomic_write_bytes
from sigma_moe.framework.config import ConfigError, first_line


class _TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:  # above an open progress bar
        prefix = "warning: " if record.levelno >= logging.WARNING else ""
        tqdm.write(prefix + self.format(record), file=sys.stderr)


def console_logging() -> None:
    """The framework's progress lines (a dataset being prepared: SentencePiece training, the
    cache entry written) on stderr, between the progress bars. Hydra's job logging is off
    (configs/config.yaml: a run's log is its metrics.jsonl), which left them unseen."""
    log = logging.getLogger("sigma_moe.framework")
    if not any(isinstance(h, _TqdmHandler) for h in log.handlers):
        handler = _TqdmHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)


@dataclass(frozen=True)
class LoggerConfig:
    kind: Literal["none", "wandb"] = "none"
    project: str = "sigma-moe"
    entity: str = ""
    mode: Literal["online", "offline", "disabled"] = "offline"
    group: str = ""


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class RunLogger:
    def __init__(self, cfg: LoggerConfig, run_dir: Path, config: dict, name: str,
                 enabled: bool = True):
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self.wandb = None
        if enabled and cfg.kind == "wandb":
            import wandb

            id_file = run_dir / "wandb_id.txt"
            run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
            atomic_write_bytes(id_file, run_id.encode())
            kind = config.get("ffn", {}).get("kind")
            try:
                self.wandb = wandb.init(
                    project=cfg.project, entity=cfg.entity or None, mode=cfg.mode, name=name,
                    group=cfg.group or None, id=run_id, resume="allow", dir=str(run_dir),
                    # run_dir: its name holds the overrides (scripts/paper_tables.py reads them)
                    config={**config, "run_dir": str(run_dir)},
                    tags=[kind] if kind else None,  # wandb refuses an empty tag
                )
            except wandb.errors.Error as e:  # no login, no network, a bad project name
                said = (first_line(e) or type(e).__name__).rstrip(".")
                hint = ("; logger.mode=offline logs locally (`wandb sync` uploads later)"
                        if cfg.mode == "online" else "")
                raise ConfigError(f"logger.mode={cfg.mode}: wandb.init failed: {said}{hint}"
                                  ) from None

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": time.time(), **{k: _jsonable(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.wandb is not None:
            # not the wall-clock time: wandb keeps its own, and would list it as a metric
            self.wandb.log({k: v for k, v in row.items() if k not in ("step", "time")},
                           step=step)

    def size(self) -> int | None:
        """Bytes of the JSONL file so far (None where this process does not write it)."""
        if not self.enabled:
            return None
        return self.path.stat().st_size if self.path.exists() else 0

    def truncate(self, size: int | None) -> None:
        """Back to `size()` as it was at a checkpoint: forget what came after it."""
        if self.enabled and size is not None and self.path.exists() and (
                self.path.stat().st_size > size):
            os.truncate(self.path, size)

    def summary(self, values: dict[str, Any]) -> None:
        if self.wandb is not None:
            self.wandb.summary.update(values)

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None  # closed once, whichever of the run's paths gets here first
