"""Linear layers with weights pre-packed for oneDNN: faster float32 matmuls on the CPU.

torch's ``nn.Linear`` on the CPU calls a BLAS GEMM, which re-packs the weight
into its blocked layout on every call; at the row counts of chat (1 token per
decode step, 5 to 50 for a new message on top of a cached prefix) that packing
and a kernel tuned for big matrices cost a large share of the time.  oneDNN can
pack each weight once, at load, for a given batch size (``torch.ops.mkldnn``,
the same path torch.compile's CPU backend uses); measured here on the bundled
model's layer shapes: 1.2x faster at one row, 1.6x at 15 rows, 1.2x at 256
(``docs/PERFORMANCE.md``).  The packed weight replaces the plain one, so memory
does not grow.  Results differ from BLAS only in rounding (the order of float32
additions), like BLAS's own results at different row counts.

:func:`pack_linears` swaps every float32 ``nn.Linear`` except the output head
(which stays a plain layer: it is often tied to the embedding, and callers
read its weight) in place; :func:`available` says whether this torch can.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

from engine.quant import swap_module

BATCH_HINT = 16  # the row count the layout is tuned for; fastest across 1..256 rows here


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` in oneDNN's packed layout (float32, CPU)."""

    packed: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


@functools.cache
def available() -> bool:
    """Whether this torch build runs packed linears correctly (checked once on a small layer)."""
    if os.environ.get("BRISK_PACKED_LINEAR", "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    try:
        with torch.random.fork_rng(devices=[]), torch.inference_mode():
            torch.manual_seed(0)
            linear = nn.Linear(64, 48)
            x = torch.randn(1, 3, 64)
            return bool(torch.allclose(PackedLinear(linear)(x), linear(x), atol=1e-5, rtol=1e-4))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def pack_linears(model: nn.Module) -> int:
    """Replace the float32 CPU ``nn.Linear`` layers of ``model`` (not its output head); return how many."""
    if not available():
        return 0
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    count = 0
    with torch.no_grad():
        for name, module in list(model.named_modules()):
            if type(module) is not nn.Linear or module is head:
                continue
            if module.weight.dtype != torch.float32 or module.weight.device.type != "cpu":
                continue
            swap_module(model, name, PackedLinear(module))
            count += 1
    return count
