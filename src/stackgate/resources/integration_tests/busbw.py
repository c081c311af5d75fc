"""Bandwidth arithmetic exactly as nccl-tests computes it (doc/PERFORMANCE.md, src/*.cu).

algbw = S / t (decimal GB/s, S = bytes of the whole buffer), busbw = algbw * factor(n).
"""

from __future__ import annotations

FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_factor(collective: str, nranks: int, *, nvls: bool = False) -> float:
    if nranks < 1:
        raise ValueError("nranks must be >= 1")
    if nvls and collective == "all_reduce":
        return (nranks - 1) / (nranks + 1)
    return float(FACTORS[collective](nranks))


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    return size_bytes / 1e9 / seconds


def busbw_gbps(collective: str, size_bytes: int, seconds: float, nranks: int, *, nvls: bool = False) -> float:
    return algbw_gbps(size_bytes, seconds) * bus_factor(collective, nranks, nvls=nvls)


def sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out
