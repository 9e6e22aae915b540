"""A chat's own sampling values, and the presets (a system prompt and values) a user saves and reuses.

A chat keeps only the values set for it (``Conversation.params``, a JSON
object in the history file): every other value follows the settings'
defaults, so a chat nobody tuned changes with Settings, and one that was tuned
keeps what it was given.  :func:`checked` reads such an object as a user or an
old file wrote it: unknown names and bad values are dropped, each one said as a
problem (the values are checked by ``engine.api.Sampling.problems()``, the one
set of rules for requests and settings).  :func:`sampling` gives the values a
request of that chat uses.

:class:`PresetFile` keeps the user's presets in ``presets.json`` in the data
folder beside :data:`BUILTIN_PRESETS` (which cannot be replaced or deleted);
saving reads, changes and writes the file under an inter-process lock, so two
windows saving at once lose neither preset.  A damaged file is moved aside
(``engine.datafiles.load_state``) and the built-in presets remain.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.api import Sampling
from engine.datafiles import LockTimeout, StateError, exclusive, load_state
from engine.paths import atomic_write, data_dir
from engine.storage.settings import SAMPLING_FIELDS, Settings, sampling_value

# what a chat or a preset may set: temperature ... stop_repeats, and the reply's format (a chat's own, never a
# setting: "" free text, else engine.api.reply_format's JSON text)
PARAM_FIELDS = (*SAMPLING_FIELDS, "format")
# a chat's own choices that are not sampling values, each with its allowed values (the first is the default):
# what happens when the chat no longer fits the context, and whether a thinking model thinks ("auto": as the
# model's template does by default)
CHAT_OPTIONS: dict[str, tuple[str, ...]] = {
    "overflow": ("drop-middle", "stop"),
    "thinking": ("auto", "on", "off"),
}
PRESETS_FILE = "presets.json"
PRESETS_VERSION = 1
NAME_CHARS = 60
MAX_PRESETS = 200
PROMPT_CHARS = 20_000


def defaults(settings: Settings) -> dict[str, Any]:
    """The sampling values a chat with none of its own uses: the settings'."""
    return {name: getattr(settings, name) for name in SAMPLING_FIELDS} | {"format": ""}


def checked(raw: Mapping[str, Any] | object) -> tuple[dict[str, Any], list[str]]:
    """The known, valid values in ``raw`` and one problem for each one dropped (said as what was wrong)."""
    if not isinstance(raw, Mapping):
        return {}, [f"a chat's parameters must be a JSON object, not {type(raw).__name__}; the defaults are used"]
    good: dict[str, Any] = {}
    problems: list[str] = []
    for name, value in raw.items():
        if name in CHAT_OPTIONS:
            if value in CHAT_OPTIONS[name]:
                good[name] = value
            else:
                allowed = ", ".join(repr(v) for v in CHAT_OPTIONS[name])
                problems.append(f"{name} must be one of {allowed}, not {value!r}; the default is used")
            continue
        if name not in PARAM_FIELDS:
            problems.append(f"{name!r} is not a parameter Brisk knows; it is ignored")
            continue
        value, problem = sampling_value(name, value)
        if problem:
            problems.append(f"{problem}; the default is used")
        else:
            good[name] = value
    return good, problems


def sampling(settings: Settings, own: Mapping[str, Any]) -> Sampling:
    """What a request of a chat with these values of its own samples with (the rest from ``settings``)."""
    good = {k: v for k, v in checked(own)[0].items() if k not in CHAT_OPTIONS}
    return Sampling(**(defaults(settings) | good))


def option(own: Mapping[str, Any], name: str) -> str:
    """The chat's choice for the option ``name`` of :data:`CHAT_OPTIONS` (its default where unset or bad)."""
    value = own.get(name) if isinstance(own, Mapping) else None
    return value if value in CHAT_OPTIONS[name] else CHAT_OPTIONS[name][0]


@dataclass(frozen=True)
class Preset:
    """A named system prompt and sampling values; applying it to a chat sets both."""

    name: str
    system_prompt: str
    params: dict[str, Any] = field(default_factory=dict)
    builtin: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "system_prompt": self.system_prompt, "params": self.params}


# The values differ only where the task calls for it; each is greedy-safe with the default loop stop.
BUILTIN_PRESETS = (
    Preset(
        "Brisk default",
        Settings().system_prompt,
        defaults(Settings()),
        builtin=True,
    ),
    Preset(
        "Precise answers",
        "You are a precise assistant. Answer briefly and exactly. If you are not sure, say so.",
        defaults(Settings()) | {"max_tokens": 256},
        builtin=True,
    ),
    Preset(
        "Creative writing",
        "You are an imaginative writer. Write vivid, original prose.",
        defaults(Settings()) | {"temperature": 0.8, "top_p": 0.95, "max_tokens": 1024},
        builtin=True,
    ),
    Preset(
        "Code helper",
        "You are a careful programming assistant. Answer with working code in fenced blocks "
        "and explain it in a few sentences.",
        defaults(Settings()) | {"max_tokens": 1024},
        builtin=True,
    ),
)


def name_problem(name: str, builtin: bool = False) -> str | None:
    """What is wrong with ``name`` for a preset the user saves (None: it is fine)."""
    if not name.strip():
        return "A preset needs a name."
    if len(name) > NAME_CHARS:
        return f"A preset's name may have at most {NAME_CHARS} characters."
    if any(preset.name.casefold() == name.strip().casefold() for preset in BUILTIN_PRESETS) and not builtin:
        return f"{name.strip()!r} is a built-in preset; choose another name."
    return None


def _read(value: Any) -> list[Preset]:
    if not isinstance(value, dict) or value.get("version") != PRESETS_VERSION:
        raise StateError("not a presets file of this version")
    items = value.get("presets")
    if not isinstance(items, list):
        raise StateError("'presets' is not a list")
    out: list[Preset] = []
    for item in items[:MAX_PRESETS]:
        if not isinstance(item, dict):
            continue  # one bad entry costs only itself
        name, prompt = item.get("name"), item.get("system_prompt", "")
        if not isinstance(name, str) or name_problem(name) or not isinstance(prompt, str):
            continue
        params, _problems = checked(item.get("params", {}))
        out.append(Preset(name.strip(), prompt[:PROMPT_CHARS], params))
    return out


@contextmanager
def _locked() -> Iterator[None]:
    """The presets file's inter-process lock; a holder that never lets go is an ``OSError`` saying so."""
    try:
        with exclusive("presets", timeout=10.0, what="saving presets"):
            yield
    except LockTimeout as exc:
        raise TimeoutError(str(exc)) from exc


class PresetFile:
    """The user's presets in ``path`` (default ``presets.json`` in the data folder), after the built-in ones."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or data_dir() / PRESETS_FILE

    def presets(self) -> list[Preset]:
        return [*BUILTIN_PRESETS, *self._user()]

    def find(self, name: str) -> Preset | None:
        return next((p for p in self.presets() if p.name.casefold() == name.strip().casefold()), None)

    def save(self, preset: Preset) -> Preset:
        """Add ``preset`` or replace the user's preset of that name; raises ``ValueError`` saying what to change.

        Raises ``OSError`` when the file cannot be written (nothing is changed then)."""
        problem = name_problem(preset.name)
        if problem:
            raise ValueError(problem)
        params, problems = checked(preset.params)
        if problems:
            raise ValueError("The preset's values are not valid: " + "; ".join(problems) + ".")
        kept = Preset(preset.name.strip(), preset.system_prompt[:PROMPT_CHARS], params)
        with _locked():
            others = [p for p in self._user() if p.name.casefold() != kept.name.casefold()]
            if len(others) >= MAX_PRESETS:
                raise ValueError(f"There are already {MAX_PRESETS} presets; delete one first.")
            self._write([*others, kept])
        return kept

    def delete(self, name: str) -> None:
        """Delete the user's preset ``name``; built-in presets cannot be deleted (``ValueError``)."""
        if any(p.name.casefold() == name.casefold() for p in BUILTIN_PRESETS):
            raise ValueError(f"{name!r} is a built-in preset; it cannot be deleted.")
        with _locked():
            self._write([p for p in self._user() if p.name.casefold() != name.casefold()])

    def _user(self) -> list[Preset]:
        return load_state(self.path, _read) or []

    def _write(self, presets: list[Preset]) -> None:
        data = {"version": PRESETS_VERSION, "presets": [p.as_json() for p in presets]}
        atomic_write(self.path, json.dumps(data, indent=2))
