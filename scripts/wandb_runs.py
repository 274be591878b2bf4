"""Finished runs of a wandb project, judged as local runs are (scripts/run_results.py):
`python scripts/paper_tables.py --wandb ENTITY/PROJECT`."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.run_files import as_seed, real  # noqa: E402
from scripts.run_results import (  # noqa: E402
    Judge,
    Run,
    Skipped,
    compose_experiments,
    counted_names,
)


def wandb_runs(project: str, exp_dir: Path, all_overrides: bool = False
               ) -> tuple[list[Run], list[Skipped]]:
    """Finished runs of a wandb project: config `name` / `trainer.seed` / `run_dir`, summary
    `valid_<metric>` / `test_<metric>` (written by sigma_moe/tasks/lm_run.py at the end of
    training).
    Crashed or running ones are not finished. wandb holds no config_hash: the config the
    run logged (all of it, sigma_moe/tasks/lm_run.py) is compared with its experiment's instead;
    other overrides are read from its run directory's name, as for local runs. The runs
    left out otherwise (not finished, no `name`, no numbers) get one note on stderr."""
    every = _wandb_api_runs(project)
    unfinished: dict[str, int] = {}  # state -> runs
    for r in every:
        if r.state != "finished":
            unfinished[str(r.state)] = unfinished.get(str(r.state), 0) + 1
    finished = [(dict(r.config), r.summary, f"wandb:{project}/{r.id}")
                for r in every if r.state == "finished"]
    no_name = [source for cfg, _, source in finished if not cfg.get("name")]
    finished = [f for f in finished if f[0].get("name")]
    no_numbers: list[str] = []
    judge = Judge(exp_dir, compose_experiments(exp_dir, (str(c["name"]) for c, _, _ in finished)),
                  all_overrides)
    out, skipped = [], []
    for cfg, summary, source in finished:
        name, seed = str(cfg["name"]), as_seed((cfg.get("trainer") or {}).get("seed"))
        run_dir = Path(cfg.pop("run_dir")) if cfg.get("run_dir") else None
        why, overrides = judge(name, seed, run_dir, logged=cfg)
        if why is not None:
            skipped.append(Skipped(Path(source), name, why))
            continue
        for metric in ("ppl", "bpc"):
            valid, test = real(summary.get(f"valid_{metric}")), real(summary.get(f"test_{metric}"))
            if valid is not None and test is not None:
                code, data = plain(summary.get("code")), plain(summary.get("data"))
                out.append(Run(name, seed, metric, {metric: float(valid)},
                               {metric: float(test)}, real(summary.get("n_params")), source,
                               overrides=overrides, code=code or None, data=data or None))
                break
        else:
            no_numbers.append(source)
    note_left_out(project, unfinished, no_name, no_numbers)
    return out, skipped


def note_left_out(project: str, unfinished: dict[str, int], no_name: list[str],
                  no_numbers: list[str]) -> None:
    """One note on stderr counting the runs left out with no `Skipped` record, and why: they
    were dropped without a word (a finished run with no summary numbers looked like a seed
    never run)."""
    def some(sources: list[str]) -> str:
        return ", ".join(sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3
                                         else "")

    parts = []
    if unfinished:
        parts.append(f"{sum(unfinished.values())} not finished ({counted_names(unfinished)})")
    if no_name:
        parts.append(f"{len(no_name)} finished with no config `name` ({some(no_name)})")
    if no_numbers:
        parts.append(f"{len(no_numbers)} finished with no finite valid_/test_<ppl|bpc> in "
                     f"its summary ({some(no_numbers)})")
    if parts:
        n = sum(unfinished.values()) + len(no_name) + len(no_numbers)
        print(f"note: --wandb {project}: {n} run(s) left out: {'; '.join(parts)}",
              file=sys.stderr)


def plain(node: Any) -> Any:
    """wandb's summary mappings (SummarySubDict, at every level) as plain dicts and lists."""
    if hasattr(node, "items"):
        return {k: plain(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [plain(v) for v in node]
    return node


def _wandb_api_runs(project: str) -> list[Any]:
    """The runs of a wandb project; a missing login or an unreachable project is one line
    with wandb's own reason (its AuthenticationError also stands for a network failure)."""
    import wandb

    from sigma_moe.framework.config import first_line

    try:
        return list(wandb.Api().runs(project))
    except wandb.errors.Error as e:
        sys.exit(f"error: --wandb {project}: {first_line(e)}")


if __name__ == "__main__":  # a library without a CLI: say which script reads wandb runs
    sys.exit("error: scripts/wandb_runs.py is a library; read wandb runs with "
             "`python scripts/paper_tables.py --wandb ENTITY/PROJECT`")
