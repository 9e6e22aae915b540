"""What the benchmarks share: Markdown tables, medians, a fresh data folder, one synchronous engine."""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
from collections.abc import Iterator
from typing import Any

from engine.api import Done, ModelSpec, Sampling
from engine.client import Client


def table(title: str, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"{title}: no rows"
    cols = list(rows[0])
    body = [[f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    return f"\n## {title}\n\n" + markdown_table(cols, body)


def markdown_table(head: list[str], body: list[list[str]]) -> str:
    """A Markdown table with columns padded to their widest cell."""
    widths = [max(len(h), *(len(row[i]) for row in body)) for i, h in enumerate(head)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in body]
    return "\n".join(lines)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class Runner:
    """One local engine, driven synchronously through the shared client."""

    def __init__(self, model: str | None, dtype: str | None = None, draft: str = "") -> None:
        self.client = Client()
        self.loaded = self.client.load(ModelSpec(source=model or "", dtype=dtype or "auto", draft=draft))
        self.model = self.client.backend.loaded  # type: ignore[attr-defined]  # the engine's LoadedModel
        assert self.model is not None

    def ask(self, messages: list[dict[str, str]], max_tokens: int = 64, **kw: Any) -> Done:
        return self.client.ask(messages, Sampling(max_tokens=max_tokens), **kw)

    def close(self) -> None:
        self.client.close()


@contextlib.contextmanager
def fresh_data_dir() -> Iterator[str]:
    """Point BRISK_DATA_DIR at an empty temporary folder for the block, so first loads are real."""
    previous = os.environ.get("BRISK_DATA_DIR")
    with tempfile.TemporaryDirectory(prefix="brisk-bench-") as fresh:
        os.environ["BRISK_DATA_DIR"] = fresh
        try:
            yield fresh
        finally:
            if previous is None:
                os.environ.pop("BRISK_DATA_DIR", None)
            else:
                os.environ["BRISK_DATA_DIR"] = previous
