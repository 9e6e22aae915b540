"""User settings, saved as JSON in the data folder; every value is checked on load.

``Settings.load_with_problems(path)`` returns ``(settings, problems)``: a
value of the wrong type or out of range (``{"max_tokens": "16"}``, a quant mode
not in ``engine.api.QUANT_MODES``, a negative budget, NaN) is replaced by its
default, and each replacement is one problem, said as what to change, e.g.
``settings.json: max_tokens must be a whole number of 1 or more, not '16'; using 512``.
``Settings.load(path)`` is the same without the list.  Unknown keys are
ignored and missing keys take their defaults, so an old or hand-edited file
never stops the app from starting.  A file that is not a JSON object (not
JSON, nested absurdly deep, bigger than ``engine.datafiles.MAX_STATE_BYTES``)
is moved aside (``settings.json.bad``, ``engine.datafiles.quarantine``),
defaults are used and the problem says so; a special file (a FIFO) is never
read.

The sampling values are checked by ``engine.api.Sampling.problems()`` (one set
of rules for requests and settings); the lists of choices are read from
``engine.api``.  :meth:`Settings.save` writes with ``engine.paths.atomic_write``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.api import DEVICES, DTYPES, QUANT_CHOICES, QUANT_MODES, SOURCES, Sampling
from engine.datafiles import MAX_STATE_BYTES, StateError, parse_json, quarantine
from engine.paths import atomic_write, settings_path

LOCAL = "local"  # Settings.engine for the model on this machine
THEMES = ("system", "light", "dark")
SERVER_FIELDS = ("name", "base_url", "model")  # one saved server; its API key lives in the keyring, never here
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "seed",
    "max_tokens",
    "stop_repeats",
)
SAMPLING_FLOATS = ("temperature", "top_p", "repetition_penalty")


@dataclass
class Settings:
    model: str = ""  # empty: the bundled model
    device: str = "auto"  # one of engine.api.DEVICES
    dtype: str = "auto"  # one of engine.api.DTYPES
    quant: str = "auto"  # one of engine.api.QUANT_CHOICES (auto: measured at first load)
    system_prompt: str = "You are a helpful assistant."
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    # greedy with a light penalty and a loop stop: measured against greedy alone and sampled (brisk bench defaults,
    # docs/PERFORMANCE.md); greedy keeps the answer cache and exact drafting, sampling got facts wrong
    repetition_penalty: float = 1.1
    seed: int | None = None
    max_tokens: int = 512
    stop_repeats: int = 3  # end a reply that says one block three times in a row (Sampling.stop_repeats)
    prefix_cache: bool = True
    prefix_cache_mb: int = 512
    speculative: str = "auto"  # one of engine.api.SOURCES
    draft_model: str = ""
    draft_quant: str = "none"  # one of engine.api.QUANT_MODES
    colour_draft_tokens: bool = False  # a tint on drafted tokens (Speed dialog): off, so a reply reads as text
    answer_cache: bool = True
    prefill_while_typing: bool = True  # the composer's draft is prefilled before Send (engine.runtime.hints)
    answer_cache_threshold: float = 0.86  # cosine similarity a paraphrase needs (0.5 to 1)
    answer_cache_ttl_days: float = 30.0  # cached answers older than this are not used
    stream: bool = True  # show replies token by token (off: at once when complete)
    parallel_tools: bool = True  # run independent tool calls concurrently
    tools_enabled: list[str] = dataclasses.field(default_factory=list)  # tool names sent with each request
    tool_prompt: bool = True  # a chat template without tools gets Brisk's own tool prompt (Request.tool_prompt)
    granted_dirs: list[str] = dataclasses.field(default_factory=list)  # folders the files tool may read
    fetch_allow_private: bool = False  # fetch may reach loopback/private addresses
    mcp_servers: list[str] = dataclasses.field(default_factory=list)  # command lines (stdio) or http(s) URLs
    engine: str = LOCAL  # "local" (the model on this machine) or the name of one of ``servers``
    servers: list[dict[str, str]] = dataclasses.field(default_factory=list)  # {name, base_url, model}; no keys
    serve: bool = False  # the window serves its model to other programs (engine.server) while it runs
    serve_port: int = 8765  # on 127.0.0.1; `brisk serve --host` for other machines (with a key)
    model_folders: list[str] = dataclasses.field(default_factory=list)  # folders the model library also scans
    theme: str = "system"  # the window's colours: "system" (dark when the system's scheme is), "light", "dark"

    @classmethod
    def load(cls, path: Path | None = None) -> Settings:
        """The settings in ``path`` (default: the data folder's); bad values take their defaults."""
        return cls.load_with_problems(path)[0]

    @classmethod
    def load_with_problems(cls, path: Path | None = None) -> tuple[Settings, list[str]]:
        """The settings and what was wrong in the file (empty: nothing); never raises for a bad file."""
        path = path or settings_path()
        try:
            if not path.exists():
                return cls(), []
            if not path.is_file():  # a FIFO or a device would block the read
                return cls(), [f"{path.name} is not a regular file; it is ignored and the default settings are used"]
            size = path.stat().st_size
            data = path.read_bytes() if size <= MAX_STATE_BYTES else b""
        except OSError as e:
            return cls(), [f"{path.name} could not be read ({e}); using the default settings"]
        try:
            if size > MAX_STATE_BYTES:
                raise StateError(f"{size:,} bytes, more than {MAX_STATE_BYTES:,}")
            raw = parse_json(data)
            if not isinstance(raw, dict):
                raise StateError(f"it is a JSON {type(raw).__name__}, not an object")
        except StateError as e:
            bad = quarantine(path, str(e))
            where = f"it was moved to {bad.name}" if bad else "it could not be moved aside"
            return cls(), [f"{path.name} is damaged ({e}); {where} and the default settings are used"]
        known = {f.name for f in fields(cls)}
        settings, problems = cls(**{k: v for k, v in raw.items() if k in known}).checked()
        return settings, [f"{path.name}: {problem}" for problem in problems]

    def checked(self) -> tuple[Settings, list[str]]:
        """A copy with every bad value replaced by its default, and one problem per replacement."""
        default = Settings()
        fixed: dict[str, Any] = {}
        problems: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            fallback = getattr(default, f.name)
            if f.name in SAMPLING_FIELDS:
                value, problem = sampling_value(f.name, value)
            else:
                problem = _RULES[f.name](value)
            if problem is None:
                fixed[f.name] = value
            else:
                fixed[f.name] = fallback
                problems.append(f"{problem}; using {json.dumps(fallback)}")
        names = [server["name"] for server in fixed["servers"]]
        if fixed["engine"] != LOCAL and fixed["engine"] not in names:
            problems.append(
                f'engine must be {LOCAL!r} or the name of a saved server, not {fixed["engine"]!r}; using "local"'
            )
            fixed["engine"] = LOCAL
        return dataclasses.replace(self, **fixed), problems

    def sampling(self) -> Sampling:
        """The sampling values these settings ask for (the window's; the CLI starts from them too)."""
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            repetition_penalty=self.repetition_penalty,
            seed=self.seed,
            max_tokens=self.max_tokens,
            stop_repeats=self.stop_repeats,
        )

    def save(self, path: Path | None = None) -> None:
        atomic_write(path or settings_path(), json.dumps(asdict(self), indent=2))


def sampling_value(name: str, value: Any) -> tuple[Any, str | None]:
    """``value`` for the sampling field ``name`` (a whole number becomes a float where one is asked for) and what
    is wrong with it, or None, by ``Sampling.problems()``: the one set of sampling rules."""
    if name in SAMPLING_FLOATS and _number(value):
        value = float(value)
    found = Sampling(**{name: value}).problems()
    return value, found[0] if found else None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text(name: str) -> Callable[[object], str | None]:
    return lambda v: None if isinstance(v, str) else f"{name} must be text, not {v!r}"


def _flag(name: str) -> Callable[[object], str | None]:
    return lambda v: None if isinstance(v, bool) else f"{name} must be true or false, not {v!r}"


def _choice(name: str, choices: tuple[str, ...]) -> Callable[[object], str | None]:
    def check(v: object) -> str | None:
        return None if v in choices else f"{name} must be one of {', '.join(choices)}, not {v!r}"

    return check


def _ranged(name: str, low: float, high: float, what: str) -> Callable[[object], str | None]:
    def check(v: object) -> str | None:
        if _number(v) and low <= float(v) <= high:  # type: ignore[arg-type]
            return None
        return f"{name} must be {what} from {low:g} to {high:g}, not {v!r}"

    return check


def _texts(name: str) -> Callable[[object], str | None]:
    def check(v: object) -> str | None:
        if isinstance(v, list) and all(isinstance(x, str) and x.strip() for x in v):
            return None
        return f"{name} must be a list of non-empty texts, not {v!r}"

    return check


def _servers(v: object) -> str | None:
    """A list of {name, base_url, model} texts: names unique and not "local", URLs http(s) with a host."""
    if not isinstance(v, list):
        return f"servers must be a list of {{name, base_url, model}} objects, not {v!r}"
    names: set[str] = set()
    for server in v:
        # never quote a whole entry back: a hand-edited one may hold a key
        if not isinstance(server, dict) or set(server) != set(SERVER_FIELDS):
            keys = sorted(server) if isinstance(server, dict) else type(server).__name__
            return f"each of servers must be an object with exactly {', '.join(SERVER_FIELDS)}, not {keys}"
        if not all(isinstance(server[k], str) for k in SERVER_FIELDS):
            return f"server {server['name']!r}: name, base_url and model must be text"
        name = server["name"]
        if not name.strip() or name == LOCAL or name in names:
            return f"server names must be non-empty, unique and not {LOCAL!r}, not {name!r}"
        names.add(name)
        try:
            url = urlsplit(server["base_url"].strip())
            ok = url.scheme in ("http", "https") and bool(url.hostname)
        except ValueError:  # an unbalanced [
            ok = False
        if ok and (url.username or url.password):
            return f"server {name!r}: put its API key in Settings (kept in the keyring), not in base_url"
        if not ok:
            return f"server {name!r} needs an http:// or https:// base_url with a host, not {server['base_url']!r}"
    return None


def _budget(v: object) -> str | None:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
        return None
    return f"prefix_cache_mb must be a whole number of megabytes, 1 or more, not {v!r}"


_RULES: dict[str, Callable[[object], str | None]] = {
    "model": _text("model"),
    "device": _choice("device", DEVICES),
    "dtype": _choice("dtype", DTYPES),
    "quant": _choice("quant", QUANT_CHOICES),
    "system_prompt": _text("system_prompt"),
    "prefix_cache": _flag("prefix_cache"),
    "prefix_cache_mb": _budget,
    "speculative": _choice("speculative", SOURCES),
    "draft_model": _text("draft_model"),
    "draft_quant": _choice("draft_quant", QUANT_MODES),
    "colour_draft_tokens": _flag("colour_draft_tokens"),
    "answer_cache": _flag("answer_cache"),
    "prefill_while_typing": _flag("prefill_while_typing"),
    "answer_cache_threshold": _ranged("answer_cache_threshold", 0.5, 1.0, "a similarity"),
    "answer_cache_ttl_days": _ranged("answer_cache_ttl_days", 0.0, 36500.0, "a number of days"),
    "stream": _flag("stream"),
    "parallel_tools": _flag("parallel_tools"),
    "tools_enabled": _texts("tools_enabled"),
    "tool_prompt": _flag("tool_prompt"),
    "granted_dirs": _texts("granted_dirs"),
    "fetch_allow_private": _flag("fetch_allow_private"),
    "mcp_servers": _texts("mcp_servers"),
    "engine": lambda v: None if isinstance(v, str) and v else f"engine must be {LOCAL!r} or a server's name, not {v!r}",
    "servers": _servers,
    "theme": _choice("theme", THEMES),
    "model_folders": _texts("model_folders"),
    "serve": _flag("serve"),
    "serve_port": lambda v: (
        None
        if isinstance(v, int) and not isinstance(v, bool) and 1024 <= v <= 65535
        else f"serve_port must be a whole number from 1024 to 65535, not {v!r}"
    ),
}
