"""Fill-in-the-middle prompts for llama.cpp's ``/infill``: the code around the cursor in a code model's FIM tokens.

:func:`fim_tokens` finds a model's FIM tokens by name in its tokenizer's
vocabulary (Qwen2.5-Coder's ``<|fim_prefix|>``, ``<|fim_suffix|>``,
``<|fim_middle|>``, ``<|repo_name|>``, ``<|file_sep|>``; StarCoder's
``<fim_prefix>`` ... the same without bars); a model without the first three
cannot infill, and ``/infill`` says so.  :func:`fim_ids` lays the request out
token for token as llama-server does (``format_infill`` in its
``tools/server/utils.hpp``, with the ``/infill`` handler of ``server.cpp``)::

    <|repo_name|>myproject\\n
    <|file_sep|>{chunk 0 filename, "tmp" when left out}\\n{chunk 0 text}
    <|file_sep|>{chunk 1 filename}\\n{chunk 1 text} ...
    <|file_sep|>filename\\n
    [BOS when the tokenizer adds one]<|fim_prefix|>{input_prefix}{prompt}<|fim_suffix|>{input_suffix}<|fim_middle|>

Each piece is tokenised on its own (so two pieces never merge into one token),
``input_prefix``, ``input_suffix`` and the chunks with a control token's text
read as plain text, ``prompt`` (the start of the cursor's line that llama.vim
sends) with control tokens parsed.  Without ``<|file_sep|>`` each chunk is set
off by ``"\\n\\n--- snippet ---\\n\\n"``, without ``<|repo_name|>`` the first line is
left out.  Cut as llama-server cuts with its default batch of 2048 tokens: the
prefix's last 1536 tokens, the suffix's first ``512 - 2 - len(prompt)``, the
chunks' last ``context - 2048 + 2`` tokens (none in a context of 2048 or less).

:func:`cut_indent` is llama-server's ``n_indent`` rule: a completion ends before
the first line (after its first) indented less than ``n_indent``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SNIPPET = "\n\n--- snippet ---\n\n"  # llama-server's separator between chunks for a model without file_sep
REPO = "myproject\n"  # llama-server's repository name line
FILE = "filename\n"  # llama-server's name line for the file being edited
CHUNK_FILE = "tmp"  # llama-server's name for a chunk sent without one
N_BATCH = 2048  # llama-server's default batch, which sizes the prefix and suffix it keeps
N_PREDICT = -1  # llama-server's default n_predict, which sizes the chunks it keeps
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
        if not isinstance(item, Mapping) or not isinstance(item.get("text"), str):
            raise ValueError(f"input_extra[{i}] must be an object with a 'text'.")
        filename = item.get("filename", CHUNK_FILE)
        if not isinstance(filename, str):
            raise ValueError(f"input_extra[{i}].filename must be a text.")
        out.append(Chunk(filename, item["text"]))
    return out


def fim_ids(
    tokenizer: Any,
    fim: Fim,
    prefix: str,
    suffix: str,
    prompt: str,
    extra: Sequence[Chunk],
    context: int,
) -> list[int]:
    """The prompt's token ids for one infill, as llama-server's ``format_infill`` makes them."""
    vocabulary = tokenizer.get_vocab()

    def text(value: str) -> list[int]:  # control tokens' texts read as text (llama.cpp's parse_special false)
        return list(tokenizer(value, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else []
    extra_ids: list[int] = []
    if fim.repo:
        extra_ids += [vocabulary[fim.repo], *text(REPO)]
    for chunk in extra:
        extra_ids += [vocabulary[fim.sep], *text(chunk.filename + "\n")] if fim.sep else text(SNIPPET)
        extra_ids += text(chunk.text)
    if fim.sep:
        extra_ids += [vocabulary[fim.sep], *text(FILE)]
    prefix_ids, suffix_ids = text(prefix), text(suffix)
    prefix_take = min(len(prefix_ids), 3 * (N_BATCH // 4))
    suffix_take = min(len(suffix_ids), max(0, N_BATCH // 4 - (2 + len(prompt_ids))))
    extra_take = min(max(0, context - N_BATCH - 2 * N_PREDICT), len(extra_ids))
    start = [vocabulary[fim.prefix], *prefix_ids[len(prefix_ids) - prefix_take :], *prompt_ids]
    bos = _bos(tokenizer)
    if bos is not None:
        start.insert(0, bos)
    end = [vocabulary[fim.suffix], *suffix_ids[:suffix_take]]
    return [*extra_ids[len(extra_ids) - extra_take :], *start, *end, vocabulary[fim.middle]]


def _bos(tokenizer: Any) -> int | None:
    """The start token the tokenizer puts first by itself (llama.cpp's add_bos), or None."""
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    marked = list(tokenizer("a")["input_ids"])
    return marked[0] if len(marked) > len(plain) and marked[-len(plain) :] == plain else None


def cut_indent(text: str, n_indent: int) -> tuple[str, bool]:
    """``text`` ended as llama-server ends a completion with ``n_indent``: at the first line after the first
    whose indent (spaces and tabs) is less than ``n_indent`` and that has more than its indent, the line kept
    up to its indent; True when it was cut."""
    if n_indent <= 0:
        return text, False
    at = text.find("\n")
    while at != -1:
        pos = at + 1
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and pos - (at + 1) < n_indent:
            return text[:pos], True
        at = text.find("\n", at + 1)
    return text, False


def nested(fields: Sequence[str], result: Mapping[str, Any]) -> dict[str, Any]:
    """llama-server's ``response_fields``: each path (``"timings/prompt_n"``) found in ``result``, keyed by
    the path as sent; a path not there is left out."""
    out: dict[str, Any] = {}
    for path in fields:
        current: Any = result
        for key in path.split("/"):
            if not isinstance(current, Mapping) or key not in current:
                break
            current = current[key]
        else:
            out[path] = current
    return out
