"""Command-line glue around Hydra: default experiment, clear one-line errors, run dirs."""
from __future__ import annotations

import difflib
import hashlib
import re
import shutil
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import OmegaConf

from sigma_moe.framework.config import (
    TOP_LEVEL,
    ConfigError,
    chosen_groups,
    did_you_mean,
    first_line,
    is_environment_error,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DEFAULT_EXP = "mini_moe"


def experiment_names() -> list[str]:
    return sorted(p.stem for p in (CONFIGS / "exp").glob("*.yaml"))


def _check_known(kind: str, name: str, names: list[str], n_close: int, listing: str) -> None:
    """An unknown `name` of `kind` is one line: the closest known names, then `listing`."""
    if name not in names:
        close = difflib.get_close_matches(name, names, n=n_close, cutoff=0.4)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(f"unknown {kind} {name!r}.{hint} {listing}")


def check_experiment(name: str) -> None:
    from hydra.plugins.config_source import ConfigSource

    names = experiment_names()
    _check_known("experiment", name, names, 3, f"See configs/exp/ ({len(names)} experiments).")
    # what a new experiment file (often a copy of another) can get wrong: Hydra would put
    # its keys under `exp:` without the header, and run it in the other's runs/<name>/
    path = CONFIGS / "exp" / f"{name}.yaml"
    data = check_yaml(path)
    try:  # Hydra's own reading of a header: `# @key value` lines before any other line
        package = ConfigSource._get_header_dict(path.read_text(encoding="utf-8")[:512])
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    if package.get("package") != "_global_":
        raise ConfigError(f"{path} must start with the line '# @package _global_' (before any "
                          f"other comment: an experiment sets keys of every group)")
    if not isinstance(data, dict) or data.get("name") != name:
        found = data.get("name") if isinstance(data, dict) else None
        raise ConfigError(f"{path} sets name: {found}; an experiment's name is its file's "
                          f"(its runs go to runs/<name>/): write name: {name}")
    for key in data:  # run.py checks the composed config too (check_top_level), naming no file
        if key not in (*TOP_LEVEL, "defaults"):
            raise ConfigError(f"{path}: unknown top-level key {key!r}"
                              f"{did_you_mean(key, TOP_LEVEL)}")
    chosen = chosen_groups(data.get("defaults"))
    for group in ("ffn", "dataset"):  # kinds with keys of their own
        if group in data and group not in chosen:
            raise ConfigError(f"{path} sets {group}.* keys but does not choose its {group}: add "
                              f"'- override /{group}: <kind>' to its defaults (else its keys "
                              f"go onto the default {group} of configs/config.yaml)")


def check_yaml(path: Path) -> Any:
    """The contents of a config file; one that is not UTF-8 YAML stops with one line saying
    where (Hydra raises the parser's traceback, or a UnicodeDecodeError naming no file)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:  # a stream: the parser's marks name the file
            return yaml.safe_load(f)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise unreadable_config(e, path) from None


def unreadable_config(e: Exception, path: Path | None = None) -> ConfigError:
    """One line for a config file that YAML or UTF-8 decoding refused: file:line:column."""
    if isinstance(e, UnicodeDecodeError):
        if path is None:  # the decoder does not know the file: find it
            path = next((p for p in sorted(CONFIGS.rglob("*.yaml")) if not _is_utf8(p)), None)
        return ConfigError(f"{path or 'a config file'} is not UTF-8 text (byte {e.start}: "
                           f"{e.object[e.start:e.start + 1]!r}): save it as UTF-8")
    mark = getattr(e, "problem_mark", None)
    where = f"{mark.name}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    what = ": ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x)
    return ConfigError(f"{where}: not valid YAML: {what or first_line(e)}")


def _is_utf8(path: Path) -> bool:
    try:
        path.read_bytes().decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


OVERRIDES = "overrides.yaml"  # in a run directory: the command-line overrides it ran with


# written %XX in run directory names, `%` first: `/` and `\` would nest directories, and
# Windows refuses the others in a file name (`dataset.source=C:\data\enwik8.zip`)
_ESCAPED = '%/\\:*?"<>|'


def dirname(overrides: str, limit: int = 120) -> str:
    """Run directory name from the overrides: one directory whatever the values, so a path
    in a value (`dataset.source=/data/wt103`) has its `/` written `%2F` (and `%` `%25`, and
    `\\ : * ? " < > |` likewise; undone by `undirname`); long ones are cut and suffixed
    with a hash (file names have a 255-byte limit)."""
    for ch in _ESCAPED:
        overrides = overrides.replace(ch, f"%{ord(ch):02X}")
    if len(overrides) <= limit:
        return overrides
    return f"{overrides[:limit - 13]}..{hashlib.sha256(overrides.encode()).hexdigest()[:11]}"


def undirname(name: str) -> str:
    """The overrides a run directory's name was written from (`dirname`, uncut)."""
    for ch in reversed(_ESCAPED):
        name = name.replace(f"%{ord(ch):02X}", ch)
    return name


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("dirname"):
        OmegaConf.register_new_resolver("dirname", dirname)


def _refuse(message: str) -> NoReturn:
    """A bad command line: one line, exit 1; under torchrun every rank parses the same argv,
    and rank 0 says it."""
    from sigma_moe.framework.distributed import main_process

    if main_process():
        print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def prepare_argv(argv: list[str]) -> None:
    """Add `+exp=mini_moe` when no experiment is named; refuse an unknown one early.

    Multirun sweeps (`-m`, `+sweep=...`) name their experiments themselves."""
    if not CONFIGS.is_dir():  # the code without its clone: `pip install .` copies no configs
        _refuse(f"no configs/ at {CONFIGS}: run.py runs from a clone of this repository, "
                f"installed with `pip install -e .` there (a plain `pip install .` leaves the "
                f"configs behind)")
    exps = [a.split("=", 1)[1] for a in argv[1:] if a.lstrip("+").startswith("exp=")]
    multirun = any(a in ("-m", "--multirun") for a in argv[1:])
    sweeps = [a.split("=", 1)[1] for a in argv[1:] if a.lstrip("+").startswith("sweep=")]
    sweep = bool(sweeps)
    inspect = any(a.startswith(("--cfg", "-c", "--info", "-h", "--help", "-p", "--package"))
                  for a in argv[1:])
    if multirun and any(a in ("--cfg", "-c") or a.startswith("--cfg=") for a in argv[1:]):
        _refuse("--cfg cannot go with -m (Hydra); without -m it shows a sweep's config, "
                "e.g. python run.py +sweep=moe --cfg hydra -p hydra.sweeper.params")
    drop_repeated(argv)
    if sweep and not multirun and not inspect:
        argv.insert(1, "--multirun")  # a sweep file only means something in multirun mode
    register_resolvers()
    try:
        for name in (n for value in exps for n in value.split(",")):
            check_experiment(name)
        for name in sweeps:
            check_sweep(name)
            if not exps:  # the sweep's own list (an experiment added to it by make_sweeps)
                for exp in sweep_experiments(name):
                    check_experiment(exp)
        if (multirun or sweep) and not inspect:  # jobs will be launched
            check_launcher(argv[1:], sweeps[-1] if sweeps else None)
    except ConfigError as e:
        _refuse(str(e))
    if not exps and not sweep and not any(
            a in ("--help", "-h", "--hydra-help") for a in argv[1:]):
        argv.append(f"+exp={DEFAULT_EXP}")
    # Hydra options that change where configs come from or what runs: leave those to Hydra
    # (-cp/-cn/-cd are among `inspect`'s "-c" options)
    own_config = any(a.startswith(("--config", "-sc", "--shell", "--experimental"))
                     or "hydra.searchpath" in a for a in argv[1:])
    if not inspect and not own_config:
        plain = [a for a in argv[1:] if not a.startswith("-")]
        try:
            if multirun or sweep:
                check_sweep_overrides(plain)
            else:
                check_overrides(plain)
        except ConfigError as e:
            _refuse(str(e))


def drop_repeated(argv: list[str]) -> None:
    """A key set twice (`trainer.steps=30 ... trainer.steps=2`: a base command and a
    change): the last counts, as in Hydra, and the earlier ones leave argv. Left in, both
    would name the run directory (sorted): `steps=30 steps=2` and `steps=2 steps=30` would
    share one with different configs. Additions and deletions (`+k=`, `~k`; `+exp=` twice)
    are left to Hydra, which refuses repeats of those."""
    def key(a: str) -> str | None:
        return a.partition("=")[0] if "=" in a and not a.startswith(("-", "+", "~")) else None

    last = {key(a): i for i, a in enumerate(argv) if i and key(a)}
    argv[:] = [a for i, a in enumerate(argv) if not (i and key(a) and last[key(a)] != i)]


def check_sweep(name: str) -> None:
    names = sorted(p.stem for p in (CONFIGS / "sweep").glob("*.yaml"))
    _check_known("sweep", name, names, 1, f"The sweeps: {', '.join(names)} (configs/sweep/)")
    check_yaml(CONFIGS / "sweep" / f"{name}.yaml")


def check_launcher(args: list[str], sweep: str | None) -> None:
    """An unknown launcher, or the Slurm one where there is no Slurm: one line, not Hydra's
    several (with its search path) or submitit's traceback."""
    chosen = [a.split("=", 1)[1] for a in args
              if a.removeprefix("override ").startswith("hydra/launcher=")]
    launcher = chosen[-1] if chosen else None
    if launcher is None and sweep is not None:
        defaults = sweep_config(sweep).get("defaults") or []
        launcher = next((d[k] for d in defaults if isinstance(d, dict) for k in d
                         if str(k).endswith("hydra/launcher")), None)
    ours = sorted(p.stem for p in (CONFIGS / "hydra" / "launcher").glob("*.yaml"))
    known = [*ours, "basic", "submitit_local", "submitit_slurm"]
    # a likely typo of one of these (Hydra's answer has its search path, in several lines);
    # any other name is left to Hydra: another installed launcher plugin (joblib, ray)
    if launcher not in (None, *known) and difflib.get_close_matches(launcher, known, n=1):
        _check_known("launcher", launcher, known, 1,
                     f"Choose hydra/launcher={', '.join(ours)} or basic (docs/cluster.md).")
    if launcher == "slurm" and shutil.which("srun") is None:
        raise ConfigError(
            "this sweep submits Slurm jobs (hydra/launcher=slurm) but srun is not on this "
            "machine: launch it on the cluster's login node, or run its jobs here with "
            "hydra/launcher=local (in parallel) or hydra/launcher=basic (in turn)")


def sweep_config(sweep: str) -> dict[str, Any]:
    """configs/sweep/<sweep>.yaml as written (its defaults list, its sweeper params); {} when
    there is no such file."""
    path = CONFIGS / "sweep" / f"{sweep}.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if path.exists() else {}


def sweep_params(sweep: str) -> dict[str, Any]:
    """What the sweep sweeps over (`hydra.sweeper.params`: +exp, trainer.seed)."""
    return ((sweep_config(sweep).get("hydra") or {}).get("sweeper") or {}).get("params") or {}


def sweep_experiments(sweep: str) -> list[str]:
    """The experiments that configs/sweep/<sweep>.yaml sweeps over."""
    return [n.strip() for n in str(sweep_params(sweep).get("+exp", "")).split(",") if n.strip()]


def check_not_eval_setting(key: str) -> None:
    """An evaluation sweep's swept key may not be an evaluation setting: all its values
    evaluate the one run trained without them, into its one eval_results.json."""
    from sigma_moe.framework.experiment import EVAL_SETTINGS, under

    if under(key, EVAL_SETTINGS):
        raise ConfigError(f"mode=eval sweeps {key}: every value would evaluate the same "
                          f"trained run into its one eval_results.json; run one value per "
                          f"command")


def check_sweep_overrides(overrides: list[str]) -> None:
    """check_overrides for a sweep: its plain overrides (no sweep syntax) against each of its
    experiments, so that a typo stops it with one line naming the experiment (Hydra's answer
    has several lines and names none). Overrides with sweep syntax are left to Hydra."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    exps: list[str] = []
    sweeps: list[str] = []
    plain: list[str] = []
    for o in overrides:
        key, _, value = o.partition("=")
        key = key.lstrip("+~")
        if key == "exp":
            exps += [n.strip() for n in value.split(",")]
        elif key == "sweep":
            sweeps.append(o)
        elif not key.startswith("hydra"):
            try:
                if not parser.parse_override(o).is_sweep_override():
                    plain.append(o)
                elif "mode=eval" in overrides:
                    check_not_eval_setting(key)
            except ConfigError:
                raise
            except Exception:  # not an override Hydra can parse: Hydra itself says why
                pass
    if not plain:
        return
    if not exps:  # the sweep file's list (+exp= on the command line replaces it)
        exps = [e for o in sweeps for e in sweep_experiments(o.partition("=")[2])]
    for name in dict.fromkeys(exps):
        try:
            check_overrides([*sweeps, f"+exp={name}", *plain])
        except ConfigError as e:
            raise ConfigError(f"{e} (in the sweep's jobs of +exp={name})") from None


def check_overrides(overrides: list[str]) -> None:
    """Compose the config once before Hydra does, to turn its several-line answer to a
    mistyped key (which advises `+key=` to add it) into one line with the likely key."""
    import yaml
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    ours = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    try:
        with initialize_config_dir(str(CONFIGS), version_base=None):
            compose("config", overrides=ours)
    except (yaml.YAMLError, UnicodeDecodeError) as e:  # a group's file (ffn/, model/, ...)
        raise unreadable_config(e) from None
    except HydraException as e:
        lines = str(e).strip().splitlines()
        first = lines[0]
        bad = re.match(r"Could not override '([\w.]+)'", first)
        if first.startswith("Ambiguous value for argument"):  # Hydra's 2nd-4th lines say so
            raise ConfigError(f"{first}: to run each of the values, add -m (a sweep); to set "
                              f"a list, write key=[a,b]") from None
        if not bad:
            if "Available options" in str(e):  # an unknown group option: name the choices
                opts = [x.strip() for x in lines if x.startswith("\t") and "=" not in x]
                first += f" (available: {', '.join(opts)})"
            raise ConfigError(first) from None
        key = bad[1]
        if key in ("exp", "sweep"):  # groups with no default: selected with a '+'
            raise ConfigError(f"write +{key}=NAME, with a '+' (the config has no default "
                              f"{key} to override)") from None
        group, _, leaf = key.rpartition(".")
        known: list[str] = []
        kind = None
        try:  # the keys next to it, for a suggestion (a second bad key: no suggestion)
            with initialize_config_dir(str(CONFIGS), version_base=None):
                cfg = compose("config", overrides=[o for o in ours
                                                   if not o.startswith(f"{key}=")])
            node = OmegaConf.select(cfg, group) if group else cfg
            known = [str(k) for k in node.keys()] if OmegaConf.is_dict(node) else []
            kind = node.get("kind") if OmegaConf.is_dict(node) and "." not in group else None
        except HydraException:
            pass
        close = difflib.get_close_matches(leaf, known, n=1, cutoff=0.6)
        hint = (f" (did you mean '{group + '.' if group else ''}{close[0]}'?)" if close else
                f" ({group}={kind} has no such key)" if kind else "")
        raise ConfigError(f"unknown config key '{key}'{hint}") from None


FAILED_JOBS: list[str] = []  # jobs of this sweep that failed (here, or reported by its launcher)


def _sweep_job() -> tuple[str, bool] | None:
    """(the job's overrides, whether it runs in the sweep's own process) for a job of a
    multirun; None for a single run. In the sweep's process (basic launcher) a failed job
    must not exit, which would end the sweep; a submitit job (Slurm, local) fails as itself."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return None
    in_process = hc.launcher._target_.endswith(".BasicLauncher")
    return " ".join(hc.overrides.task) or f"#{hc.job.num}", in_process


def removable_up_to() -> Path | None:
    """Up to where run.py removes the empty parents of a run directory that stayed empty
    (mode=params, a failed start): the cwd for a single run, the sweep directory for a job
    of a local sweep (its jobs run one after another); None (the run directory only) where
    other jobs may be creating their directories beside it at the same time."""
    from hydra.core.hydra_config import HydraConfig

    job = _sweep_job()
    if job is None:
        return Path.cwd()
    return Path(HydraConfig.get().sweep.dir) if job[1] else None


def _out_of_requeues(e: BaseException) -> bool:
    """submitit's "Job not requeued because: timed-out too many times" (its SIGUSR2 handler,
    which the trainer's checkpoint-then-signal calls), or a requeue that failed."""
    try:
        from submitit.core.utils import UncompletedJobError
    except ImportError:
        return False
    return isinstance(e, UncompletedJobError) and "not requeued" in str(e)


@contextmanager
def handle_errors():
    """Turn the errors a user can fix into one line on stderr and exit code 1 (run.py removes
    the run directory the failed run left empty). In a local sweep the job's line names it
    and the sweep goes on (one diverged run must not cost the rest); run.py exits 1 at the
    end (exit_if_jobs_failed). A submitit job exits 1 after its line (after the traceback of
    an unexpected exception), which its launcher reports (hydra_plugins/sigma_moe_launchers)."""
    from sigma_moe.framework.checkpoint import CheckpointError
    from sigma_moe.framework.data import DataError
    from sigma_moe.framework.distributed import env_rank, main_process
    from sigma_moe.framework.divergence import TrainingDiverged
    from sigma_moe.framework.registry import RegistryError
    from sigma_moe.framework.trainer import Interrupted

    try:
        yield
    except KeyboardInterrupt as e:
        # the trainer said where its checkpoint is; a terminal's Ctrl-C reaches every rank
        if not isinstance(e, Interrupted) and main_process():
            print("interrupted; rerunning the same command resumes from the last checkpoint, "
                  "if one was written", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        job = _sweep_job()
        if _out_of_requeues(e):  # submitit's, after the trainer's checkpoint: no bug
            e = ConfigError(f"{first_line(e).rstrip('.')}: the run's last checkpoint is "
                            f"kept, and relaunching the same command resumes it (more "
                            f"requeues: hydra.launcher.max_num_timeout, or a longer "
                            f"timeout_min)")
        if isinstance(e, (ConfigError, DataError, RegistryError, CheckpointError,
                          TrainingDiverged)) or is_environment_error(e):
            if job is None or not job[1]:
                # under torchrun every rank reaches the same verdict on the config: rank 0
                # says it (the others' copies came out glued to it); on the data, which
                # lives on each node, a node's first rank; a rank's own trouble, its rank
                rank = env_rank()
                if isinstance(e, DataError):
                    said = env_rank(local=True) == "0"
                else:
                    said = not (isinstance(e, (ConfigError, RegistryError, TrainingDiverged))
                                or getattr(e, "shared", False))
                if rank == "0" or said:
                    where = "" if rank == "0" else f"rank {rank}: "
                    print(f"{where}error: {e}", file=sys.stderr)
                sys.exit(1)
            report_failed_job(str(e), job[0], "the sweep goes on")
            return
        if job is None or job[1]:
            raise
        # A submitit job: Hydra would hand the exception to the launching process without its
        # traceback, and the job would end "completed" (exit 0). Its log keeps the traceback;
        # its launcher reports the line after it.
        traceback.print_exc()
        print(f"error: {type(e).__name__}: {first_line(e)} (traceback above)", file=sys.stderr)
        sys.exit(1)


def report_failed_job(message: str, job: str, detail: str) -> None:
    """One line for a failed job of a sweep; run.py exits 1 at the end, naming it."""
    print(f"error: {message} [job {job}; {detail}]", file=sys.stderr)
    FAILED_JOBS.append(job)


def exit_if_jobs_failed() -> None:
    """After a sweep: exit 1 naming the jobs that failed (each said why above)."""
    if FAILED_JOBS:
        print(f"error: {len(FAILED_JOBS)} job(s) of the sweep failed (see above): "
              f"{'; '.join(FAILED_JOBS)}", file=sys.stderr)
        sys.exit(1)
