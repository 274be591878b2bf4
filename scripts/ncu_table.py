"""Hardware counters of the MoE layer's kernels, from Nsight Compute's CSV: one row a launch.

Reads what `ncu --csv --page raw` wrote (scripts/gpu_check.sh's `ncu` step profiles one
forward+backward of the fused layer, `profile_moe.py --ncu`), prints the counters that tell
a memory-bound kernel from a latency-bound one -- time, DRAM and SM throughput, L2 hit
rate, achieved occupancy, registers, and the stall reasons per issued instruction -- and
writes every counter of every launch to JSON. The scatter kernel's question (issue 4): at
70 us a slot, 2.3x its memory time, is DRAM busy (then tiles or traffic must change) or
idle while warps wait on the segment search and the serial read-product-write (then more
programs in flight, or a precomputed tile table)?

    python scripts/ncu_table.py runs/gpu_check/ncu.csv --out runs/gpu_check/ncu.json

Needs torch only for the JSON writer the benchmarks share (runs where ncu ran, or on its
CSV anywhere).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.bench_common import write_json  # noqa: E402

# (column header, ncu raw metric names: the first this ncu collected); missing prints "-"
COLUMNS = [
    ("us", ("gpu__time_duration.sum",)),
    ("DRAM %", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")),
    ("SM %", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)),
    # L2 busy: a product kernel near its peak here waits on what its tiles load from L2
    ("L2 %", ("lts__throughput.avg.pct_of_peak_sustained_elapsed",)),
    # bytes moved, read + written (the traffic each kernel's cost model predicts)
    ("DRAM MB", ("dram__bytes.sum",)),
    ("L2 MB", ("lts__t_bytes.sum",)),
    ("L2 hit %", ("lts__t_sector_hit_rate.pct",)),
    ("occup %", ("sm__warps_active.avg.pct_of_peak_sustained_active",)),
    ("regs", ("launch__registers_per_thread",)),
    ("grid", ("launch__grid_size",)),
    ("threads", ("launch__block_size",)),
]
# stall reasons, in cycles per issued instruction (WarpStateStats)
STALLS = ["long_scoreboard", "barrier", "lg_throttle", "mio_throttle", "short_scoreboard",
          "wait", "math_pipe_throttle", "not_selected", "selected"]
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "s": 1e6, "second": 1e6}
TO_MB = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "B": 1e-6, "KB": 1e-3,
         "MB": 1.0, "GB": 1e3}
# metric -> (units it is converted from, the unit it is shown in)
CONVERT = {"gpu__time_duration.sum": (TO_US, "us"), "dram__bytes.sum": (TO_MB, "MB"),
           "lts__t_bytes.sum": (TO_MB, "MB")}


def _number(text: str) -> float | int | str:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text else value


def parse(text: str) -> list[dict]:
    """ncu's raw CSV (lines of its own log interleaved) -> per launch {"id", "kernel",
    "info": the descriptive columns, "metrics": {name: value}, "units": {name: unit}};
    times in microseconds, bytes moved in MB. Metric columns are the ones named like ncu
    metrics (a "__")."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        raise ValueError("no CSV rows: was ncu run with --csv --page raw, and did it profile "
                         "anything (--profile-from-start off needs the program's "
                         "cudaProfilerStart, profile_moe.py --ncu)?")
    rows = list(csv.reader(lines))
    header = rows[0]
    if "Kernel Name" not in header or "ID" not in header:
        raise ValueError(f"not ncu's raw page (columns: {header[:6]} ...)")
    # the row of units has no launch ID (ncu writes one after the header)
    has_units = len(rows) > 1 and rows[1][header.index("ID")] == ""
    units = rows[1] if has_units else [""] * len(header)
    launches = []
    for row in rows[1 + has_units:]:
        info, metrics, unit_of = {}, {}, {}
        for name, unit, value in zip(header, units, row):
            if "__" not in name:
                info[name] = value
            elif value:
                metrics[name], unit_of[name] = _number(value), unit
        for name, (factors, to) in CONVERT.items():
            if isinstance(metrics.get(name), (int, float)) and unit_of[name] in factors:
                metrics[name], unit_of[name] = metrics[name] * factors[unit_of[name]], to
        launches.append({"id": info.get("ID"), "kernel": info.get("Kernel Name", "?"),
                         "info": info, "metrics": metrics, "units": unit_of})
    return launches


def _pick(metrics: dict, names: tuple[str, ...]):
    return next((metrics[n] for n in names if n in metrics), None)


def table(launches: list[dict]) -> str:
    def cell(v):
        return f"{v:.1f}" if isinstance(v, float) else ("-" if v is None else str(v))

    head = ["id", "kernel", *[c for c, _ in COLUMNS], *(f"st:{s}" for s in STALLS)]
    body = [[str(ln["id"]), ln["kernel"][:40],
             *(cell(_pick(ln["metrics"], names)) for _, names in COLUMNS),
             *(cell(ln["metrics"].get(STALL_METRIC.format(s))) for s in STALLS)]
            for ln in launches]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) if i == 1 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(r, widths)))
                     for r in [head, *body])


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", type=Path, help="ncu's output (--csv --page raw [--log-file])")
    p.add_argument("--out", type=Path, help="JSON of every counter of every launch")
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if not args.csv.is_file():
        sys.exit(f"error: {args.csv} does not exist (run scripts/gpu_check.sh's ncu step)")
    try:
        launches = parse(args.csv.read_text(errors="replace"))
    except ValueError as err:
        sys.exit(f"error: {args.csv}: {err}")
    print(table(launches))
    print("(stall columns: cycles per issued instruction; DRAM/SM/L2 %: of peak, elapsed)")
    if args.out:
        write_json(args.out, launches)
    return launches


if __name__ == "__main__":
    main()
