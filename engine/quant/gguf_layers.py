"""Layers whose weights are a GGUF file's blocks, where the file lies (``engine.model.gguf_model`` maps them).

:class:`GgufLinear` multiplies by a tensor's blocks in the native step's block kernels
(``gguf_product.cpp``: integer dot products on the blocks for a few rows, tiles de-quantized
for torch's GEMM for a prompt's many); :class:`GgufEmbedding` de-quantizes only the rows looked
up.  Without the native step (not built yet, or ``BRISK_NATIVE=0``) both de-quantize with
``gguf``'s own numpy code: correct and slow.  Their blocks are never copied; the native decode
step (``engine.quant.decode_step``) takes them as they are.
"""

from __future__ import annotations

import torch
from torch import nn

# ggml type ids the block kernels read (gguf_blocks.h)
TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K",
         12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 20: "IQ4_NL", 30: "BF16"}  # fmt: skip


class GgufLinear(nn.Module):
    """A projection whose weights are a GGUF tensor's blocks, viewed in the memory-mapped file.

    ``blocks`` is uint8 [out, bytes a row]; ``kind`` its ggml type.  The product runs in the native
    step's block kernels (``gguf_product.cpp``); without the native step, the weights are
    de-quantized by ``gguf``'s numpy code on every call (correct, slow)."""

    version = 0  # never changes (the native step's collection checks it)

    def __init__(self, blocks: torch.Tensor, kind: int, in_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features, self.kind = in_features, int(blocks.shape[0]), kind
        self.blocks: torch.Tensor
        self.bias: torch.Tensor | None
        self.register_buffer("blocks", blocks, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        self.has_bias = bias is not None
        self._empty = torch.empty(0)

    def parts(self) -> list[torch.Tensor]:
        return [self.blocks, self.bias if self.bias is not None else self._empty]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from engine.quant import native

        built = native.module()
        if built is not None:
            return built.gguf_linear(x.float(), self.parts(), [self.kind]).to(x.dtype)
        weight = dequantize(self.blocks, self.kind, self.in_features)
        return nn.functional.linear(x.float(), weight, self.bias).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {TYPES[self.kind]}, bias={self.has_bias}"


class GgufEmbedding(nn.Module):
    """A token embedding whose rows stay in the file's blocks: the rows looked up are de-quantized."""

    def __init__(self, blocks: torch.Tensor, kind: int, width: int) -> None:
        super().__init__()
        self.kind, self.num_embeddings, self.embedding_dim = kind, int(blocks.shape[0]), width
        # counted as a table of num_embeddings x embedding_dim weights (engine.model.facts.count_parameters)
        self.in_features, self.out_features, self.has_bias = width, self.num_embeddings, False
        self.blocks: torch.Tensor
        self.register_buffer("blocks", blocks, persistent=False)
        # shaped as the embedding's weight (its dtype, device and size), holding nothing
        self.weight = torch.empty((self.num_embeddings, width), dtype=torch.float32, device="meta")

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        from engine.quant import native

        built = native.module()
        flat = ids.reshape(-1)
        if built is not None:
            out = built.gguf_rows(self.blocks, self.kind, flat)
        else:
            out = dequantize(self.blocks[flat], self.kind, self.embedding_dim)
        return out.view(*ids.shape, self.embedding_dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.rows(ids)


def dequantize(blocks: torch.Tensor, kind: int, width: int) -> torch.Tensor:
    """Rows of blocks as float32 [rows, width] by ``gguf``'s own numpy de-quantizers (the reference)."""
    import gguf

    data = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType(kind))
    return torch.from_numpy(data.reshape(blocks.shape[0], width).astype("float32", copy=False))
