"""The layers of torch's weight-only CPU kernels: fp16 (fbgemm), int8 and int4.

Contract:

* :class:`Fp16Linear` holds float16 weights packed for fbgemm and computes in float32;
  :class:`Fp16Group` serves several of them that take the same input (q/k/v, gate/up)
  from one packed matrix.  Each ``Fp16Linear`` counts the changes to its weights in
  ``version`` (new weights, joining a group), so a caller that keeps its packed weights
  (``engine.quant.decode_step``) can tell when to look again.
* :class:`Int8Linear` / :class:`Int4Linear` are drop-in ``nn.Linear`` replacements
  built by ``from_linear``; their state dicts hold the packed weights and scales.
* The int kernels run on bf16 activations (their fp32 paths measured 10-30x
  slower here); the layers cast their input to bf16 and the result back.  They
  are GEMV kernels: for more than ``GEMV_ROWS`` rows (a prefill chunk) an int8
  layer dequantizes to bf16 and runs a GEMM instead; int4 has no such path (its
  packed layout is private to the kernel), so int4 prefill is slower than bf16.
* :class:`Q8Linear` (``q8-cpu``) holds 8-bit weights with a float32 step and minimum per
  group of ``Q8_GROUP`` inputs; its input is quantized per group to 15-bit integers at run
  time and the two are multiplied by the native step's integer kernel (``engine.quant.native``,
  ``q8_linear``), the same code the native decode step runs, so a few rows (a speculative
  verification) and a decode step multiply alike; a layer from a 4-bit GGUF keeps 4 bits.
  A prompt's rows (``PROMPT_ROWS`` or more) multiply the weights made float32
  (``q8_dequantize``) with torch's GEMM, faster there than the integer kernel.  Where the
  native step is not built, the integer arithmetic runs in torch (slower; results agree to
  float32 rounding).
* :func:`int4_layout` fingerprints the int4 kernel's packed layout on this torch and CPU.

Which of these can run here is ``engine.quant.modes``' job; putting them into a model
is ``engine.quant.apply``'s.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import torch
from torch import nn

# Next-token agreement on the bundled model (int4 head): 0.868 at group 32, 0.687 at 64; 128
# does not divide its width (576).  Its GGUF weights are Q4_1, groups of 32: int4/32 keeps them.
INT4_GROUP = 32
ACT_DTYPE = torch.bfloat16  # the int kernels' fast path
# Above this many rows an int8 layer dequantizes to bf16 and runs a GEMM: at 200 rows the
# GEMV kernel took 4.6 ms for a 1536x576 layer, dequantize + bf16 linear 0.9 ms (1 thread).
GEMV_ROWS = 32


class Fp16Linear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` rounded to float16 and packed for fbgemm; x, y and sums in float32.

    The packed weight is the only copy (an opaque object, not a tensor): the state dict
    unpacks it to a float16 ``weight16`` and loading packs that again, so a saved copy
    is plain safetensors.  ``packed_nbytes`` is what it holds, for ``engine.quant.apply.weight_bytes``.
    Layers that take the same input can share one packed matrix (:class:`Fp16Group`,
    made by ``engine.quant.apply.fuse_fp16``); each then holds ``group`` and its ``index`` in it.
    ``Fp16Linear.changes`` counts every change to any layer's ``version`` (one number to
    compare before summing the versions of some hundreds of layers).
    """

    changes = 0

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features, self.has_bias = in_features, out_features, bias
        self.packed: Any = None  # torch.ScriptObject once weights are set (None while in a group)
        self.group: Fp16Group | None = None
        self.index = 0
        self.version = 0  # counts new weights and joining a group (see the module's contract)
        self.pending: tuple[torch.Tensor, torch.Tensor | None] | None = None  # loaded, not packed yet

    @classmethod
    def from_linear(cls, linear: nn.Linear, pack: bool = True) -> Fp16Linear:
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None)
        bias = None if linear.bias is None else linear.bias.detach()
        layer.set_weights(linear.weight.detach().to(torch.float16), bias, pack=pack)
        return layer

    def set_weights(self, weight16: torch.Tensor, bias: torch.Tensor | None, pack: bool = True) -> None:
        """Take new weights; packed now, or (``pack=False``) at :meth:`pack` or the first call."""
        if tuple(weight16.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight16 is {tuple(weight16.shape)}, not {(self.out_features, self.in_features)}")
        if (bias is not None) != self.has_bias:
            raise ValueError("a bias was given to a layer without one, or none to a layer with one")
        self.version += 1
        Fp16Linear.changes += 1
        if self.group is not None:  # its own weights now; the group keeps serving the others
            self.group.leave(self.index)
        self.packed, self.group = None, None
        self.pending = (weight16.to(torch.float16), None if bias is None else bias.float())
        if pack:
            self.pack()

    def pack(self) -> None:
        if self.pending is not None:
            weight16, bias = self.pending
            self.packed = torch.ops.quantized.linear_prepack_fp16(weight16.float().contiguous(), bias)
            self.pending = None

    @property
    def has_weights(self) -> bool:
        return self.packed is not None or self.group is not None or self.pending is not None

    @property
    def packed_nbytes(self) -> int:
        return self.out_features * self.in_features * 2 + (self.out_features * 4 if self.has_bias else 0)

    def weights(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight as float16, bias as float32 or None), unpacked."""
        if self.group is not None:
            return self.group.part_weights(self.index)
        if self.pending is not None:
            return self.pending
        if self.packed is None:
            raise RuntimeError("Fp16Linear has no weights yet (load a state dict first)")
        weight, bias = torch.ops.quantized.linear_unpack_fp16(self.packed)
        return weight.to(torch.float16), bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is not None:
            return self.group.output(x, self.index)
        self.pack()
        if self.packed is None:
            raise RuntimeError("Fp16Linear has no weights yet (load a state dict first)")
        y = torch.ops.quantized.linear_dynamic_fp16(x.float(), self.packed)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        if self.has_weights:
            weight, bias = self.weights()
            destination[prefix + "weight16"] = weight
            if self.has_bias:
                destination[prefix + "bias"] = bias

    def _load_from_state_dict(
        self,
        state_dict: Any,
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        keys = [prefix + "weight16"] + ([prefix + "bias"] if self.has_bias else [])
        missing = [k for k in keys if k not in state_dict]
        if missing:
            missing_keys.extend(missing)
            return
        try:
            # packed by fuse_fp16 (several at once) or at the first call
            self.set_weights(state_dict[keys[0]], state_dict[keys[1]] if self.has_bias else None, pack=False)
        except (ValueError, RuntimeError) as exc:
            error_msgs.append(f"{prefix}: {exc}")

    def extra_repr(self) -> str:
        fused = f", fused={self.index}/{len(self.group.sizes)}" if self.group is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}{fused}"


class Fp16Group:
    """Several :class:`Fp16Linear` that take the same input (q, k, v; gate, up) as one packed matrix.

    One wide matmul is cheaper than three narrow ones at batch 1 (measured on the bundled
    model's shapes: 41 us for q, k, v together against 81 us apart).  Each part still
    works as a layer of its own: the first part called with an input computes every
    part's rows and keeps them until the other parts have taken theirs for the same
    input (the same tensor object), so transformers' forward, which calls q, k and v
    one by one, does the work once too.  The parts' weights live only here.
    """

    def __init__(self, parts: list[Fp16Linear]) -> None:
        if len({(p.in_features, p.has_bias) for p in parts}) != 1 or not all(p.has_weights for p in parts):
            raise ValueError("an Fp16Group takes layers with weights, the same input width and all or no biases")
        unpacked = [p.weights() for p in parts]
        bias = torch.cat([b for _, b in unpacked if b is not None]) if parts[0].has_bias else None
        weight = torch.cat([w.float() for w, _ in unpacked])
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight, bias)
        self.sizes = [p.out_features for p in parts]
        self.starts = [sum(self.sizes[:i]) for i in range(len(parts))]
        self._memo: tuple[torch.Tensor, torch.Tensor, set[int]] | None = None
        self.active = set(range(len(parts)))  # parts still served from here (see leave)
        for i, part in enumerate(parts):
            part.packed, part.pending, part.group, part.index = None, None, self, i
            part.version += 1
            Fp16Linear.changes += 1

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        memo = self._memo
        if memo is None or memo[0] is not x or index in memo[2]:
            y = torch.ops.quantized.linear_dynamic_fp16(x.float(), self.packed)
            memo = (x, y if x.dtype == torch.float32 else y.to(x.dtype), set())
        memo[2].add(index)
        self._memo = None if memo[2] >= self.active else memo  # every part served: let it go
        start = self.starts[index]
        return memo[1][..., start : start + self.sizes[index]]

    def leave(self, index: int) -> None:
        """Part ``index`` took weights of its own: stop keeping outputs for it (its rows stay, unused)."""
        self.active.discard(index)
        self._memo = None

    def part_weights(self, index: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight, bias = torch.ops.quantized.linear_unpack_fp16(self.packed)
        rows = slice(self.starts[index], self.starts[index] + self.sizes[index])
        return weight[rows].to(torch.float16), None if bias is None else bias[rows].clone()


class Int8Linear(nn.Module):
    """``y = x @ (q * s).T + b``: int8 ``q`` [out, in], one scale per output channel."""

    qweight: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=ACT_DTYPE))
        self.register_buffer("bias", torch.zeros(out_features, dtype=ACT_DTYPE) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        w = linear.weight.detach().float()
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None)
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-8)
        layer.qweight = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        layer.scales = scales.to(ACT_DTYPE)
        if linear.bias is not None:
            layer.bias = linear.bias.detach().to(ACT_DTYPE).clone()
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(ACT_DTYPE).contiguous()
        if flat.shape[0] > GEMV_ROWS:  # prefill: a bf16 copy and a GEMM beat the GEMV kernel
            y = nn.functional.linear(flat, self.qweight.to(ACT_DTYPE) * self.scales[:, None], self.bias)
        else:
            y = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales)
            if self.bias is not None:
                y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


PROMPT_ROWS = 128  # q8 layers: from this many rows, float32 weights and torch GEMM (measured: faster)
Q8_GROUP = 32  # inputs that share one step and minimum in q8 weights, and one step in the activations
X_LEVELS = 16383  # q8 activations: integers in -16383..16383 (15 bits) per group


Fit = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # (q, steps, minimums, largest errors)


def _groups(weight: torch.Tensor) -> torch.Tensor:
    return weight.detach().float().reshape(weight.shape[0], -1, Q8_GROUP)


def _closest_grid(groups: torch.Tensor, grids: tuple[tuple[torch.Tensor, torch.Tensor], ...], top: int) -> Fit:
    """Per group of ``groups`` [out, in / 32, 32], the grid (step, minimum) among ``grids`` whose levels
    0..``top`` come closest to its values (the first on a tie): q (float, on the grid), step, minimum and
    the group's largest error."""
    best: Fit | None = None
    for step, base in grids:
        safe = torch.where(step > 0, step, torch.ones_like(step))
        q = torch.round((groups - base[..., None]) / safe[..., None]).clamp(0, top)
        error = (q * step[..., None] + base[..., None] - groups).abs().amax(dim=-1)
        if best is None:
            best = (q, step, base, error)
            continue
        better = error < best[3]
        best = (
            torch.where(better[..., None], q, best[0]),
            torch.where(better, step, best[1]),
            torch.where(better, base, best[2]),
            torch.where(better, error, best[3]),
        )
    assert best is not None
    return best


def _q8_fit(groups: torch.Tensor) -> Fit:
    """Each group takes the closer of two 256-level grids: its range in 255 steps (weights from a 4-bit
    GGUF, 15 steps from minimum to maximum as Q4_0/Q4_1/Q4_K store them, land on q = 17 times their 4-bit
    value) or its largest magnitude in 127 steps either side of zero, m = -128 d (weights from a Q8_0 GGUF
    land on their own values).  Either is exact, up to float32 rounding, for weights from such a file."""
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    centred = groups.abs().amax(dim=-1) / 127.0
    return _closest_grid(groups, (((high - low) / 255.0, low), (centred, -128.0 * centred)), 255)


def _q4_fit(groups: torch.Tensor) -> Fit:
    """Each group takes the closest of four 16-level grids: its range in 15 steps (Q4_1 groups, whose
    two ends are levels 0 and 15), its largest magnitude in 8 steps with the minimum at -8 or -7
    steps (Q4_0 groups: ``d * (q - 8)``, whose largest magnitude is level 0), or the smallest gap
    between two of its values from its minimum (Q4_K groups, whose scale and minimum are fitted, so
    their values need not reach level 0 or 15)."""
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    centred = groups.abs().amax(dim=-1) / 8.0
    gaps = groups.sort(dim=-1).values.diff(dim=-1)
    tiny = 1e-6 * groups.abs().amax(dim=-1, keepdim=True)  # equal values, float32 rounding apart
    gap = torch.where(gaps > tiny, gaps, torch.full_like(gaps, float("inf"))).amin(dim=-1)
    gap = torch.where(torch.isfinite(gap) & ((high - low) <= 15.5 * gap), gap, (high - low) / 15.0)
    grids = (((high - low) / 15.0, low), (centred, -8.0 * centred), (centred, -7.0 * centred), (gap, low))
    return _closest_grid(groups, grids, 15)


def _half_grid(
    groups: torch.Tensor, steps: torch.Tensor, mins: torch.Tensor, bound: torch.Tensor, top: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The layer's grids with steps and minimums in float16 (q, steps, minimums) where that rounds nothing
    the float32 grids kept: every group's largest error within ``bound`` (the float32 grid's, float32
    rounding apart).  Weights from a GGUF land there (the file stores each group's scale and minimum in
    float16), and the native step then reads 4 bytes a group for them instead of 8.  None where any group
    would lose (weights from float)."""
    half_steps, half_mins = steps.half(), mins.half()
    if not (torch.isfinite(half_steps).all() and torch.isfinite(half_mins).all()):
        return None
    q, _, _, error = _closest_grid(groups, ((half_steps.float(), half_mins.float()),), top)
    if not bool((error <= bound).all()):
        return None
    return q, half_steps, half_mins


def q8_weights(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(uint8 q [out, in], float32 steps d and minimums m [out, in / 32]) with weight ~ d * q + m per group
    (the grids: :func:`_q8_fit`)."""
    q, step, base, _ = _q8_fit(_groups(weight))
    return q.to(torch.uint8).reshape(weight.shape), step.contiguous(), base.contiguous()


def pack4(q: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in] in 0..15 (in a multiple of 64) -> [out, in / 2]: each 64 inputs as 32 bytes, the
    first 32 inputs in the low nibbles and the next 32 in the high ones (the native kernel's layout)."""
    pairs = q.reshape(q.shape[0], -1, 2, Q8_GROUP)
    return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(q.shape[0], -1).contiguous()


def unpack4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack4`."""
    pairs = packed.reshape(packed.shape[0], -1, Q8_GROUP)
    return torch.stack([pairs & 15, pairs >> 4], dim=2).reshape(packed.shape[0], -1)


def q8_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(integers in -16383..16383 as int32 [..., in], float32 steps [..., in / 32]) with x ~ step * q per group.

    The native kernel quantizes the same way (round half to even)."""
    groups = x.float().reshape(*x.shape[:-1], x.shape[-1] // Q8_GROUP, Q8_GROUP)
    top = groups.abs().amax(dim=-1)
    step = top / X_LEVELS
    inverse = torch.where(top > 0, X_LEVELS / torch.where(top > 0, top, torch.ones_like(top)), torch.zeros_like(top))
    q = torch.round(groups * inverse[..., None]).clamp(-X_LEVELS, X_LEVELS).to(torch.int32)
    return q.reshape(x.shape), step


class Q8Linear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` in 8 bits, a float32 step and minimum per group of 32 inputs.

    Float32 in and out.  The input is quantized per group to 15-bit integers, each group's
    product is summed exactly in int32 (the native kernel, ``engine.quant.native``) and scaled
    by the two steps, and the minimum's term is added: float32 rounding only, so its output
    stays as close to float32's as fp16-cpu's.  Reads about 1.25 bytes a weight.  Steps and
    minimums are kept in float16 where that rounds nothing (:func:`_half_grid`): 1.125 bytes.

    A layer whose every group lies on 16 levels as closely as on 8-bit's 256 (weights that came
    from a 4-bit GGUF) keeps them in 4 bits (``bits == 4``: ``qweight`` is [out, in / 2], see
    :func:`pack4`): the same products from 0.75 bytes a weight (0.625 with float16 steps).  Nothing is
    rounded that 8 bits would have kept, so the choice never changes a reply's agreement with float32.
    """

    qweight: torch.Tensor
    steps: torch.Tensor
    mins: torch.Tensor
    bias: torch.Tensor | None
    changes = 0  # every change to any layer's ``version``, as Fp16Linear.changes
    _TENSORS = frozenset({"qweight", "steps", "mins", "bias"})

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in Q8Linear._TENSORS:  # new weights: whoever collected the old ones looks again
            self.__dict__["version"] = self.__dict__.get("version", 0) + 1
            Q8Linear.changes += 1

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self.__dict__["version"] = self.__dict__.get("version", 0) + 1
        Q8Linear.changes += 1

    def __init__(self, in_features: int, out_features: int, bias: bool, bits: int = 8) -> None:
        super().__init__()
        self.__dict__["version"] = 0  # counts new weights (see Fp16Linear)
        if in_features % Q8_GROUP:
            raise ValueError(f"q8 layers take inputs in groups of {Q8_GROUP}; this one has {in_features}.")
        if bits not in (8, 4) or (bits == 4 and in_features % (2 * Q8_GROUP)):
            raise ValueError(f"q8 layers keep 8 bits, or 4 with inputs a multiple of 64 (not {bits}, {in_features}).")
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        row = in_features if bits == 8 else in_features // 2
        self.register_buffer("qweight", torch.zeros(out_features, row, dtype=torch.uint8))
        self.register_buffer("steps", torch.zeros(out_features, in_features // Q8_GROUP))
        self.register_buffer("mins", torch.zeros(out_features, in_features // Q8_GROUP))
        self.register_buffer("bias", torch.zeros(out_features) if bias else None)

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        return linear.in_features % Q8_GROUP == 0

    @classmethod
    def from_linear(cls, linear: nn.Linear, four: bool = True) -> Q8Linear:
        """The layer in 8 bits, or in 4 where that rounds nothing 8 bits keep (``four``, inputs a multiple of 64)."""
        groups = _groups(linear.weight)
        rounding = 4e-7 * groups.abs().amax(dim=-1)  # float32's: a few units in the last place of the largest
        q, steps, mins, error = _q8_fit(groups)
        bits = 8
        if four and linear.in_features % (2 * Q8_GROUP) == 0:
            fit4 = _q4_fit(groups)
            if bool((fit4[3] <= error + rounding).all()):
                (q, steps, mins, error), bits = fit4, 4
        halves = _half_grid(groups, steps, mins, error + rounding, 15 if bits == 4 else 255)
        if halves is not None:
            q, steps, mins = halves
        q = q.to(torch.uint8).reshape(linear.weight.shape)
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, bits)
        layer.qweight, layer.steps, layer.mins = pack4(q) if bits == 4 else q, steps.contiguous(), mins.contiguous()
        if linear.bias is not None:
            layer.bias = linear.bias.detach().float().clone()
        return layer

    def parts(self) -> list[torch.Tensor]:
        """(weights, steps, minimums, bias or an empty tensor): what the native kernels take for this layer."""
        return [self.qweight, self.steps, self.mins, self.bias if self.bias is not None else _EMPTY]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from engine.quant import native

        built = native.module()
        if built is not None and x.dtype == torch.float32 and x.device.type == "cpu":
            if x.numel() >= PROMPT_ROWS * self.in_features:  # a prompt: its weights in float32, torch's GEMM
                return nn.functional.linear(x, built.q8_dequantize(self.parts()), self.bias)
            return built.q8_linear(x, self.parts())
        return q8_reference(x.float(), self.parts()).to(x.dtype)

    def extra_repr(self) -> str:
        shape = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{shape}, bias={self.bias is not None}, bits={self.bits}"


_EMPTY = torch.empty(0)


def q8_reference(x: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
    """What ``q8_linear`` computes, in torch (the integer sums exact; float sums in another order)."""
    qweight, steps, mins, bias = parts
    if qweight.shape[1] * 2 == steps.shape[1] * Q8_GROUP:  # 4 bits
        qweight = unpack4(qweight)
    flat = x.reshape(-1, x.shape[-1])
    q, xs = q8_activations(flat)
    groups = flat.shape[-1] // Q8_GROUP
    qi = q.reshape(-1, groups, Q8_GROUP).double()
    wi = qweight.reshape(-1, groups, Q8_GROUP).double()
    dots = torch.einsum("ngk,ogk->nog", qi, wi)  # exact: every sum is below 2**53
    y = (dots * steps.double()[None] * xs.double()[:, None]).sum(-1)
    y = y + (qi.sum(-1) * xs.double()) @ mins.double().T
    if bias.numel():
        y = y + bias.double()
    return y.float().reshape(*x.shape[:-1], qweight.shape[0])


class Int4Linear(nn.Module):
    """Group-wise asymmetric int4: ``w = (q - 8) * scale + zero`` per group of ``group_size`` inputs.

    ``qweight`` is in the kernel's packed layout (rows padded to a multiple of 16, as the
    kernel needs); that layout can differ between torch builds and CPU instruction sets,
    so saved copies carry :func:`int4_layout` and are rebuilt when it changes.
    ``scales_zeros`` is [in / group_size, padded out, 2].
    """

    qweight: torch.Tensor
    scales_zeros: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool, group_size: int = INT4_GROUP) -> None:
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        rows = -(-out_features // 16) * 16
        self.register_buffer("qweight", torch.zeros(rows, in_features // 2, dtype=torch.uint8))
        self.register_buffer("scales_zeros", torch.zeros(in_features // group_size, rows, 2, dtype=ACT_DTYPE))
        self.register_buffer("bias", torch.zeros(out_features, dtype=ACT_DTYPE) if bias else None)

    @staticmethod
    def fits(linear: nn.Linear, group_size: int = INT4_GROUP) -> bool:
        return linear.in_features % group_size == 0

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = INT4_GROUP) -> Int4Linear:
        n, k = linear.out_features, linear.in_features
        layer = cls(k, n, linear.bias is not None, group_size)
        rows = layer.qweight.shape[0]
        w = torch.zeros(rows, k)
        w[:n] = linear.weight.detach().float()
        groups = w.reshape(-1, group_size)
        lo, hi = groups.amin(dim=1, keepdim=True), groups.amax(dim=1, keepdim=True)
        scales = ((hi - lo) / 15).clamp(min=1e-6)
        q = ((groups - lo) / scales).round().clamp(0, 15).to(torch.int32).reshape(rows, k)
        layer.qweight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        zeros = lo + 8 * scales
        pairs = torch.cat([scales.reshape(rows, -1, 1), zeros.reshape(rows, -1, 1)], dim=2)
        layer.scales_zeros = pairs.transpose(0, 1).contiguous().to(ACT_DTYPE)
        if linear.bias is not None:
            layer.bias = linear.bias.detach().to(ACT_DTYPE).clone()
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(ACT_DTYPE).contiguous()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.qweight, self.group_size, self.scales_zeros)
        if y.shape[-1] != self.out_features:
            y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


@functools.cache
def int4_layout() -> str:
    """Fingerprint of the int4 kernel's packed layout on this torch build and CPU."""
    pattern = (torch.arange(32 * 128, dtype=torch.int32).reshape(32, 128) * 7919 // 13) % 16
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(pattern, 1)
    return hashlib.sha256(packed.numpy().tobytes()).hexdigest()[:16]
