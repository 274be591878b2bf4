"""Routing of the CVMM kernel (paper App. "A Few Words on the CUDA Kernel").

The K expert ids of every token are flattened into R = T*K rows and sorted once per
layer; every projection, forward and backward, reuses that one sort:

    key(t, k) = (e_tk * C + chunk(t)) * K + k     (stable: each segment keeps token order)

Then the rows of expert e are contiguous, `off[e*C*K] : off[(e+1)*C*K]` (what the matrix
products and the weight gradients walk), and with C = 1 the rows of slot k are
`off[e*K+k] : off[e*K+k+1]` (one "segment"). A slot holds every token exactly once, so
writing the outputs of one slot at a time scatters rows back to their tokens with no two
rows hitting the same token: that is how the fused down-projection sums the K expert
outputs of a token in a fixed order, without atomics and without a T*K*D buffer.

C > 1 token chunks (chunk(t) = t*C // T), in one of two orders:
- `chunks_in_slots=False`, the key above: rows of (expert e, chunk c) are contiguous and
  only touch the tokens of chunk c. The CPU torch path gives each worker thread a chunk, so
  workers never write the same output row.
- `chunks_in_slots=True`, key (e_tk * K + k) * C + chunk(t): every (expert, slot) segment
  of C = 1 cut at the chunk boundaries into C sub-segments, `off[(e*K+k)*C+c]`. The rows
  are in C = 1's order (chunk(t) grows with t, and the sort is stable), so only the offsets
  differ: the Triton scatter can run chunk by chunk, its K slot launches of a chunk one
  after the other, while the gather and the weight gradients walk the rows as with C = 1.

Only tensor ops of static shape (sort, searchsorted), so `torch.compile` traces it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Routing:
    order_R: torch.Tensor  # int64 [R]: flat index t*K + k of sorted row r
    tok_R: torch.Tensor  # int32 [R]: token of sorted row r (= order_R // K)
    off_S: torch.Tensor  # int32 [E*C*K + 1]: first row of segment (e, c, k) (or (e, k, c),
    #                      chunks_in_slots); off_S[-1] = R
    n_tokens: int  # T
    n_experts: int  # E
    k: int  # K
    n_chunks: int = 1  # C
    chunks_in_slots: bool = False  # the order of the segments (module docstring)

    @property
    def n_rows(self) -> int:
        return self.n_tokens * self.k

    def inverse_R(self) -> torch.Tensor:
        """int64 [R]: sorted row of flat index t*K + k (the inverse permutation of order_R)."""
        inv = torch.empty_like(self.order_R)
        return inv.scatter_(0, self.order_R, torch.arange(self.n_rows, device=inv.device))


def make_routing(expert_TK: torch.Tensor, n_experts: int, n_chunks: int = 1,
                 chunks_in_slots: bool = False) -> Routing:
    """Sort the (token, slot) rows by (expert, token chunk, slot), or with chunks_in_slots by
    (expert, slot, token chunk); see the module docstring."""
    T, K = expert_TK.shape
    dev = expert_TK.device
    n_seg = n_experts * n_chunks * K
    # the narrowest integer that holds every key: a GPU radix sort makes one pass per key
    # byte (int16: 2 passes where int64 made 8; H200, 131072 rows: 15 us instead of 53)
    key_dtype = next(d for d in (torch.int16, torch.int32, torch.int64)
                     if n_seg <= torch.iinfo(d).max)
    # computed in key_dtype: every partial key is below n_seg
    key_TK = expert_TK.to(key_dtype)
    slot_K = torch.arange(K, device=dev, dtype=key_dtype)
    if chunks_in_slots:
        key_TK = key_TK * K + slot_K
    if n_chunks > 1:  # C = 1 by default on a GPU: no ops (each a launch) for the chunks
        chunk_T = torch.arange(T, device=dev) * n_chunks // max(T, 1)
        key_TK = key_TK * n_chunks + chunk_T.to(key_dtype)[:, None]
    if not chunks_in_slots:
        key_TK = key_TK * K + slot_K
    sorted_key_R, order_R = torch.sort(key_TK.reshape(-1), stable=True)
    # first sorted row of every segment: static shape, unlike bincount(minlength)
    bounds = torch.arange(n_seg + 1, device=dev, dtype=key_dtype)
    off_S = torch.searchsorted(sorted_key_R, bounds, out_int32=True)
    tok_R = torch.div(order_R, K, rounding_mode="floor").to(torch.int32)
    return Routing(order_R, tok_R, off_S, T, n_experts, K, n_chunks, chunks_in_slots)


def routing_reference(expert_TK: torch.Tensor, n_experts: int, n_chunks: int = 1,
                      chunks_in_slots: bool = False) -> Routing:
    """Same routing by an obvious Python loop: the test oracle of `make_routing`."""
    T, K = expert_TK.shape
    C = n_chunks

    def segment(e, c, k):
        return (e * K + k) * C + c if chunks_in_slots else (e * C + c) * K + k

    rows = sorted((segment(int(expert_TK[t, k]), t * C // T, k), t, k)
                  for t in range(T) for k in range(K))
    order = torch.tensor([t * K + k for _, t, k in rows], dtype=torch.int64)
    off = [0] * (n_experts * C * K + 1)
    for s, _, _ in rows:
        off[s + 1] += 1
    off_S = torch.tensor(off, dtype=torch.int64).cumsum(0).to(torch.int32)
    tok = (order // K).to(torch.int32)
    dev = expert_TK.device
    return Routing(order.to(dev), tok.to(dev), off_S.to(dev), T, n_experts, K, C,
                   chunks_in_slots)
