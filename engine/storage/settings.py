"""User settings, saved as JSON in the data folder.

Unknown keys in the file are ignored and missing keys take their defaults, so
an old or hand-edited file never stops the app from starting.  A damaged file
is moved aside (``settings.json.bad``) and defaults are used.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from engine.paths import settings_path


@dataclass
class Settings:
    model: str = ""  # empty: the bundled model
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    quant: str = "none"
    system_prompt: str = "You are a helpful assistant."
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 512
    prefix_cache: bool = True
    prefix_cache_mb: int = 512
    speculative: str = "auto"
    draft_model: str = ""
    draft_quant: str = "none"
    colour_draft_tokens: bool = True
    answer_cache: bool = True

    @classmethod
    def load(cls, path: Path | None = None) -> Settings:
        path = path or settings_path()
        if not path.exists():
            return cls()
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(raw, dict):
                raise ValueError("settings file is not a JSON object")
        except (OSError, ValueError):
            path.replace(path.with_name(path.name + ".bad"))
            return cls()
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})

    def save(self, path: Path | None = None) -> None:
        path = path or settings_path()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        os.replace(tmp, path)
