"""Fill-in-the-middle prompts for llama.cpp's ``/infill``: the code around the cursor in a code model's FIM tokens.

:func:`fim_tokens` finds a model's FIM tokens by name in its tokenizer's
vocabulary (Qwen2.5-Coder's ``<|fim_prefix|>``, ``<|fim_suffix|>``,
``<|fim_middle|>``, ``<|repo_name|>``, ``<|file_sep|>``; StarCoder's
``<fim_prefix>`` ... the same without bars); a model without the first three
cannot infill, and ``/infill`` says so.  :func:`fim_prompt` lays the request out
as llama-server does (``format_infill`` in its ``utils.hpp``), so the two servers
read the same prompt from the same request::

    <|repo_name|>myproject
    <|file_sep|>{chunk 0 filename}
    {chunk 0 text}<|file_sep|>{chunk 1 filename}
    {chunk 1 text}<|file_sep|>filename
    <|fim_prefix|>{input_prefix}{prompt}<|fim_suffix|>{input_suffix}<|fim_middle|>

(``prompt``, the start of the cursor's line that llama.vim sends, goes after the
prefix, as llama-server's code puts it; without ``<|file_sep|>`` each chunk is
set off by ``"\\n\\n--- snippet ---\\n\\n"``, without ``<|repo_name|>`` the
first line is left out).  The prompt is text that the engine tokenises with its
control tokens parsed, so code that itself holds a control token's text is
refused (:func:`control_text`) rather than read as markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SNIPPET = "\n\n--- snippet ---\n\n"  # llama-server's separator between chunks for a model without file_sep
REPO = "myproject\n"  # llama-server's repository name line
FILE = "filename\n"  # llama-server's name line for the file being edited
# each family's names: prefix, suffix, middle, repository, file separator
FAMILIES = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<repo_name>", "<file_sep>"),  # StarCoder 1 and 2
)


@dataclass(frozen=True)
class Fim:
    prefix: str
    suffix: str
    middle: str
    repo: str = ""  # "" when the model has none
    sep: str = ""


@dataclass(frozen=True)
class Chunk:
    filename: str
    text: str


def fim_tokens(tokenizer: Any) -> Fim | None:
    """The model's FIM tokens, or None when it has no prefix, suffix and middle tokens of a known family."""
    vocabulary = tokenizer.get_vocab()
    for names in FAMILIES:
        if all(name in vocabulary for name in names[:3]):
            repo, sep = (name if name in vocabulary else "" for name in names[3:])
            return Fim(*names[:3], repo=repo, sep=sep)
    return None


def chunks_from(value: Any) -> list[Chunk]:
    """``input_extra``: a list of ``{"filename", "text"}`` (other keys, such as llama.vim's ``time``, unused)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError('\'input_extra\' must be a list of {"filename", "text"} objects.')
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or not isinstance(item.get("text", ""), str):
            raise ValueError(f"input_extra[{i}] must be an object with a 'text'.")
        filename = item.get("filename", "")
        if not isinstance(filename, str):
            raise ValueError(f"input_extra[{i}].filename must be a text.")
        out.append(Chunk(filename, item.get("text", "")))
    return out


def fim_prompt(fim: Fim, prefix: str, suffix: str, prompt: str, extra: Sequence[Chunk]) -> str:
    """The prompt text for one infill, laid out as llama-server lays it out."""
    parts = [fim.repo + REPO] if fim.repo else []
    for chunk in extra:
        parts.append(f"{fim.sep}{chunk.filename}\n{chunk.text}" if fim.sep else SNIPPET + chunk.text)
    if fim.sep:
        parts.append(fim.sep + FILE)
    parts.append(f"{fim.prefix}{prefix}{prompt}{fim.suffix}{suffix}{fim.middle}")
    return "".join(parts)


def control_text(texts: Sequence[str], specials: Sequence[str]) -> str:
    """The first control token's text found in ``texts`` ("" when none holds one)."""
    for text in texts:
        for special in specials:
            if special in text:
                return special
    return ""
