"""Where a second question about a 3,500-token document spends its prefill, in pieces, alone:
``python -m engine.bench.document_prefill_parts``.  A one-off whose numbers docs/PERFORMANCE.md quotes.

Times, on 2 threads, with the bundled model's shapes (30 layers, 9 query heads, 3 KV heads of 64, float32
KV): attention of 12 new tokens over 3,509 cached positions, per layer, as one SDPA call over a copy of
the prefix (``enable_gqa``) and as the eager path runs it on a chat that shares the document's KV
(``engine.model.fastpath.FastForward._attend_shared``: the prefix where it lives, two flash attentions
weighed by their log-sum-exps, no copy); what the copy a new chat used to make of the prefix cost
(a buffer with room for a quarter more); and checking the saved file (CRC-32 a tensor on two threads,
what a restart pays, beside the SHA-256 a tensor it used to be).
"""

from __future__ import annotations

import hashlib
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from engine.bench.common import median

LAYERS, HEADS, KV_HEADS, DIM, PAST, NEW = 30, 9, 3, 64, 3509, 12


def timed(fn, runs: int = 20) -> float:  # noqa: ANN001
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * median(times)


def main() -> None:
    from engine.runtime.memory import tune_malloc

    tune_malloc()  # as the engine does: freed buffers stay in the process, so a copy reuses their pages
    torch.set_num_threads(2)
    q = torch.randn(1, HEADS, NEW, DIM)
    k, v = torch.randn(1, KV_HEADS, PAST + NEW, DIM), torch.randn(1, KV_HEADS, PAST + NEW, DIM)
    mask = torch.arange(PAST + NEW)[None, :] <= torch.arange(PAST, PAST + NEW)[:, None]
    one = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125, enable_gqa=True))
    group = HEADS // KV_HEADS
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    own = torch.zeros(NEW, NEW).masked_fill_(~mask[:, PAST:], float("-inf")).repeat(group, 1)

    def shared() -> torch.Tensor:
        rows = q.reshape(1, KV_HEADS, group * NEW, DIM)
        o1, l1 = flash(rows, k[:, :, :PAST], v[:, :, :PAST], 0.0, False, scale=0.125)
        o2, l2 = flash(rows, k[:, :, PAST:], v[:, :, PAST:], 0.0, False, attn_mask=own, scale=0.125)
        top = torch.maximum(l1, l2)
        w1, w2 = torch.exp(l1 - top).unsqueeze(-1), torch.exp(l2 - top).unsqueeze(-1)
        return (o1 * w1 + o2 * w2) / (w1 + w2)

    two = timed(shared)
    layers = [(torch.randn(1, KV_HEADS, PAST, DIM), torch.randn(1, KV_HEADS, PAST, DIM)) for _ in range(LAYERS)]

    def branch() -> None:
        for keys, values in layers:
            shape = [1, KV_HEADS, PAST + max(256, PAST // 4), DIM]
            new_k, new_v = keys.new_empty(shape), values.new_empty(shape)
            new_k[..., :PAST, :] = keys
            new_v[..., :PAST, :] = values

    copy = timed(branch, runs=5)
    tensors = [t.numpy().data for pair in layers for t in pair]
    size = sum(t.nbytes for t in tensors)

    def check(fn) -> None:  # noqa: ANN001
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(fn, tensors))

    crc = timed(lambda: check(zlib.crc32), runs=3)
    sha = timed(lambda: check(lambda b: hashlib.sha256(b).digest()), runs=3)
    print(f"attention, {NEW} tokens over {PAST} positions: {one:.2f} ms a layer over a copy (one SDPA), "
          f"{two:.2f} on the shared prefix where it is; x{LAYERS} layers = {one * LAYERS:.0f} and "
          f"{two * LAYERS:.0f} ms")  # fmt: skip
    print(f"the copy of the prefix a new chat no longer makes ({size / 1e6:.0f} MB): {copy:.1f} ms")
    print(f"checking the saved KV on two threads: CRC-32 {crc:.1f} ms, SHA-256 {sha:.1f} ms")


if __name__ == "__main__":
    main()
