"""Every config the Triton autotuners timed, per kernel and key, from Triton's own record.

The CVMM kernels (paper Eq. `cvmm`) autotune with `cache_results`
(sigma_moe/kernels/triton_tuning.py): Triton writes each key's timings of every config it
tried to `<fn>.autotune.json` in its cache folder, whichever process tuned it. This reads
them all back and prints, per key, the configs from fastest to slowest: graph-replay median
(us), ratio to the fastest, and the operand traffic of the config's tile relative to the
key's least,

    operand bytes per FLOP  ~  1 / BLOCK_M + 1 / BLOCK_N      (dims clamped to the problem's)

which is what a tile's A and W loads cost per product: each tile reads a BLOCK_M-row slab
of A and a BLOCK_N-column slab of W over the whole reduction. Where times follow that
column across tiles (and not the FLOPs, the same for all), the kernel is bound by what
its loads move from L2 (benchmarks/gpu_h200.md item 13). The scatter kernels also
read-modify-write their output tile, which the column leaves out.

    python scripts/autotune_table.py --out runs/gpu_check/autotune.json   # Triton's cache
    python scripts/autotune_table.py --cache-dir DIR --min-us 0            # every key

torch + triton only (scripts/gpu_check.sh runs it after its steps).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.bench_common import exit_without_triton  # noqa: E402

exit_without_triton(__name__, __file__)  # before Triton is imported

from scripts.bench_common import write_json  # noqa: E402
from sigma_moe.kernels.triton_launch import TUNED  # noqa: E402

TILE = ("BLOCK_M", "BLOCK_N", "BLOCK_K")


def default_cache_dir() -> Path:
    """Where this Triton keeps its cache (TRITON_CACHE_DIR, else ~/.triton/cache)."""
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):  # a Triton before knobs
        return Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))


def _operand_cost(config: dict, key: dict) -> float:
    """1/BLOCK_M + 1/BLOCK_N, each block clamped to its dimension where the key has it (a
    256-wide tile of a 128-wide product reuses nothing more than a 128-wide one). A scatter
    program that walks N_TILES column tiles loads its A rows once for all of them."""
    kw = config["kwargs"]
    m = min(kw["BLOCK_M"], key.get("M", math.inf))
    n = min(kw["BLOCK_N"] * kw.get("N_TILES", 1), key.get("N", math.inf))
    return 1 / m + 1 / n


def read_record(path: Path) -> dict:
    """One `<fn>.autotune.json` -> {"kernel", "key": {name: value}, "dtypes", "file",
    "configs": fastest first, each Triton's config fields plus "us" (median, 20th, 80th
    percentile), "x_best" and "operand_bytes_x"}. A config that failed (Triton times it as
    infinite: out of resources) keeps x_best = inf."""
    raw = json.loads(path.read_text())
    kernel = path.name.removesuffix(".autotune.json")
    # the key names (their values come first in Triton's key, then one dtype per tensor)
    names = TUNED[kernel].key if kernel in TUNED else ()
    values = list(raw["key"])
    key = dict(zip(names, values))
    configs = [{**cfg, "us": [t * 1e3 for t in timing]} for cfg, timing in raw["configs_timings"]]
    configs.sort(key=lambda c: c["us"][0])
    best = configs[0]["us"][0] if configs else math.nan
    costs = [_operand_cost(c, key) for c in configs if set(TILE[:2]) <= set(c["kwargs"])]
    least = min(costs, default=math.nan)
    for c in configs:
        c["x_best"] = c["us"][0] / best if best > 0 else math.nan
        if set(TILE[:2]) <= set(c["kwargs"]):
            c["operand_bytes_x"] = _operand_cost(c, key) / least
    return {"kernel": kernel, "key": key, "dtypes": values[len(names):] if names else [],
            "file": str(path), "configs": configs}


def _tile(cfg: dict) -> tuple[str, str]:
    kw = cfg["kwargs"]
    tile = "x".join(str(kw[k]) for k in TILE if k in kw)
    rest = " ".join(f"{k}={v}" for k, v in kw.items() if k not in TILE)
    return tile, rest


def table(records: list[dict], min_us: float) -> str:
    """Keys whose fastest config took at least min_us, slowest kernels first."""
    shown = [r for r in records if r["configs"] and r["configs"][0]["us"][0] >= min_us]
    shown.sort(key=lambda r: -r["configs"][0]["us"][0])
    lines = []
    for r in shown:
        key = " ".join(f"{k}={v}" for k, v in r["key"].items()) or "(unnamed key)"
        dtypes = ",".join(sorted(set(r["dtypes"]))).replace("torch.", "")
        lines.append(f"{r['kernel']}  {key}  [{dtypes}]")
        lines.append(f"  {'tile MxNxK':14} {'warps':>5} {'stages':>6} {'us':>9} {'x best':>7} "
                     f"{'operand bytes x':>15}  other")
        for c in r["configs"]:
            tile, rest = _tile(c)
            us = c["us"][0]
            ops = c.get("operand_bytes_x")
            lines.append(f"  {tile:14} {c.get('num_warps', '-')!s:>5} "
                         f"{c.get('num_stages', '-')!s:>6} "
                         f"{'failed' if math.isinf(us) else f'{us:.1f}':>9} "
                         f"{'-' if math.isinf(us) else format(c['x_best'], '.2f'):>7} "
                         f"{'-' if ops is None else format(ops, '.2f'):>15}  {rest}".rstrip())
    if left_out := len(records) - len(shown):
        lines.append(f"({left_out} more key{'s' * (left_out > 1)}, whose fastest config took "
                     f"under {min_us:g} us: in the JSON only)")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", type=Path,
                   help="Triton's cache folder (default: this Triton's, TRITON_CACHE_DIR)")
    p.add_argument("--min-us", type=float, default=10.0,
                   help="print only keys whose fastest config took at least this (default "
                        "10: leaves out the tests' small shapes); the JSON has all")
    p.add_argument("--out", type=Path, help="JSON of every key's configs and timings")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    folder = args.cache_dir or default_cache_dir()
    paths = sorted(folder.rglob("*.autotune.json")) if folder.is_dir() else []
    if not paths:
        sys.exit(f"error: no *.autotune.json under {folder}: nothing was autotuned with "
                 "cache_results there (run a benchmark on a GPU first)")
    records = [read_record(p) for p in paths]
    print(table(records, args.min_us))
    if args.out:
        write_json(args.out, records)
    return records


if __name__ == "__main__":
    main()
