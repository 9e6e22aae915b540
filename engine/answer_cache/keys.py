"""What a cached answer is keyed on: the model's identity, a hash of its context, the normalised question.

* :class:`ModelIdentity` names the exact weights that produced an answer (name,
  weight fingerprint, dtype, quantization); its :attr:`~ModelIdentity.key` is a
  hash of canonical JSON, so two identities are the same only if all four match.
* :func:`context_hash` hashes everything else the answer depends on: the
  messages before the question (system prompt and earlier turns), the enabled
  tools and their data versions, and the sampling settings.  For greedy sampling
  the settings that cannot change a greedy reply (``seed``, ``top_p``,
  ``top_k``) are left out, so they do not split the cache.
* :func:`normalise` folds case and whitespace and drops the punctuation that
  ends a sentence (``?``, ``!``, ``.``, ``…`` and their full-width forms), so
  "what is the capital of france" and "What is the capital of France?" are one
  question; :func:`question_hash` hashes the normalised form (exact hits compare
  hashes, so a huge question is never compared or stored twice).  The embedder
  reads :func:`fold` (case and whitespace only): the punctuation is part of what
  its vectors were measured on.
* :class:`CacheKey` bundles all of it for one request; build it with
  :meth:`CacheKey.for_messages` or :meth:`CacheKey.for_request`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine.api import Request, Sampling

_SPACE = re.compile(r"\s+")
# what may end a question without changing it: ? ! . … and their full-width, small and ideographic forms
_TRAILING = re.compile(r"[\s?!.\u2026\uff1f\uff01\uff0e\u3002\uff61\ufe56\ufe57\ufe15\ufe16]+$")
_GREEDY_IRRELEVANT = ("seed", "top_p", "top_k")


def fold(question: str) -> str:
    """Lower case, whitespace runs collapsed to one space, ends stripped (Unicode case folding)."""
    return _SPACE.sub(" ", question).strip().casefold()


def normalise(question: str) -> str:
    """:func:`fold`, then the trailing ``?``/``!``/``.``/``…`` (any number, any width) dropped.

    A question that is nothing but such marks keeps them (``"?"`` and ``"!"`` stay two questions).
    """
    folded = fold(question)
    return _TRAILING.sub("", folded) or folded


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def question_hash(question: str) -> str:
    """The hash of the normalised question: what exact hits compare."""
    return _sha(normalise(question))


@dataclass(frozen=True)
class ModelIdentity:
    """The exact model that produced an answer; answers of another identity never hit."""

    name: str
    weight_hash: str = ""  # see weights_fingerprint()
    dtype: str = ""
    quant: str = "none"

    @property
    def key(self) -> str:
        return _sha(canonical_json(asdict(self)))


def weights_fingerprint(path: str | Path, sample_bytes: int = 1 << 20) -> str:
    """A fast fingerprint of a weights file or folder: names, sizes, and the first and last MiB of each file.

    Reading whole multi-GB files would delay every start; a changed file
    almost always changes its size or its head or tail (headers hold shapes
    and offsets).  Raises ``FileNotFoundError`` for a missing path.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"No weights at {root}; check the model path.")
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    digest = hashlib.sha256()
    for file in files:
        if file.suffix not in {".safetensors", ".bin", ".gguf", ".pt", ".json", ".model"}:
            continue
        size = file.stat().st_size
        digest.update(f"{file.relative_to(root) if root.is_dir() else file.name}\0{size}\0".encode())
        with open(file, "rb") as handle:
            digest.update(handle.read(sample_bytes))
            if size > sample_bytes:
                handle.seek(max(sample_bytes, size - sample_bytes), os.SEEK_SET)
                digest.update(handle.read(sample_bytes))
    return digest.hexdigest()[:32]


def sampling_dict(sampling: Sampling | Mapping[str, Any] | None) -> dict[str, Any]:
    """The sampling settings that can change the reply, as plain values."""
    values = dict(asdict(sampling) if isinstance(sampling, Sampling) else dict(sampling or asdict(Sampling())))
    if not values.get("stop_repeats"):  # off: the keys answers were kept under before the field existed
        values.pop("stop_repeats", None)
    if not values.get("format"):  # free text: likewise; a format keys the answer (a JSON reply is another reply)
        values.pop("format", None)
    if "stop" in values:
        values["stop"] = list(values["stop"])
    for name in ("logit_bias", "presence_penalty", "frequency_penalty"):  # off: keys from before they existed
        if not values.get(name):
            values.pop(name, None)
    if "logit_bias" in values:
        values["logit_bias"] = sorted([int(t), float(b)] for t, b in values["logit_bias"])
    values.pop("logprobs", None)  # they change no text; a request that asks for them is never answered
    values.pop("top_logprobs", None)  # from the cache (Request.answer_cache is off), which keeps none
    if float(values.get("temperature", 0.0)) == 0.0:
        for name in _GREEDY_IRRELEVANT:
            values.pop(name, None)
    return values


def is_deterministic(sampling: Sampling | Mapping[str, Any] | None) -> bool:
    return float(sampling_dict(sampling).get("temperature", 0.0)) == 0.0


def context_hash(
    messages: Sequence[Mapping[str, str]],
    *,
    tools: Sequence[str] = (),
    tool_versions: Mapping[str, str] | None = None,
    sampling: Sampling | Mapping[str, Any] | None = None,
    documents: Sequence[str] = (),
) -> str:
    """Hash of everything an answer depends on besides the question.

    ``messages`` are the messages *before* the question (system prompt and
    earlier turns, in order); ``tools`` the enabled tools (order ignored);
    ``tool_versions`` a version of each tool's data (a changed version
    changes the hash, so answers built on old data stop hitting); ``documents`` the attached documents'
    content hashes (order ignored; none: the hash of every key made before documents existed).
    """
    turns = [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in messages]
    payload = {
        "messages": turns,
        "tools": sorted(set(tools)),
        "tool_versions": {k: str(v) for k, v in sorted((tool_versions or {}).items())},
        "sampling": sampling_dict(sampling),
    }
    if documents:
        payload["documents"] = sorted(set(documents))
    return _sha(canonical_json(payload))


def split_question(messages: Sequence[Mapping[str, str]]) -> tuple[list[Mapping[str, str]], str]:
    """(the messages before the question, the question): the question is the last message, a user turn."""
    if not messages or messages[-1].get("role") != "user":
        raise ValueError("The messages must end with the user's question; add a user message last.")
    return list(messages[:-1]), str(messages[-1].get("content", ""))


@dataclass(frozen=True)
class CacheKey:
    """Everything a lookup or a store needs for one request."""

    identity: ModelIdentity
    context: str  # context_hash(...)
    question: str  # the original question text
    deterministic: bool = True  # temperature 0
    tools: tuple[str, ...] = field(default=())

    @property
    def question_key(self) -> str:
        return question_hash(self.question)

    @classmethod
    def for_messages(
        cls,
        identity: ModelIdentity,
        messages: Sequence[Mapping[str, str]],
        sampling: Sampling | Mapping[str, Any] | None = None,
        *,
        tools: Sequence[str] = (),
        tool_versions: Mapping[str, str] | None = None,
        documents: Sequence[str] = (),
    ) -> CacheKey:
        before, question = split_question(messages)
        ctx = context_hash(before, tools=tools, tool_versions=tool_versions, sampling=sampling, documents=documents)
        return cls(identity, ctx, question, is_deterministic(sampling), tuple(sorted(set(tools))))

    @classmethod
    def for_request(
        cls, identity: ModelIdentity, request: Request, tool_versions: Mapping[str, str] | None = None
    ) -> CacheKey:
        return cls.for_messages(
            identity,
            request.messages,
            request.sampling,
            tools=request.tools,
            tool_versions=tool_versions,
            documents=request.documents,
        )
