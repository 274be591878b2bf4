"""Which code trained the counted runs of a table, and which tokens they read: one line per
version under the table when they differ (scripts/paper_tables.py, scripts/mini_claims.py).
A version shared by most runs gets a count; every other one names its runs, the ones to
check."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scripts.run_results import Run


def version_lines(groups: dict[Any, list[Run]], head: Callable[[Any, list[Run]], str]
                  ) -> list[str]:
    """`head(version, runs): count` for the most common version, `head: the runs` for the
    others."""
    lines = []
    for i, (label, members) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1]))):
        n = len(members)
        lines.append(f"{head(label, members)}: " + (f"{n} run{'s' if n > 1 else ''}" if i == 0
                                                    else _named(members)))
    return lines


def _named(runs: list[Run]) -> str:
    """'a seeds 0, 1; b seed 2'."""
    seeds: dict[str, list[str]] = {}
    for run in runs:
        seeds.setdefault(run.name, []).append(str(run.seed))
    return "; ".join(f"{name} seed{'s' if len(s) > 1 else ''} {', '.join(s)}"
                     for name, s in seeds.items())


# -- which code trained them -----------------------------------------------------------------
MIXED = "mixed"
CODE_HEADING = ("Code versions (sigma_moe/framework/code_version.py; a run of other code than "
                "the current one may differ from what it trains now: retrain it with "
                "`fresh=true` if the change matters):")


def code_label(code: Any) -> str | None:
    """The code version that trained a run: its fingerprint, MIXED when a resume changed it,
    None when the run did not record it."""
    if not isinstance(code, dict) or not code.get("trained_with"):
        return None
    versions = set(code["trained_with"])
    return MIXED if len(versions) > 1 else versions.pop()


def code_versions(runs: Iterable[Run], current: str | None = None) -> list[str]:
    """Which versions of the code trained `runs`, one line each (under CODE_HEADING); []
    when the current code trained them all. The most common version gets a count, every
    other one names its runs: the ones to check."""
    from sigma_moe.framework.code_version import code_fingerprint

    current = current or code_fingerprint()
    groups: dict[str | None, list[Run]] = {}
    for run in runs:
        groups.setdefault(code_label(run.code), []).append(run)
    if set(groups) <= {current}:
        return []

    def head(label: str | None, members: list[Run]) -> str:
        if label is None:
            return "not recorded (trained before runs recorded their code)"
        if label == MIXED:
            return "several (resumed with other code; results.json `code.trained_with`)"
        gits = sorted({str(r.code.get("git")) for r in members if r.code.get("git")})
        notes = ([f"git {', '.join(gits)}"] if gits else []) + \
            (["the current code"] if label == current else [])
        return label + (f" ({'; '.join(notes)})" if notes else "")

    return version_lines(groups, head)


# -- which tokens they read ------------------------------------------------------------------
DATA_HEADING = ("Data versions (results.json `data`: runs of one dataset that read other tokens, "
                "e.g. from another SentencePiece model, are not comparable: train them on one "
                "cache):")


def data_label(data: Any) -> str | None:
    """The tokens a run read, as 12 hex digits of the sha256s it recorded (its splits and
    tokenizer); None when the run did not record them."""
    sha = data.get("sha256") if isinstance(data, dict) else None
    if not isinstance(sha, dict) or not sha or None in sha.values():
        return None
    return hashlib.sha256(json.dumps(sha, sort_keys=True).encode()).hexdigest()[:12]


def data_versions(runs: Iterable[Run]) -> list[str]:
    """One line per version of a dataset's tokens when the counted `runs` of that dataset
    read more than one (else []): the most common gets a count, the others name their runs.
    Runs from before runs recorded their data are left out (they do not name the dataset)."""
    by_dataset: dict[str, dict[str | None, list[Run]]] = {}
    for run in runs:
        if isinstance(run.data, dict):
            by_dataset.setdefault(str(run.data.get("name")), {}).setdefault(
                data_label(run.data), []).append(run)
    lines = []
    for dataset, groups in sorted(by_dataset.items()):
        if len(set(groups) - {None}) < 2:
            continue

        def head(label: str | None, members: list[Run], dataset: str = dataset) -> str:
            entry = members[0].data.get("cache_entry")
            return (f"{dataset} {label}" + (f" ({entry})" if entry else "") if label else
                    f"{dataset}, sha256 not recorded")

        lines += version_lines(groups, head)
    return lines


# -- which precision they trained in --------------------------------------------------------
PRECISION_HEADING = ("Precisions (results.json `precision`: trainer.precision=auto is bf16 on a "
                     "GPU and fp32 on a CPU with one config, and a run resumed on another "
                     "device trained in both, `bf16 then fp32`):")


def precision_label(results: Any) -> str | None:
    """The precisions a run trained in, in order; None when it did not record them."""
    legs = results.get("precision") if isinstance(results, dict) else None
    return " then ".join(map(str, legs)) if isinstance(legs, list) and legs else None


def precision_versions(runs: Iterable[Run]) -> list[str]:
    """One line per precision when the counted `runs` trained in more than one, or any in
    several (else []); runs that did not record theirs only beside those that did."""
    groups: dict[str | None, list[Run]] = {}
    for run in runs:
        groups.setdefault(precision_label(run.results), []).append(run)
    recorded = set(groups) - {None}
    if len(recorded) < 2 and not any(" then " in label for label in recorded):
        return []
    return version_lines(groups, lambda label, _: label or "not recorded")


if __name__ == "__main__":  # a library without a CLI: say which scripts print these lines
    import sys

    sys.exit("error: scripts/run_versions.py is a library; the version lines are under the "
             "tables of `python scripts/paper_tables.py` and `python scripts/mini_claims.py`")
