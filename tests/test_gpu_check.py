"""scripts/gpu_check.sh (what a short GPU lease runs, where a typo costs the lease), driven
with stand-in python and ncu executables, and scripts/ncu_table.py, which tables its
Nsight Compute step."""
import json
import re
from pathlib import Path

import pytest
import torch

NCU_CSV = '''==PROF== Connected to process 4242 (/usr/bin/python3)
==PROF== Profiling "scatter_mm_kernel" - 0: 0%....50%....100% - 38 passes
"ID","Process ID","Kernel Name","Block Size","Grid Size","gpu__time_duration.sum",\
"dram__throughput.avg.pct_of_peak_sustained_elapsed","launch__registers_per_thread",\
"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio","dram__bytes.sum",\
"lts__throughput.avg.pct_of_peak_sustained_elapsed"
"","","","","","nsecond","%","register/thread","ratio","byte","%"
"0","4242","scatter_mm_kernel","(256, 1, 1)","(2104, 1, 1)","70,464","41.87","128","12.5",\
"134,217,728","63.5"
"1","4242","topk_kernel","(128, 1, 1)","(256, 1, 1)","3,072","",40,"1.25","2,097,152",""
==PROF== Disconnected from process 4242
'''


def test_ncu_table_reads_the_raw_csv_among_ncu_log_lines(tmp_path, capsys):
    """scripts/ncu_table.py (gpu_check.sh's ncu step): one row a launch, ncu's own log lines
    skipped, thousands separators read, nanoseconds to microseconds and bytes to MB, a
    counter this ncu did not collect shown as "-", every counter in the JSON; a log with no
    CSV says why."""
    from scripts import ncu_table

    path = tmp_path / "ncu.csv"
    path.write_text(NCU_CSV)
    launches = ncu_table.main([str(path), "--out", str(tmp_path / "ncu.json")])
    scatter, topk = launches
    assert scatter["kernel"] == "scatter_mm_kernel"
    assert scatter["units"]["gpu__time_duration.sum"] == "us"
    assert scatter["metrics"]["gpu__time_duration.sum"] == pytest.approx(70.464)
    assert scatter["metrics"]["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == 41.87
    assert "dram__throughput.avg.pct_of_peak_sustained_elapsed" not in topk["metrics"]
    assert scatter["info"]["Block Size"] == "(256, 1, 1)"
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["id", "kernel", "us", "DRAM"]
    assert "DRAM MB" in lines[0] and "L2 MB" in lines[0] and "L2 %" in lines[0]
    # no SM counter or L2 bytes collected: "-"; counts stay integers
    assert lines[1].split()[:10] == ["0", "scatter_mm_kernel", "70.5", "41.9", "-", "63.5",
                                     "134.2", "-", "-", "-"]
    assert lines[1].split()[10] == "128"
    assert lines[2].split()[:4] == ["1", "topk_kernel", "3.1", "-"]
    assert scatter["units"]["dram__bytes.sum"] == "MB"
    assert json.loads((tmp_path / "ncu.json").read_text())[1]["metrics"][
        "launch__registers_per_thread"] == 40
    no_units = "\n".join(ln for ln in NCU_CSV.splitlines() if not ln.startswith('"",'))
    assert len(ncu_table.parse(no_units)) == 2  # a units row is not taken for granted
    path.write_text("==PROF== No kernels were profiled.\n")
    with pytest.raises(SystemExit, match="no CSV rows: was ncu run with --csv --page raw"):
        ncu_table.main([str(path)])


def _gpu_check(tmp_path, out="out", returncode=0, **env):
    """Run scripts/gpu_check.sh with a stand-in python (records its arguments, writes an
    empty JSON where --out says; FAIL=script exits 1 for that script, SLEEP=script sleeps
    10 s; exits 0 for the script's CUDA probe, as on a CUDA machine) and a stand-in ncu
    (records, then runs the program it wraps). -> (the calls as argument lists, the log's
    (step, exit) pairs, the log's text)."""
    import shlex
    import subprocess

    log = tmp_path / "calls.log"
    py = tmp_path / "python"
    py.write_text(f"""#!/bin/bash
echo "$*" >> {log}
[[ $1 == *"${{SLEEP:-none}}"* ]] && sleep 10
[[ $1 == *"${{FAIL:-none}}"* ]] && exit 1
while [[ $# -gt 0 ]]; do [[ $1 == --out ]] && echo '{{}}' > "$2"; shift; done
exit 0
""")
    ncu = tmp_path / "ncu"
    ncu.write_text(f'#!/bin/bash\necho "ncu $*" >> {log}\n'
                   'while [[ $# -gt 0 && "$1" != "$PYTHON" ]]; do shift; done\nexec "$@"\n')
    for f in (py, ncu):
        f.chmod(0o755)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(["bash", "scripts/gpu_check.sh", str(tmp_path / out)], cwd=root,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin", "PYTHON": str(py), **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == returncode, done.stderr + done.stdout
    if returncode:
        return done.stdout
    text = (tmp_path / out / "gpu_check.log").read_text()
    calls = [shlex.split(line) for line in log.read_text().splitlines()]
    return calls, re.findall(r"=== (\w+): (exit \d+|skipped)", text), text


def test_gpu_check_runs_only_commands_its_scripts_accept(tmp_path, monkeypatch):
    """scripts/gpu_check.sh (what a short GPU lease runs, where a typo costs the lease):
    every step runs, in order, and every script call parses with that script's own argument
    parser (as on a CUDA machine)."""
    pytest.importorskip("triton")  # the scripts import it (a GPU machine has it)
    import importlib

    calls, steps, _ = _gpu_check(
        tmp_path, STEPS="env moe profile products tests relshift train ncu sweep sweeps")
    assert [s for s, _ in steps] == ["env", "moe", "profile", "products", "tests", "relshift",
                                     "train", "ncu", "sweep", "sweeps"]
    scripts = {}
    for call in calls:
        if call[0].startswith("scripts/"):
            scripts.setdefault(Path(call[0]).stem, []).append(call[1:])
    assert sorted(scripts) == ["autotune_table", "bench_moe", "bench_products",
                               "bench_relshift", "bench_train", "ncu_table", "profile_moe"]
    assert calls[-1][0] == "scripts/autotune_table.py"  # after every step
    assert ["-m", "pytest"] == next(c for c in calls if c[0] == "-m")[:2]
    ncu_call = next(c for c in calls if c[0] == "ncu")
    assert {"--profile-from-start", "--csv"} <= set(ncu_call)
    assert scripts["profile_moe"][-1][-1] == "--ncu"
    pytest_call = next(c for c in calls if c[0] == "-m")
    assert " ".join(pytest_call).endswith("not spills")
    assert pytest_call[pytest_call.index("-n") + 1] == "4"  # the stand-in "has" xdist
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on the GPU machine
    for name, arg_lists in scripts.items():
        module = importlib.import_module(f"scripts.{name}")
        for args in arg_lists:
            device = ["--device", "cuda"] if name in ("bench_moe", "bench_train") else []
            module.parse_args([*args, *device])  # argparse's SystemExit fails the test


def test_gpu_check_keeps_going_past_a_failing_or_cut_step(tmp_path):
    """A step that fails, or that its own limit (MOE_LIMIT) cuts short, leaves the steps
    after it their run."""
    _, steps, _ = _gpu_check(tmp_path, STEPS="moe profile tests", FAIL="bench_moe")
    assert steps == [("moe", "exit 1"), ("profile", "exit 0"), ("tests", "exit 0")]
    _, steps, text = _gpu_check(tmp_path, "cut", STEPS="moe profile", SLEEP="bench_moe",
                                MOE_LIMIT="1")
    assert steps == [("moe", "exit 124"), ("profile", "exit 0")]
    assert "=== moe (limit 1s)" in text


def test_gpu_check_packs_its_results_and_keeps_to_its_budget(tmp_path):
    """PACK=1 (a lease that returns few files): the log and one archive of every step's
    results. BUDGET: a step runs at most as long as the budget has left (the moe step here:
    killed after ~5 s, not its own 150), and the steps with too little left are skipped,
    said so in the log."""
    import tarfile
    import time

    t0 = time.monotonic()
    calls, steps, text = _gpu_check(tmp_path, STEPS="moe profile products train", PACK="1",
                                    BUDGET="6", MIN_STEP="1", GRACE="1", SLEEP="bench_moe")
    # (bounds, not exact seconds: the tests run two at a time on a 2-core machine, so the
    # script's own start may take a second of the budget)
    assert time.monotonic() - t0 < 20
    assert steps == [("moe", "exit 124"), ("profile", "skipped"), ("products", "skipped"),
                     ("train", "skipped")]
    limit = re.search(r"=== moe \(limit (\d+)s\)", text)
    assert limit and 1 <= int(limit[1]) <= 5  # BUDGET - GRACE at most
    calls, steps, _ = _gpu_check(tmp_path, "packed", STEPS="moe profile products train",
                                 PACK="1")
    assert [e for _, e in steps] == ["exit 0"] * 4
    out = tmp_path / "packed"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.log", "gpu_check.tar.gz"]
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"gpu_check.log", "moe.json", "profile.json", "products.json", "train.json",
            "autotune.json"} <= names
    said = _gpu_check(tmp_path, "bad", returncode=2, BUDGET="540s")
    assert said.strip() == "error: BUDGET=540s: a whole number of seconds"


def test_gpu_check_help_prints_its_header_and_runs_nothing(tmp_path):
    """--help prints the header (steps, variables) and runs no step; any other option, or a
    second argument, is an error: on a GPU machine either would start the whole check."""
    import subprocess

    def gpu_check(*args):
        return subprocess.run(["bash", "scripts/gpu_check.sh", *args], text=True,
                              capture_output=True, cwd=Path(__file__).resolve().parents[1],
                              env={"PATH": "/usr/bin:/bin", "PYTHON": "false",
                                   "OUT": str(tmp_path / "out")})

    shown = gpu_check("--help")
    assert shown.returncode == 0 and shown.stdout.startswith("Issue 4's GPU checks")
    assert "PACK=1 BUDGET=560" in shown.stdout and "set -uo" not in shown.stdout
    assert not (tmp_path / "out").exists()
    for args, said in ((["-x"], "error: unknown option -x"),
                       (["a", "b"], "error: one argument, the output folder")):
        done = gpu_check(*args)
        assert done.returncode == 2 and done.stdout.startswith(said)
    assert not (tmp_path / "out").exists() and not Path("a").exists()


def test_gpu_check_refuses_without_cuda_unless_told(tmp_path):
    """Without a CUDA device (this python's torch, CUDA_VISIBLE_DEVICES empty) the check
    refuses in one line before it runs or creates anything: on a CPU every step would run
    for minutes and tell nothing. GPU_CHECK_ALLOW_CPU=1 runs it anyway, and its env step
    says "no CUDA device" where torch.cuda.get_device_name would raise. A python that
    cannot answer (no torch) is refused too."""
    import subprocess
    import sys

    def gpu_check(py=sys.executable, **env):
        return subprocess.run(
            ["bash", "scripts/gpu_check.sh", str(tmp_path / "out")], text=True,
            capture_output=True, cwd=Path(__file__).resolve().parents[1], timeout=120,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": py,
                 "CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(tmp_path / "cache"),
                 "STEPS": "env", **env})

    done = gpu_check()
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["error: scripts/gpu_check.sh needs a CUDA device "
                                        "(torch.cuda.is_available() is False here)"]
    assert not (tmp_path / "out").exists()
    done = gpu_check("false")
    assert done.returncode == 1 and done.stdout.startswith(
        "error: scripts/gpu_check.sh: false could not tell whether a CUDA device is here")
    assert not (tmp_path / "out").exists()
    pytest.importorskip("triton")  # the env step imports it (a GPU machine has it)
    done = gpu_check(GPU_CHECK_ALLOW_CPU="1")
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert "=== env: exit 0" in log and "Traceback" not in log
    assert f"{torch.__version__} " in log and " no CUDA device" in log


# Triton's own record of two tunings, written by its Autotuner.check_disk_cache (what a
# tuning with cache_results writes on a GPU); run after tests.triton_helpers.STAND_IN_DRIVER
WRITE_AUTOTUNE_RECORDS = """
from sigma_moe.kernels import triton_launch as L

def record(tuner, key, ms):
    configs = tuner.configs[:len(ms)]
    def bench():
        tuner.configs_timings = {c: [t, t * 0.9, t * 1.1] for c, t in zip(configs, ms)}
    tuner.check_disk_cache(key, configs, bench)

# MM_CONFIGS' first three: 128x128x64, 128x128x32, 128x64x64; the last did not fit
record(L._gather_mm, (128, 1024, 1, "tf32", "torch.bfloat16", "torch.bfloat16"),
       [0.120, 0.100, float("inf")])
record(L._wgrad, (1024, 128, True, False, "tf32", "torch.bfloat16"), [0.004, 0.005])
"""


def test_autotune_table_reads_every_config_triton_timed(tmp_path, monkeypatch, capsys):
    """scripts/autotune_table.py (run after gpu_check.sh's steps): reads the records
    Triton itself writes, in its cache folder (TRITON_CACHE_DIR); per key, the configs
    fastest first, in microseconds, with their ratio to the fastest and the tile's
    operand traffic (1/BLOCK_M + 1/BLOCK_N, clamped to N = 128) relative to the least; a
    config out of resources is "failed"; keys faster than --min-us only in the JSON; a
    folder without records says so."""
    pytest.importorskip("triton")  # the scripts import it (a GPU machine has it)
    from scripts import autotune_table
    from tests.triton_helpers import STAND_IN_DRIVER, need_hopper_toolchain, outside_interpreter

    need_hopper_toolchain()  # (the record's cache key hashes the sm_90 backend: ptxas)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    outside_interpreter("-c", STAND_IN_DRIVER + WRITE_AUTOTUNE_RECORDS)
    records = autotune_table.main(["--min-us", "50", "--out", str(tmp_path / "tuned.json")])
    gather, wgrad = sorted(records, key=lambda r: r["kernel"])
    assert gather["kernel"] == "gather_mm_kernel"
    assert gather["key"] == {"N": 128, "KD": 1024, "EPILOGUE": 1, "PRECISION": "tf32"}
    assert gather["dtypes"] == ["torch.bfloat16"] * 2
    tiles = [autotune_table._tile(c)[0] for c in gather["configs"]]
    assert tiles == ["128x128x32", "128x128x64", "128x64x64"]  # fastest first
    assert [c["us"][0] for c in gather["configs"][:2]] == pytest.approx([100.0, 120.0])
    assert gather["configs"][1]["x_best"] == pytest.approx(1.2)
    assert [c["operand_bytes_x"] for c in gather["configs"]] == pytest.approx([1, 1, 1.5])
    assert wgrad["key"]["M"] == 1024 and wgrad["configs"][0]["num_stages"] == 7
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("gather_mm_kernel  N=128 KD=1024 EPILOGUE=1")
    assert out[2].split() == ["128x128x32", "4", "4", "100.0", "1.00", "1.00"]
    assert out[4].split() == ["128x64x64", "4", "4", "failed", "-", "1.50"]
    assert "wgrad_kernel" not in "\n".join(out)  # its 4 us are under --min-us
    assert "1 more key, whose fastest config took under 50 us" in out[5]
    saved = json.loads((tmp_path / "tuned.json").read_text())
    assert {r["kernel"] for r in saved} == {"gather_mm_kernel", "wgrad_kernel"}
    with pytest.raises(SystemExit, match="no \\*.autotune.json under"):
        autotune_table.main(["--cache-dir", str(tmp_path / "empty")])


def test_operand_cost_counts_a_column_loop_once():
    """autotune_table's operand column: a scatter program that walks N_TILES column tiles
    loads its A rows once for all of them (clamped to the product's N, as a wide tile)."""
    pytest.importorskip("triton")  # the scripts import it (a GPU machine has it)
    from scripts.autotune_table import _operand_cost

    key = {"N": 1024, "KD": 128}

    def cost(**kwargs):
        return _operand_cost({"kwargs": {"BLOCK_M": 64, "BLOCK_N": 128, **kwargs}}, key)

    assert cost() == pytest.approx(1 / 64 + 1 / 128)
    assert cost(N_TILES=4) == pytest.approx(1 / 64 + 1 / 512)
    assert cost(N_TILES=16) == pytest.approx(1 / 64 + 1 / 1024)
