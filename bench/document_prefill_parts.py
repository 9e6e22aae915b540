"""Where a second question about a 3,500-token document spends its prefill, in pieces, alone:
``python bench/document_prefill_parts.py``.

Times, on 2 threads, with the bundled model's shapes (30 layers, 9 query heads, 3 KV heads of 64, float32
KV): attention of 12 new tokens over 3,509 cached positions, per layer, as the eager path calls it
(``enable_gqa``) and with each KV group's query heads folded into the query rows (no copy of keys either
way); the copy a new chat makes of the shared prefix at its first write (``GrowingLayer._reallocate``: a
buffer with room for a quarter more); and checking the saved file's SHA-256 (what a restart pays).
"""

from __future__ import annotations

import hashlib
import statistics
import time

import torch
import torch.nn.functional as F

LAYERS, HEADS, KV_HEADS, DIM, PAST, NEW = 30, 9, 3, 64, 3509, 12


def timed(fn, runs: int = 20) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> None:
    from engine.runtime.memory import tune_malloc

    tune_malloc()  # as the engine does: freed buffers stay in the process, so a copy reuses their pages
    torch.set_num_threads(2)
    q = torch.randn(1, HEADS, NEW, DIM)
    k, v = torch.randn(1, KV_HEADS, PAST + NEW, DIM), torch.randn(1, KV_HEADS, PAST + NEW, DIM)
    mask = torch.arange(PAST + NEW)[None, :] <= torch.arange(PAST, PAST + NEW)[:, None]
    group = HEADS // KV_HEADS
    gqa = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True))
    folded = timed(
        lambda: F.scaled_dot_product_attention(
            q.view(1, KV_HEADS, group * NEW, DIM), k, v, attn_mask=mask.repeat(group, 1), scale=0.125
        )
    )
    layers = [(torch.randn(1, KV_HEADS, PAST, DIM), torch.randn(1, KV_HEADS, PAST, DIM)) for _ in range(LAYERS)]

    def branch() -> None:
        for keys, values in layers:
            shape = [1, KV_HEADS, PAST + max(256, PAST // 4), DIM]
            new_k, new_v = keys.new_empty(shape), values.new_empty(shape)
            new_k[..., :PAST, :] = keys
            new_v[..., :PAST, :] = values

    copy = timed(branch, runs=5)
    data = b"".join(t.numpy().tobytes() for pair in layers for t in pair)
    digest = timed(lambda: hashlib.sha256(data).hexdigest(), runs=3)
    print(f"attention, 12 tokens over {PAST} positions: {gqa:.2f} ms a layer (enable_gqa), {folded:.2f} folded; "
          f"x{LAYERS} layers = {gqa * LAYERS:.0f} ms")  # fmt: skip
    print(f"a new chat's copy of the prefix ({len(data) / 1e6:.0f} MB): {copy:.1f} ms (memory the process had freed before)")
    print(f"SHA-256 of the saved KV: {digest:.1f} ms")


if __name__ == "__main__":
    main()
