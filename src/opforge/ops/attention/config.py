"""Tile and split choices of the attention kernels: functions of host-known sizes only.

The Triton kernels (``triton_kernels.py``) take their tiles, warps, stages and decode split
counts from here; the paged kernels (``ops/paged/config.py``) start from the same choices.
"""
from __future__ import annotations

import functools

from ...runtime.triton.launch import cdiv, next_power_of_2

MAX_SPLITS = 128             # decode: at most this many slices of one sequence
MAX_ROW_BLOCK = 64           # decode: query rows (group * Sq) per program
# decode: slices sized by the tokens in the cache (read on the device) rather than by its
# capacity, about one program per SM. H100 (at f515a1a, batch 1, CUDA graphs, L2-cold caches,
# benchmarks/results/h100/2026-11-23-f515a1a/run1/attn): 1B 512 tokens in a 4096 cache 7.0 -> 5.3 us,
# in a 1024 cache 6.7 -> 5.8; 8B 512 in 4096 8.4 -> 6.3; full 4096 caches 9.0 -> 9.2 and 12.3 ->
# 12.4 (1B, 8B).
DECODE_BY_LENGTH_PROGRAMS_PER_SM = 1


def head_block(d: int) -> int:
    """The D block: a power of two >= max(D, 16) (``tl.dot`` needs 16). Example: ``head_block(80) == 128``."""
    return max(16, next_power_of_2(d))


# prefill through tensor descriptors (TMA) for these head dimensions, float16 / bfloat16, on compute
# capability >= 9.0: measured on the H100 against the pointer loads (benchmarks/NOTES.md, attention)
PREFILL_TMA_HEAD_DIMS = (64, 128)
# ... and from this many FLOPs (4 B Hq Sq Sk D, halved when causal): building the three descriptors
# costs ~30 us of host time per call (H100 host: 31 -> 62 us at 1x32x128x128), which the 15-25% of
# GPU time they save repays from ~160 us of kernel time (16x32x1024x128 causal: 499 -> 408 us)
PREFILL_TMA_MIN_FLOPS = 4e10


# causal prefill in 64x64 tiles, 4 warps, 3 stages (``CAUSAL_SMALL_TILES``) for these head dimensions, up
# to this many keys (None: any). Smaller programs balance the triangle's uneven rows and mask a quarter
# of the diagonal tile's scores. H100, bf16, vs cuDNN (results/h100/2026-11-27-171515d/prefill_sweep.json;
# an H200 gave the same, results/h200/2026-11-27-2904e06): D = 128 through descriptors 0.75 -> 0.84x at
# 1K keys, 0.82 -> 0.86x at 2K, 0.88 -> 0.86x at 4K, 0.95 -> 0.82x at 16K; by pointers 0.71 -> 0.85x
# at 1K, 0.72 -> 0.83x at 2K. D = 64: 0.87 -> 0.93x (1K), 0.92 -> 0.95-0.97x (2K), 0.95 -> 0.96x (4K)
# through descriptors; 0.79-0.81 -> 0.87-0.92x by pointers (1K-2K).
CAUSAL_SMALL_TILES = (64, 64, 4, 3)
CAUSAL_SMALL_TILES_MAX_KEYS = {64: None, 128: 2048}


def causal_small_tiles(d: int, kv_len: int) -> bool:
    """Whether a causal prefill of head dimension ``d`` over ``kv_len`` keys runs ``CAUSAL_SMALL_TILES``.

    Example:
        >>> causal_small_tiles(128, 1024), causal_small_tiles(128, 4096), causal_small_tiles(64, 16384)
        (True, False, True)
    """
    if d not in CAUSAL_SMALL_TILES_MAX_KEYS:
        return False
    limit = CAUSAL_SMALL_TILES_MAX_KEYS[d]
    return limit is None or kv_len <= limit


@functools.lru_cache(maxsize=None)
def prefill_config(d: int, itemsize: int, interpreted: bool = False, tma: bool = False,
                   small_causal: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the prefill kernel (H100 defaults; the
    tiles shrink with the head block, and for float32, whose IEEE dots run without tensor cores:
    these are the largest tiles ptxas compiles for sm_90 without spilling, per
    ``benchmarks/tools/attn_registers.py``). ``tma``: the kernel reads through tensor descriptors;
    ``small_causal``: a causal call where ``causal_small_tiles`` holds (float16 / bfloat16 only).

    Example:
        >>> prefill_config(128, 2), prefill_config(64, 2, tma=True), prefill_config(128, 2, small_causal=True)
        ((128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3))
    """
    if interpreted:
        return 16, 16, 1, 1
    if small_causal and itemsize == 2:
        return CAUSAL_SMALL_TILES
    block_d = head_block(d)
    if itemsize == 4:
        return (32, 32, 8, 2) if block_d <= 64 else (32, 16, 8, 2) if block_d <= 128 else (16, 16, 8, 1)
    if block_d <= 64:   # through descriptors, 4x4K: 8 warps 0.92-0.93x cuDNN, 128x128 tiles 0.73-0.76x
        return (128, 64, 8, 3) if tma else (128, 64, 4, 3)
    if block_d <= 128:   # second H100 sweep, 4x4K: 128x128 455 / 447 TFLOP/s (full / causal) vs 128x64 394 / 430
        return 128, 128, 8, 3
    return 64, 32, 8, 2


@functools.lru_cache(maxsize=None)
def decode_config(d: int, itemsize: int, rows: int, interpreted: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_R, BLOCK_N, num_warps, num_stages) for the split kernel: BLOCK_R packs the
    ``group * Sq`` query rows of one key/value head (at least 16 for ``tl.dot``; fewer rows per
    program for float32 and D=256, which would spill registers otherwise).

    Example:
        >>> decode_config(128, 2, 4 * 4)
        (16, 64, 4, 3)
    """
    block_d = head_block(d)
    cap = 16 if itemsize == 4 else 32 if block_d > 128 else MAX_ROW_BLOCK
    block_r = max(16, min(cap, next_power_of_2(rows)))
    if interpreted:
        return block_r, 16, 1, 1
    if itemsize == 4:
        return block_r, 32, 8, 2
    if block_d > 128:
        return block_r, 32, 4, 2
    return block_r, 64, 4, 3


def decode_splits_by_length(batch: int, kv_heads: int, row_blocks: int, s_max: int, sms: int, block_n: int) -> int:
    """Slices per sequence, dividing the tokens in the cache (read on the device): enough
    programs for ``DECODE_BY_LENGTH_PROGRAMS_PER_SM`` per SM, at most one slice per ``block_n``
    keys of capacity. Slices past a short sequence's end stay empty (one load, one store).

    Example:
        >>> decode_splits_by_length(1, 8, 1, 4096, 132, 64), decode_splits_by_length(32, 8, 1, 4096, 132, 64)
        (16, 1)
    """
    want = (DECODE_BY_LENGTH_PROGRAMS_PER_SM * sms) // (batch * kv_heads * row_blocks)
    return max(1, min(want, MAX_SPLITS, cdiv(s_max, block_n)))
