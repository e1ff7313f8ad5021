"""An independent numpy reference of exactcoll's rounding contract (docs/numerics.md), for the
Python tests. It shares nothing with the library: narrowing finds the nearest value in a table of
every finite value of the format (ties to the even bit pattern; at or past the value just beyond
the largest finite one, infinity), fp32 arithmetic is numpy's float32 (one IEEE rounding per
operation, never fused), and the RMSNorm tree is spelled out from the contract's text.
"""

import numpy as np

PACK = {"bf16": 8, "fp16": 8, "fp32": 4}
NAN16 = np.uint16(0x7FFF)
NAN32 = np.uint32(0x7FFFFFFF)


def _fp16_values(bits):
    bits = bits.astype(np.int64)
    e, m = (bits >> 10) & 0x1F, bits & 0x3FF
    return np.where(e == 0, m * 2.0 ** -24, (1024 + m) * np.exp2(e.astype(np.float64) - 25))


def _table(fmt):
    """(values, bits): every non-negative finite value of the format in increasing order, then the
    power of two just beyond the largest (standing for infinity, with the infinity pattern)."""
    if fmt == "bf16":
        bits = np.arange(0, 0x7F80, dtype=np.uint32)
        values = (bits << 16).view(np.float32).astype(np.float64)
        return np.append(values, 2.0 ** 128), np.append(bits, 0x7F80).astype(np.uint16)
    bits = np.arange(0, 0x7C00, dtype=np.uint32)
    return np.append(_fp16_values(bits), 65536.0), np.append(bits, 0x7C00).astype(np.uint16)


_TABLES = {fmt: _table(fmt) for fmt in ("bf16", "fp16")}


def widen(bits, fmt):
    """Storage bits -> float32 values (exact)."""
    if fmt == "fp32":
        return np.asarray(bits, dtype=np.float32)
    bits = np.asarray(bits, dtype=np.uint16)
    if fmt == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    values = _fp16_values(bits).astype(np.float32)
    special = ((bits >> 10) & 0x1F) == 0x1F
    inf = np.where(bits & 0x8000, -np.inf, np.inf).astype(np.float32)
    values = np.where(special & ((bits & 0x3FF) == 0), inf, values)
    values = np.where(special & ((bits & 0x3FF) != 0), np.float32(np.nan), values)
    return np.where(bits & 0x8000, -np.abs(values), values).astype(np.float32)


def narrow(f, fmt):
    """float32 values -> storage (uint16 bits, or float32 with canonical NaN), round to nearest
    even; every NaN becomes the canonical pattern."""
    f = np.asarray(f, dtype=np.float32)
    if fmt == "fp32":
        bits = f.view(np.uint32).copy()
        bits[np.isnan(f)] = NAN32
        return bits.view(np.float32)
    values, table_bits = _TABLES[fmt]
    a = np.abs(f.astype(np.float64))
    finite = ~np.isnan(a) & (a < values[-1])
    safe = np.where(finite, a, 0.0)
    hi = np.searchsorted(values, safe, side="right")
    hi = np.minimum(hi, len(values) - 1)
    lo = hi - 1
    below, above = safe - values[lo], values[hi] - safe
    even_lo = (table_bits[lo] & 1) == 0
    pick = np.where(below < above, lo, np.where(above < below, hi, np.where(even_lo, lo, hi)))
    out = table_bits[pick].astype(np.uint16)
    out = np.where(finite, out, table_bits[-1])  # at or beyond the overflow value: infinity
    out = np.where(np.signbit(f), out | np.uint16(0x8000), out).astype(np.uint16)
    return np.where(np.isnan(f), NAN16, out).astype(np.uint16)


def fold(x, fmt):
    """The all-reduce fold over axis 0 (ranks), in rank order, in float32, not rounded."""
    acc = widen(x[0], fmt).astype(np.float32)
    with np.errstate(all="ignore"):
        for r in range(1, x.shape[0]):
            acc = (acc + widen(x[r], fmt)).astype(np.float32)
    return acc


def all_reduce(x, fmt):
    return narrow(fold(x, fmt), fmt)


def tree(x, fmt):
    """The tree contract over axis 0 (ranks), storage bits: level by level, parts 2i and 2i + 1 added
    in float32 and rounded to storage, an odd last part carried up unchanged (the largest power of
    two below n goes left); one part alone is rounded (a NaN made canonical)."""
    level = [x[r] for r in range(x.shape[0])]
    if len(level) == 1:
        return narrow(widen(level[0], fmt).astype(np.float32), fmt)
    with np.errstate(all="ignore"):
        while len(level) > 1:
            level = [narrow((widen(level[i], fmt) + widen(level[i + 1], fmt)).astype(np.float32), fmt)
                     if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)]
    return level[0]


def _butterfly(a):
    """32-lane xor butterfly on the last axis: a[l] = a[l] + a[l ^ off] for off = 16, 8, 4, 2, 1."""
    lanes = np.arange(32)
    for off in (16, 8, 4, 2, 1):
        a = (a + a[..., lanes ^ off]).astype(np.float32)
    return a


def sum_squares(v, fmt):
    """The canonical sum of squares of each row of v [rows, H] (float32)."""
    rows, hidden = v.shape
    pack = PACK[fmt]
    num_packs = hidden // pack
    lanes = 32 * ((min(num_packs, 1024) + 31) // 32)
    acc = np.zeros((rows, lanes), dtype=np.float32)
    packs = v.reshape(rows, num_packs, pack)
    with np.errstate(all="ignore"):
        for first in range(0, num_packs, lanes):  # lane l takes packs l, l + L, ...
            chunk = packs[:, first:first + lanes, :]
            used = chunk.shape[1]
            for e in range(pack):
                square = (chunk[:, :, e] * chunk[:, :, e]).astype(np.float32)
                acc[:, :used] = (acc[:, :used] + square).astype(np.float32)
        groups = _butterfly(acc.reshape(rows, lanes // 32, 32))[:, :, 0]
        padded = np.zeros((rows, 32), dtype=np.float32)
        padded[:, :groups.shape[1]] = groups
        return _butterfly(padded)[:, 0]


def rms_norm(v, weight_bits, eps, fmt):
    """The canonical RMSNorm of rows v [rows, H] (float32 values) -> storage."""
    hidden = v.shape[1]
    with np.errstate(all="ignore"):
        ss = sum_squares(v, fmt)
        mean = (ss / np.float32(hidden)).astype(np.float32)
        inv = (np.float32(1.0) / np.sqrt((mean + np.float32(eps)).astype(np.float32))).astype(np.float32)
        y = ((v * inv[:, None]).astype(np.float32) * widen(weight_bits, fmt)).astype(np.float32)
    return narrow(y, fmt)


def fused_add_rms_norm(x, residual, weight, eps, fmt, contract="canonical"):
    """(out, residual_out) of one rank, each [rows, H], for x [ranks, rows, H]."""
    with np.errstate(all="ignore"):
        if contract == "bf16_accumulate":
            acc = widen(x[0], fmt)
            for r in range(1, x.shape[0]):
                acc = widen(narrow((acc + widen(x[r], fmt)).astype(np.float32), fmt), fmt)
            t = acc
        elif contract == "tree":
            t = widen(tree(x, fmt), fmt)
        else:
            t = fold(x, fmt)
        if contract == "f32_residual":
            rf = (t + widen(residual, fmt)).astype(np.float32)
            return rms_norm(rf, weight, eps, fmt), narrow(rf, fmt)
        s = narrow(t, fmt)
        residual_out = narrow((widen(s, fmt) + widen(residual, fmt)).astype(np.float32), fmt)
    return rms_norm(widen(residual_out, fmt), weight, eps, fmt), residual_out


def adversarial(rng, shape, fmt):
    """Storage bits: mostly moderate values (so rounding matters), plus NaNs with payloads, +-inf,
    +-0, subnormals, values near the largest finite one (their sums overflow) and near-ties."""
    size = int(np.prod(shape))
    kind = rng.integers(0, 100, size)
    if fmt == "fp32":
        moderate = rng.standard_normal(size).astype(np.float32) * np.float32(4)
        bits = moderate.view(np.uint32).copy()
        bits[kind < 2] = 0x7F800001 | (rng.integers(0, 1 << 22, int((kind < 2).sum())).astype(np.uint32))
        bits[(kind >= 2) & (kind < 4)] = 0x7F800000
        bits[(kind >= 4) & (kind < 6)] = 0
        sub = (kind >= 6) & (kind < 10)
        bits[sub] = rng.integers(1, 1 << 23, int(sub.sum())).astype(np.uint32)
        big = (kind >= 10) & (kind < 13)
        bits[big] = (0xFE << 23) | rng.integers(0, 1 << 23, int(big.sum())).astype(np.uint32)
        signs = rng.integers(0, 2, size).astype(np.uint32) << 31
        return (bits | signs).view(np.float32).reshape(shape)
    moderate = narrow(rng.standard_normal(size).astype(np.float32) * np.float32(4), fmt)
    bits = moderate.astype(np.uint16)
    exp_max = 0x7F80 if fmt == "bf16" else 0x7C00
    mant = 0x7F if fmt == "bf16" else 0x3FF
    nan = kind < 2
    bits[nan] = exp_max | (1 + rng.integers(0, mant, int(nan.sum()))).astype(np.uint16)
    bits[(kind >= 2) & (kind < 4)] = exp_max
    bits[(kind >= 4) & (kind < 6)] = 0
    sub = (kind >= 6) & (kind < 10)
    bits[sub] = rng.integers(1, mant + 1, int(sub.sum())).astype(np.uint16)
    big = (kind >= 10) & (kind < 13)
    top = (exp_max - (mant + 1))  # the largest binade's exponent field
    bits[big] = top | rng.integers(0, mant + 1, int(big.sum())).astype(np.uint16)
    signs = (rng.integers(0, 2, size).astype(np.uint16) << 15).astype(np.uint16)
    return (bits | signs).reshape(shape)


def bits_of(array):
    """The raw bit patterns of a storage array, for exact comparison (NaN payloads included)."""
    array = np.ascontiguousarray(array)
    return array.view(np.uint32) if array.dtype == np.float32 else array.view(np.uint16)
