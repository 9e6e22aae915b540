"""The latency panel's figures: one labelled row per number, '—' when nothing measured it.

:class:`NumbersView` is a grid of labels.  :meth:`NumbersView.show_numbers`
takes :meth:`app.panels.trace.ReplyTrace.numbers` (a dict of what is known
now) and fills every row; :meth:`NumbersView.show_model` takes the ``Loaded``
event (model, mode, memory); :meth:`NumbersView.show_session` the answer
cache's hit rate and time saved over this session (the window's
:class:`~app.state.answer_stats.CacheTally`).  The tools row is the tool
calls' wall time and the time saved against running them one after another
(``tools_sequential_s - tools_wall_s``).  The documents row says how many of
the prompt's tokens were attached documents and whether their KV was reused
(``Metrics.document_tokens`` / ``document_reused``: "3,012 tokens reused").
With a remote backend (``Loaded.device == "remote"``) the rows a server cannot
report (prompt reuse, prefill progress, drafts, memory, documents) are greyed
out with a tooltip saying why, unless the reply's ``Metrics.server_reported``
names one of their fields.  Formatting is plain
functions (:func:`fmt_s`, :func:`fmt_ms`), shared with the compare table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QProgressBar, QWidget

from app.state.attachments import reuse_text
from app.state.model_facts import precision_text, size_text
from engine.api import DraftStats, Loaded

DASH = "\u2014"

REMOTE_TIP = "A remote server does not report this figure."

# key -> (label, fields of Metrics that make it available from a remote server)
ROWS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "model": ("Model", None),
    "mode": ("Mode", None),
    "memory": ("Memory", ()),
    "ttft": ("Time to first token", None),
    "tpot": ("Per token (mean · p50 · p95)", None),
    "speed": ("Tokens/s", None),
    "tokens": ("Tokens", None),
    "total": ("Total time", None),
    "prompt": ("Prompt tokens", ("prompt_tokens", "cached_tokens")),
    "documents": ("Documents", ("document_tokens",)),
    "prefill": ("Prefill", ("prefill_s",)),
    "drafts": ("Drafts (accepted/drafted)", ("drafted", "accepted")),
    "forced": ("Forced by the reply format", ("forced",)),
    "typed": ("Prefilled while typing", ("typed_tokens",)),
    "answer_cache": ("Answer cache", None),
    "tools": ("Tools (wall · saved)", None),
    "cache_session": ("Answer cache, this session", None),
}
SESSION_ROWS = ("model", "mode", "memory", "cache_session")  # not a reply's numbers


def fmt_s(value: float | None) -> str:
    return DASH if value is None else f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def fmt_ms(value: float | None) -> str:
    return DASH if value is None else f"{value * 1000:.1f} ms"


def _num(numbers: Mapping[str, Any], key: str) -> float | None:
    value = numbers.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def draft_text(sources: Mapping[str, DraftStats]) -> str:
    parts = []
    for name, stats in sources.items():
        if not stats.drafted:
            continue
        mean = stats.mean_accepted
        part = f"{name} {stats.accepted}/{stats.drafted} ({100 * (stats.acceptance or 0):.0f} %)"
        parts.append(part + (f", {mean:.1f}/step" if mean is not None else ""))
    return "\n".join(parts)


def row_texts(numbers: Mapping[str, Any]) -> dict[str, str]:
    """The text of every reply row for these numbers ('—' where nothing is known)."""
    out = {key: DASH for key in ROWS if key not in SESSION_ROWS}
    out["ttft"] = fmt_s(_num(numbers, "ttft_s"))
    tpot = [_num(numbers, k) for k in ("tpot_s", "tpot_p50_s", "tpot_p95_s")]
    if tpot[0] is not None:
        out["tpot"] = " \u00b7 ".join(fmt_ms(v) for v in tpot)
    speed = _num(numbers, "tokens_per_s")
    if speed is not None:
        out["speed"] = f"{speed:.1f}"
    tokens = _num(numbers, "completion_tokens")
    if tokens is not None:
        out["tokens"] = str(int(tokens))
    out["total"] = fmt_s(_num(numbers, "total_s"))
    prompt, cached = _num(numbers, "prompt_tokens"), _num(numbers, "cached_tokens")
    if numbers.get("answer_cache") and not prompt:  # answered from the answer cache: no prompt was read
        out["prompt"] = "none read (answer cache)"
    elif prompt is not None:
        if cached is not None:
            computed = _num(numbers, "computed_tokens")
            computed = computed or prompt - cached  # 0 is also Metrics' default when not measured
            out["prompt"] = f"{int(computed)} computed \u00b7 {int(cached)} reused of {int(prompt)}"
        else:
            out["prompt"] = f"{int(prompt)}"
    prefill_s = _num(numbers, "prefill_s")
    progress = numbers.get("prefill")
    if prefill_s is not None:
        out["prefill"] = fmt_s(prefill_s)
    elif isinstance(progress, tuple) and progress[1]:
        out["prefill"] = f"{progress[0]} of {progress[1]} tokens"
    sources = numbers.get("draft_sources")
    drafted = _num(numbers, "drafted")
    if isinstance(sources, Mapping) and draft_text(sources):
        out["drafts"] = draft_text(sources)
    elif drafted:
        accepted = _num(numbers, "accepted") or 0
        out["drafts"] = f"{int(accepted)}/{int(drafted)} ({100 * accepted / drafted:.0f} %)"
    elif _num(numbers, "draft_events"):
        out["drafts"] = f"{int(numbers['draft_events'])} drafted steps so far"
    documents = reuse_text(_num(numbers, "document_tokens"), _num(numbers, "document_reused"))
    if documents:
        out["documents"] = documents
    typed = _num(numbers, "typed_tokens")
    if typed:
        out["typed"] = f"{int(typed):,} of {int(prompt or typed):,} prompt tokens"
    forced = _num(numbers, "forced")
    if forced:
        tokens_made = _num(numbers, "completion_tokens")
        share = f" of {int(tokens_made)}" if tokens_made else ""
        out["forced"] = f"{int(forced)}{share} tokens (no model step of their own)"
    hit = numbers.get("answer_cache")
    if isinstance(hit, str):
        similarity = _num(numbers, "similarity")
        out["answer_cache"] = f"{hit} hit" + (f" (similarity {similarity:.2f})" if similarity is not None else "")
        saved = _num(numbers, "saved_s")
        if saved is not None:
            out["answer_cache"] += f", saved {fmt_s(saved)}"
    wall = _num(numbers, "tools_wall_s")
    if wall is not None:
        sequential = _num(numbers, "tools_sequential_s")
        out["tools"] = fmt_s(wall) + (f" \u00b7 {fmt_s(max(0.0, sequential - wall))}" if sequential else "")
    return out


class NumbersView(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(12)
        grid.setVerticalSpacing(3)
        self.names: dict[str, QLabel] = {}
        self.values: dict[str, QLabel] = {}
        for row, (key, (label, _)) in enumerate(ROWS.items()):
            name = QLabel(label)
            name.setObjectName("panelLabel")  # muted, in the theme's stylesheet
            name.setWordWrap(True)  # long names take two lines in a narrow panel
            value = QLabel(DASH)
            value.setObjectName(f"panel_{key}")
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            value.setWordWrap(True)
            grid.addWidget(name, row, 0, Qt.AlignmentFlag.AlignTop)
            grid.addWidget(value, row, 1)
            self.names[key], self.values[key] = name, value
        self.prefill_bar = QProgressBar()
        self.prefill_bar.setRange(0, 100)
        self.prefill_bar.setTextVisible(False)
        self.prefill_bar.setFixedHeight(6)
        self.prefill_bar.hide()
        grid.addWidget(self.prefill_bar, len(ROWS), 1)
        grid.setColumnStretch(1, 1)
        self.remote = False
        self._greyed: tuple[bool, tuple[str, ...]] | None = None

    def text(self, key: str) -> str:
        return self.values[key].text()

    def show_model(self, loaded: Loaded | None) -> None:
        if loaded is None:
            for key in ("model", "mode", "memory"):
                self.values[key].setText(DASH)
            return
        self.remote = loaded.device == "remote"
        self.values["model"].setText(loaded.model_name)
        precision, _ = precision_text(loaded)
        self.values["mode"].setText(f"{loaded.device} \u00b7 {precision}")
        info = loaded.info
        memory = []
        if info.weight_bytes:
            memory.append(f"weights {size_text(info.weight_bytes)}")
        if info.kv_reserved_bytes:
            memory.append(f"KV {size_text(info.kv_reserved_bytes)}")
        self.values["memory"].setText(" \u00b7 ".join(memory) or DASH)
        self._grey(())

    def show_session(self, text: str) -> None:
        """The session's answer-cache line, e.g. ``1 of 3 replies (33 %) · saved 1.93 s``."""
        self.values["cache_session"].setText(text)

    def show_numbers(self, numbers: Mapping[str, Any]) -> None:
        reported = numbers.get("server_reported")
        self._grey(tuple(reported) if isinstance(reported, tuple | list) else ())
        for key, text in row_texts(numbers).items():
            if self._greyed_out(key):
                continue
            if self.values[key].text() != text:
                self.values[key].setText(text)
        cache = _num(numbers, "cache_bytes")
        if cache is not None and not self.remote:
            memory = self.values["memory"].text().split(" \u00b7 prefix cache")[0]
            self.values["memory"].setText(f"{memory} \u00b7 prefix cache {size_text(cache)}")
        progress = numbers.get("prefill")
        streaming_prefill = isinstance(progress, tuple) and progress[1] and "ttft_s" not in numbers
        self.prefill_bar.setVisible(bool(streaming_prefill))
        if streaming_prefill:
            self.prefill_bar.setValue(int(100 * progress[0] / progress[1]))

    def _grey(self, reported: tuple[str, ...]) -> None:
        if self._greyed == (self.remote, reported):
            return  # styling every label again on every redraw would cost a restyle of the panel
        self._greyed = (self.remote, reported)
        for key, (_, remote_fields) in ROWS.items():
            off = self.remote and remote_fields is not None and not set(remote_fields) & set(reported)
            self.values[key].setEnabled(not off)
            self.names[key].setObjectName("panelLabelOff" if off else "panelLabel")  # the theme's muted or greyed
            self.names[key].style().unpolish(self.names[key])  # the new object name picks the stylesheet's rule
            self.names[key].style().polish(self.names[key])
            self.values[key].setToolTip(REMOTE_TIP if off else "")
            if off:
                self.values[key].setText(DASH)

    def _greyed_out(self, key: str) -> bool:
        return not self.values[key].isEnabled()
