"""Load a causal language model for the engine: device, dtype and weight mode chosen, then checked.

:func:`load_model` takes a :class:`~engine.api.ModelSpec` and returns a
:class:`LoadedModel`.  In order: the device (``auto``: CUDA if there is one);
the quantization mode, refused before anything is converted or downloaded if
it cannot run here; the source, resolved and converted by
:mod:`engine.model.source` (the given folder, ``.gguf`` file or hub id, else
the bundled SmolLM2-135M-Instruct GGUF); the tokenizer; the weights, in the
dtype the spec names or, for ``auto``, the one :func:`choose_dtype` picks
(on a CPU measured once by :mod:`engine.model.dtype_probe`); with
``quant="auto"`` the fastest CPU mode among ``AUTO_CANDIDATES``, measured once
by :mod:`engine.model.mode_probe`; float32 CPU linears packed for oneDNN; then
the end-of-turn ids and chat template checked (:mod:`engine.model.facts`).  The
chat template is tried on a few conversations right after the tokenizer loads,
bounded (:mod:`engine.model.template`): one that fails is refused before any
weights load.
``LoadedModel.identity`` fingerprints weights, dtype, mode, device and kernels
so that caches of different models never mix; ``info`` carries the load facts.

:func:`load_draft` loads a speculative-decoding draft on the target's device
and dtype and refuses a draft whose vocabulary differs from the target's.

Every failure a user can cause (missing, truncated or non-model file, unknown
hub id while offline, a mode or device this machine lacks) raises
:class:`ModelLoadError` with a message saying what happened and what to do.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.api import ModelSpec
from engine.model.facts import check_special_tokens, count_parameters
from engine.model.source import (
    ModelLoadError,
    Progress,
    bundled_model_path,
    converted_dir,
    resolve,
    take_fresh,
    wait_written,
)
from engine.model.template import check_template, template_file
from engine.paths import weights_fingerprint

__all__ = [
    "AUTO_CANDIDATES",
    "DTYPES",
    "LoadedModel",
    "ModeMeasurement",
    "ModelLoadError",
    "Progress",
    "bundled_model_path",
    "check_special_tokens",
    "choose_dtype",
    "converted_dir",
    "count_parameters",
    "load_draft",
    "load_model",
    "pick_device",
    "resolve",
]

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    name: str
    source: str  # the folder loaded; right after a first load converted it, call source.wait_written before reading
    device: torch.device
    dtype: torch.dtype
    quant: str
    identity: str  # fingerprint: caches of different models/dtypes/quant never mix
    eos_ids: frozenset[int]
    context_length: int
    load_s: float
    info: dict[str, Any] = field(default_factory=dict)
    measuring: ModeMeasurement | None = None  # quant="auto" loaded float32 and measures the modes later


@dataclass
class ModeMeasurement:
    """A first start's mode measurement left for later (``load_model(..., defer_probe=True)``).

    :meth:`steps` measures one step per ``next()`` (``engine.model.mode_probe.measure``), reusing the float32
    model already loaded as the reference; :meth:`finish` turns its result into the :class:`LoadedModel` to
    switch to, or None when float32 stays.  The engine runs the steps while it has nothing else to do.
    """

    key: str
    candidates: list[tuple[str, str]]
    build: Callable[[str, str], tuple[Any, dict[str, Any]]]
    assemble: Callable[[Any, dict[str, Any], str, str, dict[str, Any]], LoadedModel]
    reference: Any  # the float32 model in use

    def steps(self, clock: Any, tokenizer: Any) -> Any:
        from engine.model import mode_probe

        def build(mode: str, dtype_name: str) -> tuple[Any, dict[str, Any]]:
            if (mode, dtype_name) == mode_probe.REFERENCE and self.reference is not None:
                return self.reference, {}
            return self.build(mode, dtype_name)

        return mode_probe.measure(self.key, self.candidates, build, tokenizer, clock)

    def finish(self, result: tuple[str, str, dict[str, Any], Any]) -> LoadedModel | None:
        mode, dtype_name, record, built = result
        self.reference = None
        if (mode, dtype_name) == ("none", "float32") or built is None:
            return None
        model, qinfo = built
        return self.assemble(model, qinfo, mode, dtype_name, record)


@dataclass(frozen=True)
class Deferred:
    """``_auto_mode``'s answer when the measurement is left for later: what :class:`ModeMeasurement` measures."""

    key: str
    candidates: list[tuple[str, str]]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("CUDA was requested but no CUDA GPU is available. Choose device 'cpu' or 'auto'.")
    return torch.device(name)


def load_model(spec: ModelSpec, progress: Progress | None = None, defer_probe: bool = False) -> LoadedModel:
    """Load ``spec`` (see the module docstring).

    ``defer_probe``: where ``quant="auto"`` has no saved choice yet (a first start), load float32 now and leave
    the measurement in :attr:`LoadedModel.measuring` for the caller to run later (the window chats meanwhile).
    """
    progress = progress or (lambda _f, _m: None)
    start = time.perf_counter()
    device = pick_device(spec.device)
    from engine import quant

    auto = spec.quant == "auto"
    try:
        if not auto:
            quant.require(spec.quant, device)  # before converting or downloading anything
    except (quant.QuantUnavailable, ValueError) as exc:
        raise ModelLoadError(f"{exc} Choose another quantization in Settings or --quant.") from exc
    if spec.quant in ("fp16-cpu", "q8-cpu") and spec.dtype not in ("auto", "float32"):
        raise ModelLoadError(
            f"{spec.quant} keeps its own weights and computes in float32, so it does not run with precision "
            f"{spec.dtype}: set Precision to auto or float32 (--dtype), or choose another quantization."
        )
    as_is = _load_gguf_as_is(spec, device, progress, start)
    if as_is is not None:
        return as_is
    location, name = resolve(spec.source, progress)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    fresh = take_fresh(location)  # converted just now: in memory, its copy still being written (source.py)
    if fresh is None:
        wait_written(location)  # another load's conversion may still be writing the copy this one reads
    progress(0.7, "Loading tokenizer")
    try:
        tokenizer = fresh.tokenizer if fresh is not None else AutoTokenizer.from_pretrained(location)
    except OSError as exc:
        raise ModelLoadError(
            f"Could not load a tokenizer for {spec.source or name}: {exc}. A hub id needs a connection "
            "the first time; offline, give a local folder or .gguf file."
        ) from exc
    check_template(tokenizer, template_file(location, spec.source))  # a stranger's template, tried bounded
    progress(0.8, "Loading weights")
    dtype = choose_dtype(spec.dtype, device)
    weights_id = weights_fingerprint(location)
    mode = spec.quant
    mode_record: dict[str, Any] = {}
    built: tuple[Any, dict[str, Any]] | None = None

    def build(mode: str, dtype_name: str) -> tuple[Any, dict[str, Any]]:
        return _build(AutoModelForCausalLM, location, mode, DTYPES[dtype_name], device, progress)

    deferred: Deferred | None = None
    if auto:
        choice = _auto_mode(spec, device, dtype, weights_id, build, tokenizer, progress, defer_probe)
        if isinstance(choice, Deferred):
            deferred, choice = choice, ("none", "float32", DEFERRED_RECORD, None)
        mode, dtype_name, mode_record, built = choice
        dtype = DTYPES[dtype_name] if dtype_name else dtype
    if mode in quant.INT_MODES and dtype is None:
        dtype = torch.bfloat16  # the int kernels' fast activation dtype (measured: docs/log/2026-12-03-quantization.md)
    if mode in (*quant.BNB_MODES, "fp16-cpu", "q8-cpu") and dtype is None:
        dtype = torch.float32  # fp16-cpu: fbgemm takes float32 activations; q8-cpu quantizes float32 ones
    if (
        built is None
        and fresh is not None
        and (mode, dtype or torch.float32, device.type)
        == (
            "none",
            torch.float32,
            "cpu",
        )
    ):
        built = (fresh.model, {})  # the float32 model just converted, not read back from its copy
    if built is None:
        built = _build(AutoModelForCausalLM, location, mode, dtype or torch.float32, device, progress, pack=False)
    model, qinfo = built
    probe: dict[str, Any] = {}
    if dtype is None:
        from engine.model.dtype_probe import choose_cpu_dtype

        progress(0.9, "Measuring float32 against bfloat16 on this CPU (first start only)")
        dtype, probe, model = choose_cpu_dtype(model, tokenizer, f"{weights_id}|{torch.__version__}")

    def assemble(
        model: Any, qinfo: dict[str, Any], mode: str, dtype_name: str, mode_record: dict[str, Any]
    ) -> LoadedModel:
        return _assemble(
            model, qinfo, tokenizer, name, location, device, DTYPES[dtype_name], mode, weights_id, mode_record, start
        )

    loaded = _assemble(model, qinfo, tokenizer, name, location, device, dtype, mode, weights_id, mode_record, start)
    loaded.info["dtype_probe"] = probe
    if deferred is not None:

        def quiet_build(mode: str, dtype_name: str) -> tuple[Any, dict[str, Any]]:
            # its builds say nothing on the load's progress: the model is in by then, and answering
            return _build(AutoModelForCausalLM, location, mode, DTYPES[dtype_name], device, lambda _f, _m: None)

        loaded.measuring = ModeMeasurement(deferred.key, deferred.candidates, quiet_build, assemble, loaded.model)
    progress(1.0, "Ready")
    return loaded


GGUF_AS_IS = "gguf"  # LoadedModel.quant of a GGUF file run on its own blocks (engine.model.gguf_model)


def gguf_runs_as_is(spec: ModelSpec) -> bool:
    """Whether ``spec`` names a GGUF file that loads on its own blocks: a ``.gguf`` path (not the bundled
    model, whose Q4_1 file measured faster converted: docs/PERFORMANCE.md) with quantization ``auto`` or
    ``none`` on the CPU; any other mode asks for the file converted into that mode."""
    return (
        bool(spec.source)
        and spec.source.lower().endswith(".gguf")
        and Path(spec.source).expanduser().is_file()
        and spec.quant in ("auto", "none", GGUF_AS_IS)
        and spec.device in ("auto", "cpu")
        and spec.dtype in ("auto", "float32")
        and not torch.cuda.is_available()
    )


def _load_gguf_as_is(spec: ModelSpec, device: torch.device, progress: Progress, start: float) -> LoadedModel | None:
    """The GGUF file of ``spec`` on its own blocks, or None where it goes through the conversion (a file this
    path does not run: its reason is logged)."""
    if not gguf_runs_as_is(spec):
        return None

    from engine.model import gguf_model
    from engine.model.source import check_gguf, ollama_name

    path = Path(spec.source).expanduser()
    check_gguf(path)
    progress(0.1, "Reading the GGUF header")
    file = gguf_model.read_header(path)
    try:
        gguf_model.check(file)
        gguf_model.check_memory(file)
        progress(0.3, "Loading tokenizer")
        tokenizer = gguf_model.read_tokenizer(path)
        check_template(tokenizer, f"the chat template in {path.name}")
        progress(0.6, "Mapping weights")
        model = gguf_model.build_model(file, gguf_model.read_config(file))
    except gguf_model.Unsupported as exc:
        log.info("%s is converted: %s", path.name, exc)
        return None
    weights_id = gguf_model.fingerprint(file)
    types = sorted({gguf_model.TYPES[k] for _, k, _ in file.tensors.values()} - {"F32"})
    record = {"mode": GGUF_AS_IS, "reason": f"the file's own blocks ({', '.join(types)}), memory-mapped"}
    name = ollama_name(path) or path.stem
    loaded = _assemble(model, {}, tokenizer, name, str(path), device, torch.float32, GGUF_AS_IS, weights_id,
                       record, start)  # fmt: skip
    loaded.info["gguf_types"] = types
    loaded.info["file_bytes"] = file.size
    progress(1.0, "Ready")
    return loaded


DEFERRED_SKIP = ("int8-cpu",)  # not measured between replies (see _auto_mode)
DEFERRED_RECORD = {
    "mode": "none",
    "dtype": "float32",
    "chosen": "float32",
    "reason": "float32 answers while the other weight modes are measured in the background (first start only)",
    "deferred": True,
}


def _assemble(
    model: Any,
    qinfo: dict[str, Any],
    tokenizer: Any,
    name: str,
    location: str,
    device: torch.device,
    dtype: torch.dtype,
    mode: str,
    weights_id: str,
    mode_record: dict[str, Any],
    start: float,
) -> LoadedModel:
    """The :class:`LoadedModel` of a built ``model``: float32 CPU linears packed, end-of-turn ids checked."""
    from engine import quant
    from engine.model.packed import PackedLinear, pack_linears

    if mode == "none" and device.type == "cpu" and dtype == torch.float32:
        pack_linears(model)  # oneDNN-packed float32 matmuls (engine/packed.py); skips layers already packed
    packed = sum(isinstance(m, PackedLinear) for m in model.modules())
    eos_ids = check_special_tokens(model, tokenizer)
    context = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
    kernels = "packed" if packed else "plain"  # rounding differs between kernels: their KV must not mix
    identity = hashlib.sha256(f"{weights_id}|{dtype}|{mode}|{device.type}|{kernels}".encode()).hexdigest()[:16]
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        source=location,
        device=device,
        dtype=dtype,
        quant=mode,
        identity=identity,
        eos_ids=eos_ids,
        context_length=context,
        load_s=time.perf_counter() - start,
        info={
            "parameters": count_parameters(model),
            "weight_bytes": quant.weight_bytes(model),
            "quant": mode,
            "dtype_probe": {},
            "mode_probe": mode_record,
            "packed_linears": packed,
            **qinfo,
        },
    )


def _build(
    auto_model: Any,
    location: str,
    mode: str,
    dtype: torch.dtype,
    device: torch.device,
    progress: Progress,
    pack: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """The model at ``location`` in ``mode``/``dtype`` (float32 CPU linears packed when ``pack``), and load facts."""
    from engine import quant

    qinfo: dict[str, Any] = {}
    wait_written(location)  # a conversion's copy still being written (engine.model.source.converted_dir)
    try:
        if mode == "none":
            model = auto_model.from_pretrained(location, dtype=dtype)
            model.to(device)
        else:
            q = quant.load_quantized_model(location, mode, dtype, device, progress)
            model = q.model  # already placed; a bnb model must not be moved
            qinfo = {"quant_cached": q.cached, "quant_load_s": q.seconds}
    except Exception as exc:
        raise ModelLoadError(f"Could not load model weights from {location}: {exc}") from exc
    model.eval()
    if pack and mode == "none" and device.type == "cpu" and dtype == torch.float32:
        from engine.model.packed import pack_linears

        pack_linears(model)
    return model, qinfo


AUTO_CANDIDATES = (
    ("none", "float32"),
    ("fp16-cpu", "float32"),
    ("q8-cpu", "float32"),
    ("int8-cpu", "bfloat16"),
    ("none", "bfloat16"),
)


def _auto_mode(
    spec: ModelSpec,
    device: torch.device,
    dtype: torch.dtype | None,
    weights_id: str,
    build: Callable[[str, str], tuple[Any, dict[str, Any]]],
    tokenizer: Any,
    progress: Progress,
    defer_probe: bool = False,
) -> tuple[str, str, dict[str, Any], tuple[Any, dict[str, Any]] | None] | Deferred:
    """``quant="auto"``: (mode, dtype name or "" for the usual choice, record, model if the probe built it).

    With ``defer_probe`` and nothing saved: the :class:`Deferred` candidates to measure later instead.
    """
    from engine import quant
    from engine.model import mode_probe

    if device.type != "cpu":
        why = f"auto measures CPU modes only; on {device.type} it uses none"
        return "none", "", {"mode": "none", "reason": why}, None
    if spec.dtype not in ("auto", "float32"):
        why = f"auto compares modes against float32; with precision {spec.dtype} it uses no quantization"
        return "none", "", {"mode": "none", "reason": why}, None
    candidates = []
    native_bf16 = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
    for mode, dtype_name in AUTO_CANDIDATES:
        if mode in quant.NEVER_DEFAULT or (spec.dtype == "float32" and dtype_name != "float32"):
            continue
        if (mode, dtype_name) == ("none", "bfloat16") and not native_bf16:
            continue  # no bfloat16 matmuls: prefill is several times float32's (docs/log/2026-12-03-quantization.md)
        try:
            if mode != "none":
                quant.require(mode, device)
        except quant.QuantUnavailable:
            continue
        candidates.append((mode, dtype_name))
    key = f"{weights_id}|{mode_probe.machine()}|dtype {spec.dtype}"
    if defer_probe and len(candidates) > 1 and mode_probe.usable_record(key, candidates) is None:
        # between replies every step must be short: int8-cpu's first build (quantizing, about 10 s on the
        # bundled model) would hold a reply that long, and q8-cpu covers 8-bit weights with exact sums
        return Deferred(key, [c for c in candidates if c[0] not in DEFERRED_SKIP])
    if mode_probe.recorded(key) is None:
        progress(0.85, "Measuring which weight mode is fastest on this CPU (first start only)")
    return mode_probe.choose_mode(key, candidates, build, tokenizer)


def load_draft(spec: ModelSpec, target: LoadedModel) -> LoadedModel:
    """Load ``spec.draft`` on the target's device and dtype, quantized with ``spec.draft_quant``;
    refuse a different vocabulary.  A quantized draft cannot change a greedy reply (every
    drafted token is verified by the target; sampled replies keep the target's distribution);
    it only changes how many drafts are accepted."""
    # the target's dtype for what is not quantized; fp16-cpu computes in float32 whatever the target does
    dtype = "float32" if spec.draft_quant in ("fp16-cpu", "q8-cpu") else str(target.dtype).removeprefix("torch.")
    draft = load_model(ModelSpec(source=spec.draft, device=target.device.type, dtype=dtype, quant=spec.draft_quant))
    ours, theirs = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if ours != theirs:
        differing = sorted(set(ours.items()) ^ set(theirs.items()))[:3]
        raise ModelLoadError(
            f"The draft model {spec.draft} has a different vocabulary from the target ({len(theirs)} vs "
            f"{len(ours)} tokens; e.g. {differing}). Pick a draft from the same model family."
        )
    head = draft.model.get_output_embeddings()  # an nn.Linear, or a quantized layer without .weight
    out_rows = int(getattr(head, "out_features", 0) or head.weight.shape[0])
    if out_rows < len(ours):
        raise ModelLoadError(
            f"The draft model {spec.draft} predicts only {out_rows} tokens; the target needs {len(ours)}."
        )
    return draft


def choose_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """The dtype to load in; None means "measure on this CPU" (see ``engine.model.dtype_probe``)."""
    if name != "auto":
        if name not in DTYPES:
            raise ModelLoadError(f"Unknown dtype {name!r}; choose one of auto, {', '.join(DTYPES)}.")
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16
    return None
