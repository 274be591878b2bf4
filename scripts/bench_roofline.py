"""The roofline of scripts/bench_moe.py: FLOPs and DRAM bytes of one forward+backward of a
dense MLP and of a sigma-MoE layer (paper Eq. `moe_out`), and the device's peak rates they
are divided by (a table of datasheet figures by device name, else measured). torch only.
"""
from __future__ import annotations

import sys

import torch

if __name__ == "__main__":  # a library without a CLI (and `scripts.` would not import)
    sys.exit("error: scripts/bench_roofline.py is a library; the roofline is printed by "
             "`python scripts/bench_moe.py`")
from scripts.bench_common import time_all  # noqa: E402

# dense peak FLOP/s (16-bit tensor cores / plain fp32) and memory bandwidth, by device name
PEAKS = [  # (name fragment, bf16 FLOP/s, fp32 FLOP/s, bytes/s); first match wins
    ("H100 PCIe", 756e12, 51e12, 2.0e12), ("H100 NVL", 835e12, 60e12, 3.9e12),
    # before "H200", which their names contain: the GH200's HBM3e version is faster
    ("GH200 144G", 989e12, 67e12, 4.9e12), ("GH200", 989e12, 67e12, 4.0e12),
    ("H100", 989e12, 67e12, 3.35e12),
    ("H200 NVL", 835e12, 60e12, 4.8e12), ("H200", 989e12, 67e12, 4.8e12),
    ("A100", 312e12, 19.5e12, 2.0e12), ("3090", 71e12, 35.6e12, 0.936e12),
]


def flops(c: dict, T: int, K: int) -> tuple[float, float]:
    """Matrix-product FLOPs of forward+backward (backward = 2x forward): dense, MoE."""
    D, E, G, F = c["d_model"], c["n_experts"], c["expert_size"], c["d_ff"]
    return 12.0 * T * D * F, 12.0 * T * K * G * D + 6.0 * T * D * E  # MoE: + selection


def bytes_moved(c: dict, T: int, K: int, elem: int) -> tuple[float, float]:
    """Compulsory DRAM bytes of forward+backward (a lower bound, as a roofline's): x read in
    each pass, y written, dy read, dx written (5 T x D); the hidden activation saved for the
    backward written and read back; each weight read in both passes and its gradient written
    (3x the weights). The MoE's hidden activation is its R = T*K selected rows of G; it adds
    the selector's weight and the T x K gates it saves. Nothing gathered or expanded counts
    K times: that is the usual data flow (the T x K x d_model expanded output) issue 4 asks
    the fused layer to beat, and counting it would halve the target case's ratio (a
    memory-bound 0.43 ms on an H200 instead of the compute-bound 0.215). Dense, MoE."""
    D, E, G, F = c["d_model"], c["n_experts"], c["expert_size"], c["d_ff"]

    def passes(hidden, weights):
        return 5 * T * D + 2 * hidden + 3 * weights

    return (elem * passes(T * F, 2 * D * F),
            elem * (passes(T * K * G, 2 * E * D * G + E * D) + 2 * T * K))


def datasheet_peaks(name: str, dtype: torch.dtype) -> tuple[float | None, float | None]:
    """(FLOP/s for `dtype`, bytes/s) of device `name` from PEAKS; (None, None) if unknown."""
    for frag, f16, f32, b in PEAKS:
        if frag in name:
            return (f32 if dtype == torch.float32 else f16), b
    return None, None


def device_peaks(args, device: str, dtype: torch.dtype) -> dict:
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    flop_s, bw = datasheet_peaks(name, dtype)
    source = "table" if flop_s else "measured"
    # unknown device (or a CPU): measure a large product and a copy, unless both are given
    if flop_s is None and not (args.peak_tflops and args.peak_gbps):
        flop_s, bw = measure_peaks(device, dtype)
    return {"device": name, "flop_s": args.peak_tflops * 1e12 if args.peak_tflops else flop_s,
            "bytes_s": args.peak_gbps * 1e9 if args.peak_gbps else bw,
            "source": "flags" if args.peak_tflops or args.peak_gbps else source}


def measure_peaks(device: str, dtype: torch.dtype) -> tuple[float, float]:
    n = 2048 if device == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    ms = min(time_all({"mm": lambda: a @ a}, device, 2, 5)["mm"])  # best: the peak
    big = torch.empty(64 * 2**20 // 4, device=device)
    ms_copy = min(time_all({"copy": lambda: big.clone()}, device, 2, 5)["copy"])
    return 2 * n**3 / (ms * 1e-3), 2 * big.numel() * 4 / (ms_copy * 1e-3)
