"""Replies that match a JSON schema, a regex, a list of choices or a Lark grammar, by construction.

``Sampling.format`` (``engine.api.reply_format``) names the format as JSON text; :func:`compile_format`
turns it into a :class:`Grammar` for one reply through llguidance (chosen over xgrammar: no
dependencies where xgrammar pulls triton and a TVM runtime, about 200 MB a CPU app never uses, and
its forced tokens follow the model tokenizer's canonical splits; measured on this CPU in
``docs/PERFORMANCE.md``).  A bad schema, regex or grammar raises :class:`FormatError` before the model
runs: first the bounds of ``engine.runtime.format_limits`` (size, depth, ``$ref`` chains, repeats, no
finite reply), in pure Python, since past them llguidance can end the process; then the library's own
check, under :data:`LIMITS`, its message cut to one line (:func:`said`), never its state dump.

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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.api import FORMAT_KINDS
from engine.runtime.format_limits import FormatError as FormatError  # raised here too: one error type
from engine.runtime.format_limits import check, check_grammar, check_size

if TYPE_CHECKING:  # torch is imported where a reply is decoded: the format check of a front end needs none
    import torch

# JSON as a person reads it and as the model was trained on (Python's json.dumps separators), no free
# whitespace: a small model given free whitespace under a schema can spend its token budget on newlines
JSON_DEFAULTS: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_CACHED_GRAMMARS = 64
JUMP_FORWARD = True  # feed forced tokens with the next step (off only to show, in tests, that they change nothing)


_SAID = 300  # characters of a library message a user sees (llguidance's errors can carry a state dump)


@functools.cache
def limits() -> Any:
    """llguidance's resource limits for every grammar Brisk compiles: its defaults, with short errors."""
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


def said(message: str) -> str:
    """A library message as a user reads it: its first line, at most ``_SAID`` characters."""
    line = next((part.strip() for part in str(message).splitlines() if part.strip()), "no reason given")
    return line if len(line) <= _SAID else line[: _SAID - 3] + "..."


def grammar_text(format_json: str) -> str:
    """The llguidance grammar for ``format_json`` (``engine.api.reply_format``); raises :class:`FormatError`."""
    import llguidance

    check_size(format_json)
    try:
        spec = json.loads(format_json)
    except json.JSONDecodeError as exc:
        raise FormatError(f"The reply format is not valid JSON: {exc}") from None
    except RecursionError:
        raise FormatError("The reply format is nested too deeply to read; flatten it or use $defs.") from None
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind not in FORMAT_KINDS:
        raise FormatError(f"Unknown reply format {kind!r}; choose one of {', '.join(FORMAT_KINDS)}.")
    check(spec)  # before llguidance: past these bounds it can end the process (format_limits)
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
                shown = pattern if len(pattern) <= 60 else pattern[:57] + "..."
                raise FormatError(said(f"The regex {shown!r} is not valid: {exc}.")) from None
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
        raise FormatError(f"The reply format cannot be used: {said(str(exc))}") from None


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
    problem = llguidance.LLMatcher.validate_grammar(grammar, limits=limits())
    return [f"The reply format cannot be used: {said(problem)}"] if problem else []


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
    problem = llguidance.LLMatcher.validate_grammar(grammar, lltok, limits=limits())
    if problem:
        raise FormatError(f"The reply format cannot be used: {said(problem)}")
    matcher = llguidance.LLMatcher(lltok, grammar, limits=limits())
    if matcher.is_error():
        raise FormatError(f"The reply format cannot be used: {said(matcher.get_error())}")
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
        import torch

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
        return torch.stack(rows)

    def valid_prefix(self, drafts: list[int]) -> int:
        """How many of ``drafts``, from the first, the grammar accepts (nothing is consumed)."""
        return int(self._matcher.validate_tokens(drafts)) if drafts else 0

    def copy(self) -> Grammar:
        """An independent grammar in the same state (for looking ahead through drafts)."""
        return Grammar(self._matcher.deep_copy(), self._vocab)

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
                raise FormatError(f"The reply left its format: {said(self._matcher.get_error())}")

    @property
    def complete(self) -> bool:
        """Whether the reply so far is a whole match of the format (it may end here)."""
        return bool(self._matcher.is_accepting() or self._matcher.is_stopped())


OPEN_CALL, CLOSE_CALL = "<tool_call>", "</tool_call>"  # the Hermes/Qwen tool-call markers the prompt asks for
_TAIL = 16  # reply tokens kept to spot the opening marker (it is five tokens in SmolLM2's vocabulary)


def tool_call_grammar(schemas: list[dict[str, Any]]) -> str:
    """The Lark grammar of one tool call after ``<tool_call>``: a JSON object naming one of the enabled tools
    with arguments under that tool's schema, then ``</tool_call>``."""
    calls = []
    for schema in schemas:
        function = schema.get("function", schema)
        calls.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": function["name"]},
                    "arguments": function.get("parameters") or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    call: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    call = {**call, "x-guidance": JSON_DEFAULTS}
    return f'start: "\\n"? call "\\n"? "{CLOSE_CALL}"\ncall: %json {json.dumps(call)}\n'


def compile_tool_calls(
    schemas: list[dict[str, Any]], tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]
) -> ToolCalls:
    """A :class:`ToolCalls` for a reply that may call these tools (raises :class:`FormatError` for a tool
    schema the library cannot use)."""
    import llguidance

    text = tool_call_grammar(schemas)
    check_grammar(text)  # a client's or a server's tool schema, bounded before llguidance (format_limits)
    lltok = ll_tokenizer(tokenizer, vocab_size, eos_ids)
    grammar = str(llguidance.LLMatcher.grammar_from_lark(text))
    problem = llguidance.LLMatcher.validate_grammar(grammar, lltok, limits=limits())
    if problem:
        raise FormatError(f"A tool's schema cannot be used for its calls: {said(problem)}")
    return ToolCalls(lambda: Grammar(llguidance.LLMatcher(lltok, grammar, limits=limits()), vocab_size), tokenizer)


class ToolCalls:
    """Free text until the reply opens a tool call (``<tool_call>``); from there the call's JSON under the
    enabled tools' schemas, through ``</tool_call>``; then free text again.  The interface of
    :class:`Grammar`, so the decode loop masks, forces and cuts drafts the same way while a call is open,
    and a call the model starts is never malformed (an unknown tool, a missing argument, broken JSON)."""

    def __init__(self, make: Callable[[], Grammar], tokenizer: Any) -> None:
        self._make = make
        self._tokenizer = tokenizer
        self._open: Grammar | None = None  # the call being written, if one is
        self._tail: list[int] = []  # the last free-text tokens, to spot the opening marker

    def masked(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self._open is None else self._open.masked(logits)

    def masks_along(self, logits: torch.Tensor, drafts: list[int]) -> torch.Tensor:
        import torch

        saved = self._save()
        rows = [self.masked(logits[0])]
        try:
            for i, token in enumerate(drafts):
                self.accept([token])
                rows.append(self.masked(logits[i + 1]))
        finally:
            self._restore(saved)
        return torch.stack(rows)

    def valid_prefix(self, drafts: list[int]) -> int:
        saved, taken = self._save(), 0
        try:
            for token in drafts:
                if self._open is not None and not self._open.valid_prefix([token]):
                    break
                self.accept([token])
                taken += 1
        finally:
            self._restore(saved)
        return taken

    def forced(self) -> list[int]:
        return [] if self._open is None else self._open.forced()

    def accept(self, tokens: list[int] | tuple[int, ...]) -> None:
        for token in tokens:
            if self._open is not None:
                self._open.accept([token])
                if self._open.complete:  # "</tool_call>" written: free text again
                    self._open = None
                continue
            self._tail = [*self._tail[-(_TAIL - 1) :], token]
            if self._tokenizer.decode(self._tail).endswith(OPEN_CALL):
                self._open, self._tail = self._make(), []

    @property
    def complete(self) -> bool:
        """No call is left open."""
        return self._open is None

    def _save(self) -> tuple[Grammar | None, list[int]]:
        return (self._open.copy() if self._open is not None else None, list(self._tail))

    def _restore(self, saved: tuple[Grammar | None, list[int]]) -> None:
        self._open, self._tail = saved
