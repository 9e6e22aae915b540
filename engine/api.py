"""The engine's whole contract: requests in, frozen events out.  Imports no torch.

A :class:`Request` goes to a :class:`Backend` (the local model thread in
``engine.runtime.engine``, or a remote server); a stream of events comes back
through the backend's ``on_event`` callback, always in this order:
``Started``, zero or more ``PrefillProgress``, zero or more ``Token`` (and
``ToolCall``), then exactly one of ``Done`` or ``Error``.  Every request event
carries ``t``: seconds since the request was submitted, measured with
``time.perf_counter()``.  Loading a model gives ``LoadProgress`` events and
then ``Loaded`` or ``LoadFailed``; a ``Warning`` says something the user should
know that did not stop the load or the reply (a draft model that was not used).

The sets of choices (``SOURCES``, ``QUANT_MODES``, ``DTYPES``, ``DEVICES``) are
listed here once; the CLI, the settings and the GUI all read them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

SOURCES: tuple[str, ...] = ("off", "auto", "lookup", "answers", "draft")
QUANT_MODES: tuple[str, ...] = ("none", "fp16-cpu", "q8-cpu", "int8-cpu", "int4-cpu", "bnb-int8", "bnb-nf4", "bnb-fp4")
QUANT_CHOICES: tuple[str, ...] = ("auto", *QUANT_MODES)  # what a user may ask for: auto measures at first load
DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16", "float16")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
# "repetition": the reply's last tokens were one block said Sampling.stop_repeats times in a row (a loop)
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "context", "cancelled", "repetition")
# Sampling.format: a reply that matches JSON (any object, or a schema), a regex, one of a list of texts,
# or a Lark grammar (engine.runtime.grammar); "" is free text
FORMAT_KINDS: tuple[str, ...] = ("json_object", "json_schema", "regex", "choice", "lark")
_FORMAT_FIELD = {"json_schema": "schema", "regex": "pattern", "choice": "choices", "lark": "grammar"}


def reply_format(kind: str, value: Any = None) -> str:
    """``Sampling.format`` for a reply of ``kind`` (one of ``FORMAT_KINDS``): ``value`` is the schema
    (a dict), the regex, the list of choices or the grammar's text; ``json_object`` takes none.
    One JSON text per format, so the answer cache keys on it.  A schema's keys keep their order: the
    order of ``properties`` is the order the reply writes them in."""
    if kind not in FORMAT_KINDS:
        raise ValueError(f"Unknown reply format {kind!r}; choose one of {', '.join(FORMAT_KINDS)}.")
    spec: dict[str, Any] = {"type": kind}
    if kind in _FORMAT_FIELD:
        spec[_FORMAT_FIELD[kind]] = value
    return json.dumps(spec, separators=(",", ":"), ensure_ascii=False)


def format_kind(format_json: str) -> str:
    """The kind of a ``Sampling.format`` ("text" for free text; "" when it is not a format at all)."""
    if not format_json:
        return "text"
    try:
        spec = json.loads(format_json)
    except json.JSONDecodeError:
        return ""
    kind = spec.get("type") if isinstance(spec, dict) else None
    return kind if kind in FORMAT_KINDS else ""


@dataclass(frozen=True)
class Sampling:
    """Sampling settings. ``temperature == 0`` means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    # end the reply (finish "repetition") once its last tokens are one block of REPEAT_BLOCK tokens or more
    # said this many times in a row: a loop a small model would keep up to max_tokens.  0: off
    stop_repeats: int = 0
    format: str = ""  # "" free text, else reply_format(...): the reply is decoded under that grammar
    # OpenAI's logits processing: (token id, bias) pairs added to the logits (-100 bans, 100 forces), and
    # penalties subtracted from a token's logit for being in the reply at all / for each time it is there
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False  # each Token carries its tokens' log probabilities (Token.logprobs)
    top_logprobs: int = 0  # ... and the MAX_TOP_LOGPROBS at most most likely tokens at each position

    def problems(self) -> list[str]:
        """What is wrong with these values, each said as what to change (empty: all good)."""
        out = []
        if not _finite(self.temperature) or self.temperature < 0:
            out.append(f"temperature must be a number of 0 or more (0 = greedy), not {self.temperature!r}")
        if not _finite(self.top_p) or not 0 < self.top_p <= 1:
            out.append(f"top_p must be above 0 and at most 1, not {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            out.append(f"top_k must be a whole number of 0 or more (0 = off), not {self.top_k!r}")
        if not _finite(self.repetition_penalty) or self.repetition_penalty <= 0:
            out.append(f"repetition_penalty must be a number above 0 (1 = off), not {self.repetition_penalty!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            out.append(f"seed must be a whole number from 0 to 2**63-1, not {self.seed!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            out.append(f"max_tokens must be a whole number of 1 or more, not {self.max_tokens!r}")
        if not _is_int(self.stop_repeats) or self.stop_repeats < 0 or self.stop_repeats == 1:
            out.append(f"stop_repeats must be 0 (off) or a whole number of 2 or more, not {self.stop_repeats!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            out.append("stop strings must not be empty")
        if not isinstance(self.format, str) or not format_kind(self.format):
            out.append(f"format must be empty (free text) or made by reply_format(), not {self.format!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _finite(value) or not -2 <= value <= 2:
                out.append(f"{name} must be a number from -2 to 2 (0 = off), not {value!r}")
        if not isinstance(self.logit_bias, tuple | list) or not all(
            isinstance(pair, tuple | list)
            and len(pair) == 2
            and _is_int(pair[0])
            and pair[0] >= 0
            and _finite(pair[1])
            and -100 <= pair[1] <= 100
            for pair in self.logit_bias
        ):
            out.append("logit_bias must be (token id, bias) pairs, ids of 0 or more and biases from -100 to 100")
        if not isinstance(self.logprobs, bool):
            out.append(f"logprobs must be true or false, not {self.logprobs!r}")
        if not _is_int(self.top_logprobs) or not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            out.append(f"top_logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}, not {self.top_logprobs!r}")
        return out


MAX_TOP_LOGPROBS = 20  # OpenAI's limit on the alternatives given at each position


REPEAT_BLOCK = (4, 64)  # the shortest and longest block Sampling.stop_repeats looks for, in tokens


def repeats(ids: list[int], times: int) -> bool:
    """Whether ``ids`` ends with one block of ``REPEAT_BLOCK`` tokens said ``times`` times in a row."""
    shortest, longest = REPEAT_BLOCK
    for size in range(shortest, min(longest, len(ids) // times) + 1):
        block = ids[-size:]
        if all(ids[-(k + 1) * size : -k * size] == block for k in range(1, times)):
            return True
    return False


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load and how."""

    source: str = ""  # empty: the bundled model; else a HF folder, a .gguf file or a hub id
    device: str = "auto"  # one of DEVICES
    dtype: str = "auto"  # one of DTYPES
    quant: str = "none"  # one of QUANT_CHOICES ("auto": the fastest mode that keeps answers, measured once)
    draft: str = ""  # a draft model for speculative decoding (same vocabulary), optional
    draft_quant: str = "none"  # the draft model's quantization (QUANT_MODES)


@dataclass(frozen=True)
class ToolSettings:
    """The tools a backend may offer; each request enables some of them by name (``Request.tools``)."""

    granted_dirs: tuple[str, ...] = ()  # folders the ``files`` tool may read
    fetch_allow_private: bool = False  # ``fetch`` may reach loopback/private addresses
    mcp_servers: tuple[str, ...] = ()  # MCP servers: a command line (stdio) or an http(s) URL each
    max_rounds: int = 4  # model -> tools -> model rounds per reply


@dataclass(frozen=True)
class AnswerCacheSettings:
    """How the answer cache answers repeated questions (see engine.answer_cache)."""

    enabled: bool = True
    semantic: bool = True
    threshold: float = 0.86  # cosine similarity a paraphrase needs
    ttl_s: float = 30 * 24 * 3600.0
    max_entries: int = 5000
    allow_sampled: bool = False  # also answer requests that sample (temperature > 0)


@dataclass(frozen=True)
class Request:
    """One reply to produce.

    ``messages`` are chat messages (``{"role": ..., "content": ...}``) ending
    with the user's turn.  ``conversation_id`` lets the engine keep that
    conversation's KV cache between turns.
    """

    id: str
    messages: tuple[dict[str, Any], ...]  # role/content text; assistant turns may carry tool_calls
    sampling: Sampling = field(default_factory=Sampling)
    conversation_id: str | None = None
    prefix_cache: bool = True
    speculative: str = "off"  # one of SOURCES
    tools: tuple[str, ...] = ()  # names of the tools the user enabled for this request
    parallel_tools: bool = True  # run independent tool calls concurrently (False: one after another)
    tool_prompt: bool = True  # a chat template without tools gets Brisk's own tool prompt (engine.tools.prompt)
    answer_cache: bool = True  # may be answered from the answer cache (deterministic sampling only)
    fresh: bool = False  # "regenerate fresh": never answer from the answer cache (a new answer replaces the old)
    submitted_at: float = 0.0  # perf_counter() at submission; set by the engine if 0
    # tools a client of the server defined (OpenAI's "tools" entries): shown to the model like Brisk's own,
    # a call it writes is decoded under their schemas and handed back in Done.text, never run here
    client_tools: tuple[Mapping[str, Any], ...] = ()
    raw: bool = False  # the one message's content is the whole prompt, no chat template (/v1/completions)
    prompt_ids: tuple[int, ...] = ()  # with raw: the prompt's ids as the server made them (/infill)
    origin: str = ""  # who asked: "" the window or the command line, "server" another program (served after)
    # documents attached to the conversation: ids (content hashes) in the document index (engine.documents);
    # small ones go whole into the prompt after the system prompt (their KV kept like a system prompt's),
    # larger ones by the passages retrieved for the question
    documents: tuple[str, ...] = ()
    # what a chat that outgrows the context does (engine.runtime.prompt.OVERFLOW): "drop-middle" keeps the
    # system prompt and the newest turns, "stop" refuses with a message saying by how much it is over
    overflow: str = "drop-middle"
    # a thinking model's switch (the chat template's enable_thinking): "auto" as the template does by default
    thinking: str = "auto"  # "auto" | "on" | "off"


# -- metrics -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DraftStats:
    """Speculative drafts of one source in one reply."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # verification steps that used this source

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted(self) -> float | None:
        return self.accepted / self.steps if self.steps else None


@dataclass(frozen=True)
class Span:
    """One bar of a reply's waterfall: ``name`` ran from ``start_s`` to ``end_s`` (since submission)."""

    name: str  # queue | prompt | cache lookup | prefill | first token | decode | tool:NAME
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Metrics:
    """Every number measured for one reply; times in seconds, sizes in bytes, ``None`` = not measured."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens whose KV was reused from a cache
    computed_tokens: int = 0  # prompt tokens prefilled for this reply
    completion_tokens: int = 0
    queue_s: float | None = None  # submission to the engine taking the request
    prompt_s: float | None = None  # chat template and tokenisation
    lookup_s: float | None = None  # prefix cache lookup and branch copy
    prefill_s: float | None = None
    ttft_s: float | None = None  # submission to the first token
    decode_s: float | None = None  # first token to the last
    tpot_s: float | None = None  # mean time per output token after the first
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    tokens_per_s: float | None = None
    total_s: float | None = None
    drafted: int = 0
    accepted: int = 0
    acceptance: float | None = None
    accepted_per_step: float | None = None
    draft_sources: dict[str, DraftStats] = field(default_factory=dict)
    forced: int = 0  # reply tokens the format forced (jump-forward: fed with the next step, not chosen by one)
    typed_tokens: int = 0  # prompt tokens reused from the prefill done while the message was typed
    document_tokens: int = 0  # prompt tokens of attached documents (whole texts or retrieved passages)
    document_reused: int = 0  # of them, tokens whose KV came from a cache (computed before, in any chat)
    # what the reply drew on: one mapping per document or passage ({"doc_id", "name", "path", "start",
    # "end", "chunk" (-1: the whole text), "label", and for a PDF's passage "page" and "last_page"}), in the
    # order the prompt gave them
    sources: tuple[Mapping[str, Any], ...] = ()
    plain_step_s: float | None = None  # the controller's measured plain decode step
    speedup: float | None = None  # plain_step_s x tokens against the time the reply took
    cache_bytes: int | None = None  # the prefix cache's size after this reply
    truncated: bool = False  # older turns were dropped to fit the context
    dropped: tuple[int, ...] = ()  # (first, last): the turns dropped, numbered from 1 after the system prompt
    spans: tuple[Span, ...] = ()  # the waterfall
    thinking_tokens: int = 0  # reply tokens inside <think>...</think> (counted in completion_tokens too)
    thinking_s: float | None = None  # the first token to the end of the thinking
    answer_ttft_s: float | None = None  # submission to the first answer token (after the thinking)
    tools_wall_s: float | None = None  # wall time of all tool calls of the reply
    tools_sequential_s: float | None = None  # the sum of the calls' own durations (a sequential run)
    answer_cache: str | None = None  # "exact" | "semantic" | None: the reply came from the answer cache
    similarity: float | None = None  # a semantic hit's similarity
    cached_question: str | None = None  # a semantic hit's earlier question
    saved_s: float | None = None  # an answer-cache hit: the original generation time minus this reply's
    server_reported: tuple[str, ...] = ()  # names of the fields above that a remote server reported (not measured here)
    server: Mapping[str, Any] | None = None  # a remote server's own figures as it sent them (usage, timings)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (the CLI's ``done.metrics``, the stored row)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Metrics:
        """Read back a stored dict; unknown keys are ignored and values of the wrong type dropped."""
        if not isinstance(data, Mapping):
            return cls()
        kwargs: dict[str, Any] = {}
        defaults = cls()
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            if f.name == "draft_sources" and isinstance(value, Mapping):
                value = {
                    str(k): DraftStats(**{n: int(v.get(n, 0)) for n in ("drafted", "accepted", "steps")})
                    for k, v in value.items()
                    if isinstance(v, Mapping)
                }
            elif f.name == "spans" and isinstance(value, list | tuple):
                value = tuple(
                    Span(str(s["name"]), float(s["start_s"]), float(s["end_s"]))
                    for s in value
                    if isinstance(s, Mapping) and {"name", "start_s", "end_s"} <= s.keys()
                )
            elif f.name == "sources" and isinstance(value, list | tuple):
                value = tuple(dict(s) for s in value if isinstance(s, Mapping))
            elif isinstance(value, list):
                value = tuple(value)
            default = getattr(defaults, f.name)
            if value is None or default is None or isinstance(value, type(default)) or _number_pair(value, default):
                kwargs[f.name] = value
        return cls(**kwargs)


def prompt_counts(metrics: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(prompt tokens, of them reused) as far as they were counted, from ``Metrics.to_dict()`` or a stored row.

    The local engine counts both; for a remote engine (``server`` set) only what its
    server reported counts, the rest is unknown (None), never a made-up 0.
    """
    remote = metrics.get("server") is not None
    reported = metrics.get("server_reported") or ()

    def count(name: str) -> int | None:
        value = metrics.get(name)
        if (remote and name not in reported) or isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return int(value)

    return count("prompt_tokens"), count("cached_tokens")


def _number_pair(value: object, default: object) -> bool:
    return isinstance(value, int | float) and isinstance(default, int | float) and not isinstance(value, bool)


# -- events --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    request_id: str
    t: float

    @property
    def type(self) -> str:
        return _TYPE_NAMES[type(self)]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("request_id")
        return {"type": self.type, **data}


@dataclass(frozen=True)
class Started(Event):
    prompt_tokens: int = 0
    truncated: bool = False  # older turns were dropped to fit the context
    cached_tokens: int = 0  # prompt tokens whose KV is reused from a cache


@dataclass(frozen=True)
class PrefillProgress(Event):
    """A prefill chunk is in the KV cache: ``done`` of the prompt's ``total`` positions (those taken from a
    cache included: the ``Started`` before it counts them), the chunk computed in ``seconds``."""

    done: int = 0
    total: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class DraftPrefill:
    """How much of the message being typed in ``conversation_id`` is prefilled (``Engine.hint``)."""

    conversation_id: str
    ready: int  # prompt tokens whose KV is computed
    total: int  # prompt tokens of the draft that no further keystroke can change


@dataclass(frozen=True)
class Token(Event):
    text: str = ""
    ids: tuple[int, ...] = ()
    draft: bool = False  # True when the tokens were drafted and accepted
    forced: bool = False  # True when the reply's format allowed only these tokens (no model step chose them)
    logprobs: tuple[Logprob, ...] = ()  # with Sampling.logprobs: one for each of ``ids``, in order


@dataclass(frozen=True)
class Logprob:
    """A token's log probability under the distribution it was sampled from (``engine.runtime.sampling``:
    the logits after bias, penalties and temperature, before top-k and top-p), with ``top`` the most likely
    tokens at its position (``Sampling.top_logprobs`` of them, best first; theirs have no ``top``)."""

    id: int
    token: str  # its text (a piece of a character: U+FFFD in place of the bytes it lacks)
    bytes: tuple[int, ...]  # its UTF-8 bytes, exactly
    logprob: float
    top: tuple[Logprob, ...] = ()


@dataclass(frozen=True)
class Thinking(Event):
    """Reply text inside ``<think>...</think>`` (engine.runtime.thinking), sent apart from the answer's ``Token``."""

    text: str = ""
    ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ToolCall(Event):
    """One tool call, sent when it ends; ``start``/``end`` are on the same clock as ``t``."""

    name: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    start: float = 0.0
    end: float = 0.0
    ok: bool = True
    result: str = ""  # the result text the model sees (an error message when not ok)


@dataclass(frozen=True)
class Done(Event):
    text: str = ""
    finish_reason: str = "stop"  # one of FINISH_REASONS
    metrics: Metrics = field(default_factory=Metrics)
    thinking: str = ""  # the reply's thinking (text is the answer alone): an API's reasoning_content


@dataclass(frozen=True)
class Error(Event):
    message: str = ""
    partial_text: str = ""


@dataclass(frozen=True)
class LoadProgress:
    """Model-loading progress; not tied to a request."""

    fraction: float
    message: str


@dataclass(frozen=True)
class ModelInfo:
    """Facts about a loaded model, for the About dialog, the status bar and the panel."""

    parameters: int = 0
    weight_bytes: int = 0
    quant: str = "none"
    packed_linears: int = 0
    quant_cached: bool | None = None  # the quantized copy came from the cache
    quant_load_s: float | None = None
    decode_step: str = ""  # fp16-cpu: the native decode step's state (built, building, or why not)
    dtype_probe: Mapping[str, Any] | None = None  # the CPU dtype measurement, when one ran
    mode_probe: Mapping[str, Any] | None = None  # quant="auto": the mode chosen, its figures and why
    kv_reserved_bytes: int = 0
    warm_prefixes: int = 0  # system prompts whose KV was read from disk
    draft_model: str = ""
    draft_quant: str = "none"
    endpoint: str = ""  # a remote engine's base URL ("" for the local model)
    context_length: int = 0  # tokens the model can attend to (0: not known, e.g. a remote server)
    fast_path: str = ""  # which of Brisk's forward paths runs it, or why the fast one does not (engine.model.support)
    tool_template: bool | None = None  # the chat template renders tools (None: not known, e.g. a remote server)
    thinking_switch: bool | None = None  # the chat template takes enable_thinking (None: not known)


@dataclass(frozen=True)
class Loaded:
    model_name: str
    device: str
    dtype: str
    load_s: float
    info: ModelInfo = field(default_factory=ModelInfo)


@dataclass(frozen=True)
class LoadFailed:
    message: str


@dataclass(frozen=True)
class Tuning:
    """Work after a load that makes later replies faster while the model already answers (a first start's
    measurement of the weight modes); ``done`` on its last message.  Not tied to a request."""

    message: str
    done: bool = False


@dataclass(frozen=True)
class Warning:  # noqa: A001 - the event's name; the builtin is not used here
    """Something went wrong that did not stop the load or the reply; ``kind`` says what."""

    # "draft" (the draft model is not used), "cache" (a prompt cache was not read or saved), "engine", "tools"
    kind: str
    message: str


@dataclass(frozen=True)
class ServedReply:
    """A request of another program, answered by the server (``engine.server``), as the window's history
    lists it: who asked, where, how it ended, its metrics (None when it never started).  Not tied to one
    of the window's requests."""

    client: str
    endpoint: str
    status: str  # done | cancelled | error
    metrics: Metrics | None = None
    message: str = ""  # an error's text


_TYPE_NAMES = {
    Started: "started",
    PrefillProgress: "prefill",
    Token: "token",
    Thinking: "thinking",
    ToolCall: "tool",
    Done: "done",
    Error: "error",
}

OnEvent = Callable[[object], None]


class Backend(Protocol):
    """What the GUI, the CLI and the benchmarks drive: the local model thread or a remote server.

    Every method but :meth:`count_tokens` returns at once; events arrive through the ``on_event`` given to
    the backend's constructor, from the backend's own thread.  The verbs after :meth:`shutdown` are what
    Brisk's own model does beyond a plain server: a backend that cannot (``engine.remote.RemoteBackend``)
    still has each one, does nothing and says so by its return value, as each docstring states.
    """

    def load(self, spec: ModelSpec) -> None:
        """Load ``spec``: ``LoadProgress``... then ``Loaded`` or ``LoadFailed``."""
        ...

    def submit(self, request: Request) -> None:
        """Answer ``request``: ``Started``... then ``Done`` or ``Error`` (the window's and the server's alike)."""
        ...

    def cancel(self, request_id: str) -> None:
        """End that request soon with ``Done(finish_reason="cancelled")``; an unknown id is ignored."""
        ...

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the backend's thread (waiting at most ``timeout`` s); a reply still streaming ends with it."""
        ...

    def hint(self, request: Request) -> bool:
        """The request the window would send now (the draft being typed last), to prefill while idle; a
        ``DraftPrefill`` event says how far it got.  True when taken; False when the backend cannot (no
        event follows)."""
        ...

    def count_tokens(self, texts: list[str]) -> list[int] | None:
        """The loaded model's token count of each text; blocking, on the caller's thread.  None while no
        model is loaded, or when the backend cannot tell (a remote server)."""
        ...

    def remember_answer(self, question: str, answer: str) -> bool:
        """Seed the answer memory (speculative drafts, never served as a reply) with an earlier answer.
        True when taken; False when the backend keeps no answer memory."""
        ...

    def set_prefix_budget(self, budget_bytes: int) -> bool:
        """Change the prefix cache's byte budget now, evicting as needed (``ValueError`` for a bad value).
        True when applied; False when the backend keeps no prefix cache (the value applies at its next
        start, through its options)."""
        ...

    def clear_prefix_cache(self) -> bool:
        """Forget every prompt's KV in memory, in turn with requests, so the next reply starts cold.  True
        when done; False when the backend keeps no prefix cache (nothing to forget)."""
        ...
