"""Finished runs and their per-seed summary, shared by scripts/paper_tables.py and
scripts/mini_claims.py.

A run directory (anything under the given roots holding a results.json that
scripts/run_files.py finds and can read) belongs to the experiment whose `name` it records
(configs/exp/<name>.yaml); its seed is results["seed"].
It counts as a seed of that experiment only if it trained the experiment's config as the
file says now: the `config_hash` its results.json records must be one of the hashes of
`+exp=<name> trainer.seed=<seed>` (sigma_moe/framework/experiment.py `run_hashes`; composed here
with Hydra as run.py composes it, once per experiment). Otherwise it is left out, as a
`Skipped` record with why:

- its directory (`<name>/<overrides>`, as Hydra names it) shows overrides other than
  `trainer.seed`: another configuration, counted only with `all_overrides`, and then only
  for a seed no run of the experiment's own config has (a `ffn.k=2` run never replaces
  seed 0 of the real one);
- otherwise (a stale run, made before configs/exp/<name>.yaml changed, or one in a
  directory chosen by hand with other settings): never counted.

A results.json with no `config_hash` (made before runs recorded it) cannot be checked: it
counts when its directory shows no other overrides, with a warning on stderr. wandb runs
(scripts/wandb_runs.py) count when finished, read from the config/summary sigma_moe/tasks/lm_run.py
logs; wandb has no `config_hash`, so their logged config itself is compared with the
experiment's.

The hash says which config a run trained, not which code: scripts/run_versions.py lists, under a
table, the versions of the code (sigma_moe/framework/code_version.py) that trained its counted runs
when they are not all the current one; `data_versions` lists the versions of a dataset's
tokens (the sha256s a run records) when its counted runs read more than one.
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python scripts/run_results.py` says which script to run
from scripts.run_files import (  # noqa: E402
    NOT_JSON,
    UNREADABLE,
    as_seed,
    read_result,
    read_yaml,
    real,
    results_files,
)

SEED_KEYS = {"trainer.seed"}


@dataclass
class Run:
    name: str
    seed: int | None
    metric: str
    valid: dict[str, float]
    test: dict[str, float]
    n_params: int | None
    source: str
    mtime: float = 0.0
    results: dict[str, Any] = field(default_factory=dict)  # the results.json of a local run
    overrides: str = ""  # other than the seed, when counted by `all_overrides` ('': own config)
    code: dict[str, Any] | None = None  # which code trained it (results.json / summary `code`)
    data: dict[str, Any] | None = None  # which tokens it read (results.json / summary `data`)


OVERRIDDEN = "†"  # marks a cell that counts runs of other settings (`all_overrides`)
STALE = "config differs from"  # the start of a Skipped's why for a run of another config


@dataclass(frozen=True)
class Skipped:
    """A results.json (or wandb run) left out of the tables, and why. `name` is None when
    the file is unreadable (`path` is then the file's, else its run directory's)."""
    path: Path
    name: str | None
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"

    @property
    def run_dir(self) -> Path:
        return self.path.parent if self.name is None else self.path


def run_overrides(run_dir: Path, name: str) -> str | None:
    """The overrides of `.../<name>/<overrides>` ('' for `.../<name>`), None if the
    directory was chosen by hand. A `fresh=true` sibling (`-2`, `-3`) has the same ones: the
    suffix goes when the directory it was made beside exists (`trainer.lr=1e-3` keeps it).
    Where the run recorded them (overrides.yaml), from there: a name over 120 characters is
    cut to a hash."""
    from sigma_moe.framework.cli import dirname, undirname

    pat = re.compile(rf"^{re.escape(name)}(-\d+)?$")
    if pat.match(run_dir.name):
        return ""
    if pat.match(run_dir.parent.name):
        first = re.sub(r"-\d+$", "", run_dir.name)
        recorded = recorded_overrides(run_dir)  # (a record of this directory's name only)
        if recorded is not None and dirname(recorded) in (first, run_dir.name):
            return recorded
        return undirname(first if (run_dir.parent / first).is_dir() else run_dir.name)
    return None


def recorded_overrides(run_dir: Path) -> str | None:
    """The uncut overrides of its directory's name that a run recorded
    (sigma_moe/framework/run_dirs.py `write_overrides`); None for a run from before it did, or a
    record that cannot be read (not UTF-8: a UnicodeDecodeError is a ValueError)."""
    from sigma_moe.framework.cli import OVERRIDES

    record = read_yaml(run_dir / OVERRIDES)
    dirname = record.get("dirname") if isinstance(record, dict) else None
    return dirname if isinstance(dirname, str) else None


def split_overrides(overrides: str | None) -> list[str]:
    """`a=1,b=[2,3]` -> ['a=1', 'b=[2,3]'] (a comma inside a value does not split)."""
    return re.split(r",(?=[\w.+~/@-]+=)", overrides) if overrides else []


def other_overrides(overrides: str | None) -> list[str]:
    return [it for it in split_overrides(overrides)
            if it.split("=", 1)[0].lstrip("+~") not in SEED_KEYS]


# -- the experiments' configs -----------------------------------------------------------------
@contextmanager
def _config_tree(exp_dir: Path) -> Iterator[Path]:
    """An absolute config directory whose `exp` group is `exp_dir`: its own tree when it is one
    (`<configs>/exp`), else a copy of configs/ with `exp` pointing at it."""
    if exp_dir.name == "exp" and (exp_dir.parent / "config.yaml").is_file():
        yield exp_dir.parent.resolve()  # Hydra wants an absolute path
        return
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "configs"
        shutil.copytree(ROOT / "configs", tree,
                        ignore=lambda d, _: ["exp"] if Path(d) == ROOT / "configs" else [])
        (tree / "exp").symlink_to(exp_dir.resolve(), target_is_directory=True)
        yield tree


def compose_experiments(exp_dir: Path, names: Iterable[str]) -> dict[str, dict[str, Any] | str]:
    """name -> its config as `python run.py +exp=<name>` composes it (or why it does not
    compose), for each name with a file in `exp_dir`; one Hydra composition per name."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from sigma_moe.framework.cli import register_resolvers
    from sigma_moe.framework.config import first_line

    todo = sorted(n for n in set(names) if (exp_dir / f"{n}.yaml").is_file())
    if not todo:
        return {}
    register_resolvers()
    out: dict[str, dict[str, Any] | str] = {}
    with _config_tree(exp_dir) as tree, initialize_config_dir(str(tree), version_base=None):
        for name in todo:
            try:
                out[name] = OmegaConf.to_container(compose("config", [f"+exp={name}"]),
                                                   resolve=True)
            except Exception as e:  # a broken exp file: its runs are listed with why
                out[name] = first_line(e)
    return out


def _whole_floats_as_ints(node: Any) -> Any:
    """wandb keeps a config as JSON and may hand 1.0 back as 1."""
    if isinstance(node, dict):
        return {k: _whole_floats_as_ints(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_whole_floats_as_ints(v) for v in node]
    return int(node) if isinstance(node, float) and node.is_integer() else node


def _shown(path: Path) -> Path:
    """configs/exp/... rather than the checkout's absolute path."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


@dataclass
class Judge:
    """Whether a run counts as a seed of its experiment (module docstring)."""
    exp_dir: Path
    configs: dict[str, dict[str, Any] | str]
    all_overrides: bool = False

    def same_config(self, name: str, seed: Any, run_hash: str | None = None,
                    logged: dict[str, Any] | None = None) -> tuple[bool | None, str]:
        """(whether the run trained the experiment's config, None when it cannot be told;
        why not). `run_hash`: its results.json's; `logged`: its config as wandb logged it."""
        from sigma_moe.framework.experiment import config_hash, run_hashes

        where = _shown(self.exp_dir / f"{name}.yaml")
        cfg = self.configs.get(name)
        if cfg is None:
            return False, f"no {where}"
        if isinstance(cfg, str):
            return False, f"{where} does not compose ({cfg})"
        # the seed is in the hash: set it here rather than compose once per seed (~65 ms)
        cfg = {**cfg, "trainer": {**cfg.get("trainer", {}), "seed": seed}}
        if logged is not None:
            same = config_hash(_whole_floats_as_ints(logged)) == \
                config_hash(_whole_floats_as_ints(cfg))
        elif run_hash:
            same = run_hash in run_hashes(cfg)
        else:
            return None, ""
        return same, f"{STALE} {where} (stale, or made with other settings)"

    def __call__(self, name: str, seed: Any, run_dir: Path | None, **config: Any
                 ) -> tuple[str | None, str]:
        """(why the run is not counted, None if it is; its overrides other than the seed,
        comma-separated, '' when it trained the experiment's own config). `config`:
        same_config's run_hash or logged."""
        if seed is None:  # a wandb run that logged none (a local one is unreadable: run_files)
            return "no seed recorded (trainer.seed): which seed it trained cannot be told", ""
        extra = other_overrides(run_overrides(run_dir, name) if run_dir is not None else None)
        same, why = self.same_config(name, seed, **config)
        if same is None:  # no hash: trust the directory's name, as before runs recorded it
            same = not extra
        if same:
            return None, ""
        if extra:
            return (None if self.all_overrides else
                    f"{name} with overrides {','.join(extra)} (--all-overrides counts it)"
                    ), ",".join(extra)
        return why, ""


def find_runs(roots: list[Path], exp_dir: Path, all_overrides: bool = False
              ) -> tuple[list[Run], list[Skipped]]:
    """Every finished run under `roots` that counts for its experiment in `exp_dir`; also
    the ones left out, with why. An unreadable file, and runs that record no config_hash,
    also get a warning on stderr."""
    found, skipped = [], []
    for path in results_files(roots):
        res = read_result(path)
        if isinstance(res, str):
            skipped.append(Skipped(path, None, f"{UNREADABLE} ({res})"))
            print(f"warning: {skipped[-1]}", file=sys.stderr)
        else:
            found.append((path, res))
    judge = Judge(exp_dir, compose_experiments(exp_dir, (str(r.get("name")) for _, r in found)),
                  all_overrides)
    runs, unchecked, unknown = [], [], {}
    for path, res in found:
        name, seed = str(res.get("name")), as_seed(res.get("seed"))
        why, overrides = judge(name, seed, path.parent, run_hash=res.get("config_hash"))
        if why is not None:
            skipped.append(Skipped(path.parent, name, why))
            if judge.configs.get(name) is None:  # in no table's notes: said below
                unknown[name] = unknown.get(name, 0) + 1
            continue
        unchecked += [path] if not res.get("config_hash") else []
        runs.append(Run(name, seed, res["metric"], res["valid"], res["test"],
                        real(res.get("n_params")), str(path.parent), path.stat().st_mtime,
                        res, overrides, res.get("code"), res.get("data")))
    if unknown:
        print(f"warning: {sum(unknown.values())} run(s) of experiments with no file in "
              f"{_shown(exp_dir)} are in no table: {counted_names(unknown)}", file=sys.stderr)
    if unchecked:
        print(f"warning: {len(unchecked)} counted run(s) record no config_hash, so their config "
              f"is not checked against {_shown(exp_dir)} (e.g. {unchecked[0]})", file=sys.stderr)
    return runs, skipped


def counted_names(counts: dict[str, int], shown: int = 5) -> str:
    """'a (2), b (1) and 3 more': the first `shown` names with their counts."""
    names = [f"{n} ({k})" for n, k in sorted(counts.items())]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def by_experiment(runs: list[Run]) -> dict[str, list[Run]]:
    """name -> one run per seed (`_chosen`), sorted by seed."""
    out: dict[str, list[Run]] = {}
    for (name, _), run in sorted(_chosen(runs).items(),
                                 key=lambda kv: (kv[0][0], str(kv[0][1]))):
        out.setdefault(name, []).append(run)
    return out


def _chosen(runs: list[Run]) -> dict[tuple[str, Any], Run]:
    """(name, seed) -> the run that counts when a seed ran more than once: one of the
    experiment's own config before one counted by `all_overrides`, then the newest
    results.json (it records no finish time; a wandb run has none: local before wandb)."""
    best: dict[tuple[str, Any], Run] = {}
    for run in runs:
        key = (run.name, run.seed)
        if key not in best or (not run.overrides, run.mtime) > (not best[key].overrides,
                                                                 best[key].mtime):
            best[key] = run
    return best


def superseded(runs: list[Run]) -> list[Skipped]:
    """The runs by_experiment leaves out for another run of their seed, each naming the one
    that counts and why (dropped without a word, a rerun's older result just vanished)."""
    best, out = _chosen(runs), []
    for run in runs:
        kept = best[(run.name, run.seed)]
        if kept is run:
            continue
        if run.overrides and not kept.overrides:
            why = "the experiment's own config"
        elif run.source.startswith("wandb:") and not kept.source.startswith("wandb:"):
            why = "a local run"
        else:
            why = "its results.json is newer" if kept.mtime > run.mtime else "found first"
        out.append(Skipped(Path(run.source), run.name,
                           f"seed {run.seed} also ran in {kept.source}, which counts ({why})"))
    return out


def print_out(text: str) -> None:
    """Writes a report to stdout; one that cannot take it (`> tables.md` on a full disk) is
    one line, not a traceback (nor a second one when Python flushes stdout at exit). What
    the stream cannot encode is escaped (a directory name that is not UTF-8 reaches us as
    surrogates, which a strict UTF-8 stdout refused with a UnicodeEncodeError)."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    text = text.encode(encoding, "backslashreplace").decode(encoding)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as e:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # drop what is left
        sys.exit(f"error: cannot write the output: {e.strerror or e}")


OVERRIDDEN_HEADING = (f"Counted with --all-overrides ({OVERRIDDEN}: the cell's mean holds runs "
                      f"of other settings than its experiment's):")


def markdown_notes(missing_heading: str, missing: list[str], not_counted: list[str],
                   code: list[str], data: list[str] = (), overridden: list[str] = (),
                   precision: list[str] = ()) -> list[str]:
    """The lists under a Markdown table: the commands of its missing runs, the runs not
    counted (why), those counted of other settings, the code, data and precision versions
    of the counted ones; each only when it has lines."""
    # run_versions imports this module
    from scripts.run_versions import CODE_HEADING, DATA_HEADING, PRECISION_HEADING

    lines = []
    for heading, items in ((missing_heading, [f"`{cmd}`" for cmd in missing]),
                           ("Not counted:", not_counted), (OVERRIDDEN_HEADING, overridden),
                           (CODE_HEADING, code), (DATA_HEADING, data),
                           (PRECISION_HEADING, precision)):
        if items:
            lines += ["", heading, *[f"- {item}" for item in items]]
    return lines


# -- seeds of one cell -----------------------------------------------------------------------
def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1); no std for a single seed."""
    if not values:
        raise ValueError("mean_std of no values")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def fmt_metric(x: float, metric: str, sign: bool = False) -> str:
    """Perplexity with 2 decimals, as the paper; bpc with 3, where the paper prints 2 (its
    Enwik8 cells differ by hundredths: 1.07, 1.08, 1.09)."""
    return f"{x:{'+' if sign else ''}.{3 if metric == 'bpc' else 2}f}"


def ours_text(values: list[float], metric: str, pm: str = " ± ",
              overridden: bool = False) -> str:
    """'mean ± std (n=k)' of the seeds of one cell (no std for one seed; always the n, so
    that a partial sweep shows), marked when it counts runs of other settings."""
    mean, std = mean_std(values)
    text = fmt_metric(mean, metric) + ("" if std is None else pm + fmt_metric(std, metric))
    return text + f" (n={len(values)})" + (OVERRIDDEN if overridden else "")


def overridden_runs(runs: Iterable[Run]) -> list[str]:
    """The counted runs of other settings than their experiment's (`all_overrides`), a line
    each, for the list under the table whose cells they mark."""
    return [f"{r.source}: {r.name} seed {r.seed} with {r.overrides}" for r in runs
            if r.overrides]


# -- what is missing --------------------------------------------------------------------------
def sweep_seeds(sweep: str) -> list[int]:
    """The seeds configs/sweep/<sweep>.yaml trains each experiment with."""
    from sigma_moe.framework.cli import sweep_params

    return [int(s) for s in str(sweep_params(sweep)["trainer.seed"]).split(",")]


def missing_commands(sweep: str, found: dict[str, list[Any]],
                     skipped: Iterable[Skipped] = ()) -> list[str]:
    """The commands that train what `found` (experiment -> the seeds it has) lacks of the
    sweep's seeds, in the form docs/cluster.md launches a table with: one command per set of
    missing seeds, the sweep's own seeds left to the sweep file. A seed whose directory in
    the sweep's holds a results.json run.py will not train over (`skipped`: `fresh_in_sweep`)
    gets `fresh=true` (a new sibling directory); only those: an unfinished run must resume,
    not start over beside itself. (Checkpoints of another config without a results.json are
    not seen here: the trainer asks for fresh=true at that job.)"""
    every = sweep_seeds(sweep)
    needs_fresh = fresh_in_sweep(sweep, skipped)
    groups: dict[tuple[tuple[int, ...], bool], list[str]] = {}
    for name, seeds in found.items():
        lacking = [s for s in every if s not in seeds]
        for fresh in (False, True):
            if part := tuple(s for s in lacking if ((name, s) in needs_fresh) == fresh):
                groups.setdefault((part, fresh), []).append(name)
    return [f"python run.py -m +sweep={sweep} +exp={','.join(names)}"
            + ("" if list(part) == every else f" trainer.seed={','.join(map(str, part))}")
            + (" fresh=true" if fresh else "")
            for (part, fresh), names in groups.items()]


def fresh_in_sweep(sweep: str, skipped: Iterable[Skipped]) -> set[tuple[str, int]]:
    """(experiment, seed) whose directory in the sweep's own (runs/sweeps/<sweep>/<experiment>/
    trainer.seed=<seed>, where relaunching it trains) holds a results.json that run.py does
    not train over without fresh=true: a finished run of another config (it asks for
    fresh=true), or an unreadable file (one whose config_hash matches is "already finished",
    whatever else it lacks: without fresh=true the suggested command did nothing). Not a file
    that is not JSON: run.py reads it as unfinished and resumes from the run's checkpoints
    (fresh=true would retrain beside them)."""
    out = set()
    for s in skipped:
        path = s.run_dir.resolve()  # `--runs .` inside the sweep's directory
        if s.name is None:  # an unreadable file: no name but its directory's
            if s.why.startswith(f"{UNREADABLE} ({NOT_JSON}"):  # run.py resumes over it
                continue
            name = path.parent.name
        elif s.why.startswith(STALE):
            name = s.name
        else:
            continue
        seed = re.fullmatch(r"trainer\.seed=(\d+)", path.name)
        if seed and path.parent.name == name and path.parent.parent.name == sweep:
            out.add((name, int(seed[1])))
    return out


def skipped_of(skipped: Iterable[Skipped], names: set[str]) -> list[Skipped]:
    """The skipped runs of these experiments: by the name a run records, or for an unreadable
    results.json (no name to read) by a directory on its path named after one, as Hydra and
    fresh=true name them (`<name>/<overrides>`, `<name>-2`); listed under their table, not
    on stderr alone."""
    return [s for s in skipped if s.name in names or s.name is None and names & {
        re.sub(r"-\d+$", "", part) for part in s.run_dir.absolute().parts}]


if __name__ == "__main__":  # a library without a CLI: say which scripts read the runs
    sys.exit("error: scripts/run_results.py is a library; print the results with "
             "`python scripts/paper_tables.py` or `python scripts/mini_claims.py`")
