"""Replies that match a JSON schema, a regex, a list of choices or a Lark grammar, by construction.

``Sampling.format`` (``engine.api.reply_format``) names the format as JSON text; :func:`compile_format`
turns it into a :class:`Grammar` for one reply through llguidance (chosen over xgrammar: no
dependencies where xgrammar pulls triton and a TVM runtime, about 200 MB a CPU app never uses, and
its forced tokens follow the model tokenizer's canonical splits; measured on this CPU in
``docs/PERFORMANCE.md``).  A bad schema, regex or grammar raises :class:`FormatError` with the
library's message before the model runs.

The decode loop (``engine.runtime.steps``) uses a :class:`Grammar` in three places:

* every logits row it samples from is masked (:meth:`Grammar.masked`): the tokens the grammar does
  not allow next get -inf, so greedy and sampled replies alike stay inside the format;
* where the grammar allows exactly one continuation (a key name, a closing brace, the rest of a
  fixed word), :meth:`Grammar.forced` gives its tokens, fed with the next real step in one forward
  and checked there like drafts (``forced`` provenance): no model step of their own, and a reply
  equal token for token to the constrained reply without jump-forward;
* speculative drafts are cut at the first token the grammar rejects (:meth:`Grammar.valid_prefix`),
  and verification masks each row with the grammar's state after the drafts before it
  (:meth:`Grammar.masks_along`), so speculation never changes the constrained output.

Compiled grammars are cached by the format's text, and the tokenizer's llguidance view (about 0.3 s
to build, on the first reply with a format) once per tokenizer.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import weakref
from typing import TYPE_CHECKING, Any

from engine.api import FORMAT_KINDS

if TYPE_CHECKING:  # torch is imported where a reply is decoded: the format check of a front end needs none
    import torch

# JSON as a person reads it and as the model was trained on (Python's json.dumps separators), no free
# whitespace: a small model given free whitespace under a schema can spend its token budget on newlines
JSON_DEFAULTS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_CACHED_GRAMMARS = 64
JUMP_FORWARD = True  # feed forced tokens with the next step (off only to show, in tests, that they change nothing)


class FormatError(ValueError):
    """The reply format cannot be used; the message (the library's, where it has one) is for the user."""


def grammar_text(format_json: str) -> str:
    """The llguidance grammar for ``format_json`` (``engine.api.reply_format``); raises :class:`FormatError`."""
    import llguidance

    try:
        spec = json.loads(format_json)
    except json.JSONDecodeError as exc:
        raise FormatError(f"The reply format is not valid JSON: {exc}") from None
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind not in FORMAT_KINDS:
        raise FormatError(f"Unknown reply format {kind!r}; choose one of {', '.join(FORMAT_KINDS)}.")
    try:
        if kind == "json_object":
            return str(llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS))
        if kind == "json_schema":
            schema = spec.get("schema")
            if not isinstance(schema, dict):
                raise FormatError('A JSON schema must be a JSON object, such as {"type": "object", ...}.')
            return str(llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS))
        if kind == "regex":
            pattern = spec.get("pattern")
            if not isinstance(pattern, str) or not pattern:
                raise FormatError("A regex format needs a non-empty pattern.")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise FormatError(f"The regex {pattern!r} is not valid: {exc}.") from None
            return str(llguidance.LLMatcher.grammar_from_regex(pattern))
        if kind == "choice":
            choices = spec.get("choices")
            if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
                raise FormatError("A choice format needs a list of one or more non-empty texts.")
            return str(llguidance.LLMatcher.grammar_from_regex("|".join(re.escape(c) for c in choices)))
        grammar = spec.get("grammar")
        if not isinstance(grammar, str) or not grammar.strip():
            raise FormatError("A Lark grammar format needs the grammar's text.")
        return str(llguidance.LLMatcher.grammar_from_lark(grammar))
    except FormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - llguidance raises ValueError and its own types
        raise FormatError(f"The reply format cannot be used: {exc}") from None


def format_problems(format_json: str) -> list[str]:
    """What is wrong with a reply format, in the library's words where it has them (empty: usable).
    Needs no model: a front end says it before anything loads."""
    import llguidance

    if not format_json:
        return []
    try:
        grammar = _checked_grammar(format_json)
    except FormatError as exc:
        return [str(exc)]
    problem = llguidance.LLMatcher.validate_grammar(grammar)
    return [f"The reply format cannot be used: {problem}"] if problem else []


_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_tokenizers_lock = threading.Lock()


def ll_tokenizer(tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]) -> Any:
    """llguidance's view of ``tokenizer`` (built once per tokenizer: about 0.3 s for a 49,152-token one)."""
    import llguidance.hf

    with _tokenizers_lock:
        known = _tokenizers.get(tokenizer)
        if known is not None and known[0] == (vocab_size, eos_ids):
            return known[1]
        # no slices: with llguidance's default ones the first mask costs 1.3 s (SmolLM2) to precompute them;
        # without, a mask inside a JSON string costs at most 0.5 ms instead of 0.06 ms (a step is about 8 ms)
        built = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=sorted(eos_ids), slices=[])
        _tokenizers[tokenizer] = ((vocab_size, eos_ids), built)
        return built


@functools.lru_cache(maxsize=_CACHED_GRAMMARS)
def _checked_grammar(format_json: str) -> str:
    return grammar_text(format_json)


def compile_format(format_json: str, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]) -> Grammar:
    """A :class:`Grammar` for one reply in ``format_json``; raises :class:`FormatError` before any model step."""
    import llguidance

    grammar = _checked_grammar(format_json)
    lltok = ll_tokenizer(tokenizer, vocab_size, eos_ids)
    problem = llguidance.LLMatcher.validate_grammar(grammar, lltok)
    if problem:
        raise FormatError(f"The reply format cannot be used: {problem}")
    matcher = llguidance.LLMatcher(lltok, grammar)
    if matcher.is_error():
        raise FormatError(f"The reply format cannot be used: {matcher.get_error()}")
    return Grammar(matcher, vocab_size)


class Grammar:
    """One reply's grammar state: which tokens may come next, and what is forced."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        import torch

        self._matcher = matcher
        self._vocab = vocab_size
        self._words = torch.full(((vocab_size + 31) // 32,), -1, dtype=torch.int32)  # the matcher fills it
        self._shifts = torch.arange(32, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        """A bool per vocabulary entry: True where the token may come next.  llguidance fills a bitmask
        (``unsafe_compute_mask_ptr``, as its ``llguidance.torch`` helper does); that helper's apply step is
        ``torch.compile``d (1.4 s on first use, and a C compiler at run time), so the bits are read here."""
        self._matcher.unsafe_compute_mask_ptr(self._words.data_ptr(), self._words.numel() * 4)
        bits = (self._words.unsqueeze(-1) >> self._shifts) & 1
        return bits.reshape(-1)[: self._vocab].bool()

    def masked(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (one row) with every token the grammar does not allow next set to -inf."""
        allowed = self.allowed()
        out = logits.float().clone()
        n = min(out.shape[-1], allowed.shape[0])
        out[:n].masked_fill_(~allowed[:n], float("-inf"))
        out[n:] = float("-inf")  # rows past the grammar's vocabulary: no token
        return out

    def masks_along(self, logits: torch.Tensor, drafts: list[int]) -> torch.Tensor:
        """``logits`` (``[len(drafts) + 1, vocab]``) with row i masked by the state after ``drafts[:i]``."""
        rows = [self.masked(logits[0])]
        taken = 0
        for token in drafts:
            if not self._matcher.consume_token(token):
                break
            taken += 1
            rows.append(self.masked(logits[taken]))
        if taken:
            self._matcher.rollback(taken)
        assert taken == len(drafts), "drafts are cut to the grammar before they are verified"
        import torch

        return torch.stack(rows)

    def valid_prefix(self, drafts: list[int]) -> int:
        """How many of ``drafts``, from the first, the grammar accepts (nothing is consumed)."""
        return int(self._matcher.validate_tokens(drafts)) if drafts else 0

    def forced(self) -> list[int]:
        """The tokens the grammar allows as the only continuation now (empty when there is a choice)."""
        if not JUMP_FORWARD or self._matcher.is_stopped():
            return []
        return list(self._matcher.compute_ff_tokens())

    def accept(self, tokens: list[int] | tuple[int, ...]) -> None:
        """The reply took ``tokens``; they must be allowed (the loop only takes masked picks)."""
        for token in tokens:
            if self._matcher.is_stopped():
                return  # the end-of-reply token after a finished grammar: the reply is over anyway
            if not self._matcher.consume_token(token):
                raise FormatError(f"The reply left its format: {self._matcher.get_error()}")

    @property
    def complete(self) -> bool:
        """Whether the reply so far is a whole match of the format (it may end here)."""
        return bool(self._matcher.is_accepting() or self._matcher.is_stopped())
