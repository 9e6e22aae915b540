"""Prefill while typing: the message being written is prefilled before Send, while the engine is idle.

The window sends a hint (``Engine.hint(request)``: the request it would send now, the draft as the last
user message) when typing pauses for 150 ms, every 300 ms of typing that does not pause, and at once on a
paste (``app.views.composer``); the scheduler takes in only the newest, once no request waits
(``engine.runtime.scheduler``).  :func:`hint_tokens` renders
that request's prompt the way the real one will be rendered: first the tokens a further keystroke
cannot change (:func:`stable_prefix`: the draft's last tokens, which a next character could merge with,
and the end-of-turn markers after it are held back), then the rest of that prompt to its end, a guess
that the text is finished: the last chunk's logits are kept with the entry (``Entry.logits``), so a Send
of the same text runs no model step before its first token (``PrefixCache.finished``), and a keystroke
that changes the end crops only the guess (a pause costs prefilling those few tokens again).
:class:`Hints` keeps one job, the latest hint: it starts from the longest prefix the prefix cache holds
(the conversation so far is usually there already) and prefills the rest a chunk at a time, only while the
engine's queue is empty, each chunk as many tokens as the last step's pace fits in ``CHUNK_S`` (30 ms: a
step further into a long prompt costs more a token); after each chunk the part done is an entry of the prefix
cache under ``HINT + conversation``, so a Send that comes first reuses it, and a Send never waits for
more than one chunk. A new hint for the same conversation keeps what it shares with the job's state (an
edit in the middle drops only the stale part); a hint for another conversation or a hint whose draft is
empty replaces or drops the job, and a request whose prompt holds the draft (its Send) ends it
(:meth:`Hints.sent`); a Send in another chat leaves it be. Hint
entries are never saved to disk and are the first the prefix cache evicts.

A chat that outgrew the context is hinted too: its prompt drops the middle turns at cuts that stay put
while the chat grows (``engine.runtime.prompt``), so the kept turns after the system prompt are stable
like the rest, and the first reply after a truncation starts from them (a draft whose length moves the cut
shares only the system prompt with its probes, and that is all it prefills).

Hints also say a Send is coming: while they come in (``engine.runtime.engine.TYPING_HOLD_S``), a first
start's background measurement of the weight modes starts no step, so no build holds the Send.

The KV a hint computes is the KV the request's own prefill would compute for the same tokens, so the
reply is the same with the switch on or off (``tests/engine/runtime/test_hints.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.model.kv import KVState, common_prefix, forward
from engine.runtime.prefix_cache import HINT, PrefixCache
from engine.runtime.prompt import Prompt

HINT_CHUNK = 64  # the most tokens one step prefills
FIRST_CHUNK = 16  # the first step's size, before any step was timed
CHUNK_S = 0.03  # a step's target time: a Send waits for one step at most (the goal is 50 ms)
MIN_CHUNK = 8  # fewer would waste the step (each reads every weight once; on a busy machine that is most of it)
HOLD_BACK = 1  # tokens kept back besides those a next character changes, for tokenizers that merge late
# more characters a token than any prompt averages (English about 4, code about 3): a draft longer than the context
# times this cannot fit, and is not rendered for a hint
HINT_CHARS_PER_TOKEN = 16
PROBES = (" a", "a", ".", "\n")  # what a next keystroke might add: the tokens all of them leave are stable
# a draft this long has stable tokens whatever comes next: no probe is rendered (each is the whole prompt again)
PROBE_CHARS = 64


Render = Callable[[list[dict[str, Any]]], Prompt]


def _stable(render: Render, messages: list[dict[str, Any]]) -> tuple[list[int], int]:
    """(the prompt's ids as sent now, how many of them no further keystroke can change); ([], 0) when the
    draft itself is cut to fit the context.  A prompt that drops middle turns to fit counts like any other:
    where a keystroke would move the cut, the probes share only what comes before it."""
    prompt = render(messages)
    if _draft_cut(prompt):
        return [], 0
    ids, draft = prompt.ids, messages[-1]
    stable = len(ids)
    for probe in PROBES:
        longer = render([*messages[:-1], {**draft, "content": str(draft.get("content", "")) + probe}])
        if _draft_cut(longer):
            return [], 0
        stable = min(stable, common_prefix(ids, longer.ids))
    return ids, max(0, stable - HOLD_BACK)


def _draft_cut(prompt: Prompt) -> bool:
    """The prompt left out part of the draft (it alone is too long), not only earlier turns."""
    return prompt.truncated and not prompt.dropped


def stable_prefix(render: Render, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt tokens of ``messages`` (the draft last) that no further keystroke can change; none when
    the draft itself does not fit the context."""
    ids, stable = _stable(render, messages)
    return ids[:stable]


def hint_tokens(render: Render, messages: list[dict[str, Any]]) -> list[int]:
    """What a hint prefills: the stable prefix, then the rest of the prompt as a Send of this text would have
    it (:meth:`Hints.step` keeps its last token's logits, the reply's first token's).  None when nothing is
    stable (the draft's text is not yet past the prompt's first tokens).

    Only a short draft is probed: past ``PROBE_CHARS`` characters something is stable whatever is typed next,
    and the prompt is rendered once (a 1,500-token draft's five renderings took some 80 ms of the engine's
    time each hint, in front of the next Send)."""
    if len(str(messages[-1].get("content", ""))) > PROBE_CHARS:
        prompt = render(messages)
        return [] if _draft_cut(prompt) else prompt.ids
    ids, stable = _stable(render, messages)
    return ids if stable else []


@dataclass
class Job:
    conversation: str  # the prefix cache key of the conversation the draft belongs to
    tokens: list[int]  # the stable prefix to prefill
    state: KVState


class Hints:
    """The latest hint's prefill, for one model and its prefix cache."""

    def __init__(self) -> None:
        self.job: Job | None = None
        self.token_s: float | None = None  # seconds a token of the last step took (the chunk is sized by it)

    def start(self, cache: PrefixCache, conversation: str, tokens: list[int]) -> None:
        """Prefill ``tokens`` for ``conversation`` from here on, keeping what the current job shares."""
        job = self.job
        if job is not None and job.conversation == conversation:
            shared = common_prefix(job.state.tokens, tokens)
            if shared < len(job.state):
                job.state.crop(shared)  # an edit before the end: only the stale part goes
            job.tokens = tokens
        else:
            self.drop(cache)
            state = cache.lookup([*tokens, -1]) if tokens else KVState()  # a branch: nobody's live state
            job = self.job = Job(conversation, tokens, state)
        entry = cache.entries.get(HINT + conversation)
        if entry is not None and common_prefix(entry.tokens, tokens) < len(entry.tokens):
            cache.entries.pop(HINT + conversation)  # it holds text the draft no longer has
            if len(job.state):
                cache.insert(HINT + conversation, job.state)  # what is still true stays reusable

    def pending(self) -> bool:
        return self.job is not None and len(self.job.state) < len(self.job.tokens)

    def chunk(self) -> int:
        """Tokens the next step takes: as many as fit ``CHUNK_S`` at the last step's pace, within
        ``MIN_CHUNK``..``HINT_CHUNK``.  A step costs more per token further into a prompt (each token attends to
        all before it) and on a machine that is busy, so the pace is the last step's, not a constant."""
        if self.token_s is None:
            return FIRST_CHUNK
        return max(MIN_CHUNK, min(HINT_CHUNK, int(CHUNK_S / max(self.token_s, 1e-6))))

    def step(self, model: Any, cache: PrefixCache) -> None:
        """Prefill one chunk of the job's tokens (:meth:`chunk`), timed for the next one's size."""
        job = self.job
        assert job is not None
        done = len(job.state)
        ids = job.tokens[done : done + self.chunk()]
        began = time.perf_counter()
        logits = forward(model, job.state, ids)
        self.token_s = (time.perf_counter() - began) / len(ids)
        cache.insert(HINT + job.conversation, job.state)  # a Send that comes now starts from here
        entry = cache.entries.get(HINT + job.conversation)
        if entry is not None and not self.pending():  # the whole prompt: a Send of it needs no step
            entry.logits = logits[-1].clone()

    def sent(self, cache: PrefixCache, prompt: list[int]) -> None:
        """A request with ``prompt`` is served: the hints whose text it holds whole are done with (their job
        and entry go); a draft in another chat keeps its prefill."""
        if self.job is not None and common_prefix(self.job.tokens, prompt) == len(self.job.tokens):
            self.job = None
        for key, entry in list(cache.entries.items()):
            if key.startswith(HINT) and common_prefix(entry.tokens, prompt) == len(entry.tokens):
                cache.entries.pop(key)

    def drop(self, cache: PrefixCache | None) -> None:
        """Forget the job and every draft's prefill in ``cache``: there is one composer, so one draft, and
        whatever was prefilled for another is stale."""
        self.job = None
        if cache is not None:
            for key in [k for k in cache.entries if k.startswith(HINT)]:
                cache.entries.pop(key)
