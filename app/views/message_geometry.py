"""Where each part of a chat message goes and how tall it is: geometry and text measurement, no painting.

:class:`MessageGeometry` holds the fonts a message is drawn with and answers
three questions about a :class:`~app.views.chat_model.ChatItem`:
:meth:`~MessageGeometry.layout` gives its :class:`RowLayout` (the same
rectangles serve painting, hit-testing and the text browser opened over a
message), :meth:`~MessageGeometry.row_height` its height in the list, and
:meth:`~MessageGeometry.document` its content laid out as a ``QTextDocument``.

Measuring is lazy, so a long conversation opens fast: with ``exact=False`` a
height is an *estimate* from the plain text (lines at the average character
width); with ``exact=True`` the content's HTML is laid out for the real height.
Content heights are remembered on the item (``content_size``, keyed by what
they depend on: revision, width, draft colouring); laid-out documents are kept
for the most recently used rows only (``DOC_CACHE`` of them), so memory does
not grow with the conversation.

A thinking model's reply has a line over its text ("\u25b8 Thought for 4.2 s (310 tokens), first answer
token at 4.3 s"; "Thinking\u2026 2.1 s" while it thinks: :func:`thinking_title`); a click on it
(``RowLayout.thinking_header``, the action ``"thinking"``) opens the thinking text under it
(``RowLayout.thinking``) or closes it.

A reply that drew on attached documents lists them under its text
("Sources: handbook.md · [1] notes.md, part 3"), each label a target of its
own (``RowLayout.sources``; :meth:`RowLayout.action_at` answers
``"source:N"``, N the source's place in ``ChatItem.sources``).

The actions a row offers (``ACTION_TEXT``, :meth:`~MessageGeometry.actions`)
live here because their buttons take room in the header: a user message has
Copy, Edit (and Compare\u2026 once ``compare_available``); a reply has Copy and
Regenerate, and once it has several versions "\u2039 2/3 \u203a" before them: the
arrows (``older``, ``newer``) browse the versions, the count between them
(``version``, :func:`action_text`) is a label, never a button.
:func:`action_enabled` says which actions take a click now.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QFont, QFontMetrics, QTextDocument

from app.state.attachments import position_text
from app.views.chat_model import ChatItem

COLUMN_MAX_PX = 860
MARGIN_PX = 16  # around the column
ROW_GAP_PX = 12  # between two bubbles
PAD_X, PAD_Y, PART_GAP = 14, 10, 6
DOC_CACHE = 64
SOURCE_GAP = "\u00b7"  # between two sources' labels

ACTION_TEXT = {
    "copy": "Copy",
    "regenerate": "Regenerate",
    "edit": "Edit",
    "compare": "Compare\u2026",
    "older": "\u2039",
    "version": "",  # "2/3": action_text
    "newer": "\u203a",
}
MENU_TEXT = {"older": "Previous version", "newer": "Next version"}  # the context menu's words for the arrows
ACTION_TIPS = {
    "copy": "Copy this message to the clipboard",
    "regenerate": "A new reply from the model, sampled, never from the answer cache; this one is kept as a version",
    "tools": "Show or hide the tool results",
    "thinking": "Show or hide the model's thinking (never sent back to it in later turns)",
    "edit": "Edit this message; the replies after it are replaced",
    "compare": "Run this message again under other settings and compare",
    "older": "The previous version of this reply",
    "newer": "The next version of this reply",
    "version": "The versions of this reply, each with its own timings; the next message goes on from the one shown",
}
BUSY_BLOCKED = ("regenerate", "edit", "compare", "older", "newer")  # not while the chat's reply streams
LABELS = ("version",)  # drawn among the actions, but text, not a button
SOURCE = "source:"  # the action of a source's label: "source:N"
SOURCE_PAD = 4  # either side of a source's label: its hover box


def action_text(item: ChatItem, action: str) -> str:
    """The words of an action's button (the version label: "2/3")."""
    return f"{item.version}/{item.versions}" if action == "version" else ACTION_TEXT[action]


def thinking_title(item: ChatItem) -> str:
    """The line over a reply's thinking, with an arrow that says whether it is open."""
    return ("\u25be " if item.thinking_open else "\u25b8 ") + item.thinking_header


def action_enabled(item: ChatItem, action: str, busy: bool) -> bool:
    """Whether a click on ``action`` of ``item`` does something now: not a label, not one of ``BUSY_BLOCKED``
    while the chat's reply streams, not an arrow past the first or last version."""
    if action in LABELS or (busy and action in BUSY_BLOCKED):
        return False
    if action == "older":
        return item.version > 1
    if action == "newer":
        return item.version < item.versions
    return True


def source_index(action: str) -> int | None:
    """N of a ``"source:N"`` action (None for any other action)."""
    number = action.removeprefix(SOURCE)
    return int(number) if action.startswith(SOURCE) and number.isdigit() else None


def action_tip(item: ChatItem, action: str) -> str:
    """The tooltip of an action of ``item`` (a source's: its document, where the passage is, its path)."""
    index = source_index(action)
    if index is None:
        return ACTION_TIPS.get(action, "")
    if not 0 <= index < len(item.sources):
        return ""
    source = item.sources[index]
    lines = [str(source.get("name") or "document"), position_text(source).capitalize()]
    if source.get("path"):
        lines.append(str(source["path"]))
    lines.append("Click to read the passage")
    return "\n".join(lines)


@dataclass
class RowLayout:
    """Where each part of one row goes, in the view's viewport coordinates."""

    bubble: QRect
    role: QRect
    actions: list[tuple[str, QRect]] = field(default_factory=list)
    notice: QRect | None = None
    badge: QRect | None = None
    thinking_header: QRect | None = None  # "Thought for 4.2 s (310 tokens)": opens and closes the thinking
    thinking: QRect | None = None  # the thinking text, when open
    tools_header: QRect | None = None
    tools: QRect | None = None
    content: QRect = field(default_factory=QRect)
    sources_prefix: QRect | None = None  # "Sources:"
    sources: list[tuple[int, QRect]] = field(default_factory=list)  # each source's label
    error: QRect | None = None
    stats: QRect | None = None

    def action_at(self, x: int, y: int) -> str | None:
        if self.thinking_header is not None and self.thinking_header.contains(x, y):
            return "thinking"
        if self.tools_header is not None and self.tools_header.contains(x, y):
            return "tools"
        source = next((n for n, rect in self.sources if rect.contains(x, y)), None)
        if source is not None:
            return f"{SOURCE}{source}"
        return next((name for name, rect in self.actions if rect.contains(x, y)), None)


class MessageGeometry:
    """The fonts, rectangles and heights of chat messages; ``colour_drafts`` and ``compare_available``
    are the two settings that change them."""

    def __init__(self, font: QFont) -> None:
        self.colour_drafts = True
        self.compare_available = False
        self._content_width = (-1, 0)
        self._docs: OrderedDict[tuple[int, int, int, bool], QTextDocument] = OrderedDict()
        self.set_font(font)

    def set_font(self, font: QFont) -> None:
        self.font = QFont(font)
        self.bold = QFont(font)
        self.bold.setWeight(QFont.Weight.DemiBold)
        self.small = QFont(font)
        self.small.setPixelSize(11)
        self.fm, self.small_fm = QFontMetrics(self.font), QFontMetrics(self.small)
        self.bold_fm = QFontMetrics(self.bold)
        self.button_h = self.fm.height() + 8
        self._estimate_metrics = (
            (max(1, self.small_fm.averageCharWidth()), self.small_fm.lineSpacing()),
            (max(1, self.fm.averageCharWidth()), self.fm.lineSpacing()),
        )

    def forget(self) -> None:
        """Drop the laid-out documents (measurements stay on the items, keyed by what they depend on)."""
        self._docs.clear()

    def column(self, width: int) -> tuple[int, int]:
        """The bubble column's left edge and width for a viewport ``width`` px wide."""
        side = max(MARGIN_PX, (width - COLUMN_MAX_PX) // 2)
        return side, max(80, width - 2 * side)

    def content_width(self, width: int) -> int:
        if self._content_width[0] != width:
            self._content_width = (width, self.column(width)[1] - 2 * PAD_X)
        return self._content_width[1]

    def actions(self, item: ChatItem) -> list[str]:
        if item.role == "user":
            return ["copy", "edit", "compare"] if self.compare_available else ["copy", "edit"]
        pager = ["older", "version", "newer"] if item.versions > 1 else []
        return [*pager, "copy", "regenerate"]

    def _wrapped(self, fm: QFontMetrics, text: str, width: int, exact: bool) -> int:
        if not text:
            return 0
        if not exact:  # lines at the average character width: cheap, corrected when painted
            return (1 + len(text) * fm.averageCharWidth() // max(1, width)) * fm.lineSpacing()
        return fm.boundingRect(QRect(0, 0, width, 100_000), Qt.TextFlag.TextWordWrap, text).height()

    def layout(self, item: ChatItem, top: int, width: int, first: bool, exact: bool = True) -> RowLayout:
        """The row of ``item`` whose top edge is at ``top`` in a column laid out for ``width`` px."""
        left, bubble_w = self.column(width)
        inner_x, inner_w = left + PAD_X, bubble_w - 2 * PAD_X
        y = top + (MARGIN_PX if first else ROW_GAP_PX)
        bubble_top = y
        y += PAD_Y
        role = QRect(inner_x, y, inner_w // 2, self.button_h)
        box = RowLayout(bubble=QRect(), role=role)
        if exact:  # the estimate only needs heights
            right = inner_x + inner_w + 6  # the buttons' own padding lines their text up with the content
            for name in reversed(self.actions(item)):
                w = self.fm.horizontalAdvance(action_text(item, name)) + 12
                if right - w < left + 2:
                    break  # narrower than the buttons: the rest stay in the context menu
                right -= w
                box.actions.insert(0, (name, QRect(right, y, w, self.button_h)))
                right -= 2
            box.role.setRight(min(box.role.right(), right - 4))  # a narrow bubble elides the name, not an action
        y += self.button_h
        if item.notice:
            h = self._wrapped(self.small_fm, item.notice, inner_w, exact)
            box.notice = QRect(inner_x, y + PART_GAP, inner_w, h)
            y += PART_GAP + h
        if item.badge:
            h = self._wrapped(self.small_fm, item.badge, inner_w, exact)
            box.badge = QRect(inner_x, y + PART_GAP, inner_w, h)
            y += PART_GAP + h
        if item.thinking_header:
            title = thinking_title(item)
            w = min(inner_w, self.small_fm.horizontalAdvance(title) + 8) if exact else inner_w
            h = self.small_fm.height() + 4
            box.thinking_header = QRect(inner_x, y + PART_GAP, w, h)
            y += PART_GAP + h
            if item.thinking_open:
                h = self._wrapped(self.small_fm, item.thinking, inner_w - 12, exact)
                box.thinking = QRect(inner_x + 12, y, inner_w - 12, h)
                y += h
        if item.tool_calls:
            header = item.tools_header
            w = min(inner_w, self.small_fm.horizontalAdvance(header) + 8) if exact else inner_w
            h = self.small_fm.height() + 4
            box.tools_header = QRect(inner_x, y + PART_GAP, w, h)
            y += PART_GAP + h
            h = self._wrapped(self.small_fm, item.tools_text, inner_w - 12, exact)
            box.tools = QRect(inner_x + 12, y, inner_w - 12, h)
            y += h
        h = self.content_height(item, inner_w, exact)
        box.content = QRect(inner_x, y + PART_GAP, inner_w, h)
        y += PART_GAP + h
        if item.sources:
            y = self._layout_sources(item, box, inner_x, inner_w, y + PART_GAP)
        if item.error:
            h = self._wrapped(self.fm, item.error, inner_w, exact)
            box.error = QRect(inner_x, y + PART_GAP, inner_w, h)
            y += PART_GAP + h
        if item.stats:
            h = self._wrapped(self.small_fm, item.stats, inner_w, exact)
            box.stats = QRect(inner_x, y + PART_GAP, inner_w, h)
            y += PART_GAP + h
        y += PAD_Y
        box.bubble = QRect(left, bubble_top, bubble_w, y - bubble_top)
        return box

    def _layout_sources(self, item: ChatItem, box: RowLayout, left: int, width: int, top: int) -> int:
        """Place "Sources:" and each source's label, wrapping within ``width``; returns the bottom edge."""
        fm, line = self.small_fm, self.small_fm.height() + 4
        dot = fm.horizontalAdvance(SOURCE_GAP)
        prefix = fm.horizontalAdvance(item.sources_prefix)
        box.sources_prefix = QRect(left, top, prefix, line)
        indent = left + prefix + 2 if prefix < width // 3 else left  # wrapped lines hang under the first label
        x, y = indent, top
        for n, label in enumerate(item.source_labels):
            w = min(left + width - indent, fm.horizontalAdvance(label) + 2 * SOURCE_PAD)
            if x > indent and x + w > left + width:
                x, y = indent, y + line + 2
            box.sources.append((n, QRect(x, y, w, line)))
            x += w + dot
        return y + line

    def row_height(self, item: ChatItem, width: int, first: bool, last: bool, exact: bool) -> int:
        if exact:
            box = self.layout(item, 0, width, first, exact)
            return box.bubble.bottom() + 1 + (MARGIN_PX if last else 0)
        # the same sums as ``layout`` with estimated wrapping, in plain arithmetic: this runs for every row
        inner = self.content_width(width)
        small, normal = self._estimate_metrics
        height = (MARGIN_PX if first else ROW_GAP_PX) + 2 * PAD_Y + self.button_h + (MARGIN_PX if last else 0)
        for text, (avg, line) in ((item.notice, small), (item.error, normal), (item.badge, small)):
            if text:
                height += PART_GAP + (1 + len(text) * avg // inner) * line
        if item.thinking_header:
            height += PART_GAP + self.small_fm.height() + 4
            if item.thinking_open:
                text = item.thinking
                height += (1 + text.count("\n") + len(text) * small[0] // max(1, inner - 12)) * small[1]
        if item.tool_calls:
            text = item.tools_text
            height += PART_GAP + self.small_fm.height() + 4
            height += (1 + text.count("\n") + len(text) * small[0] // max(1, inner - 12)) * small[1]
        if item.sources:
            height += PART_GAP + (1 + len(item.sources_text) * small[0] // inner) * (self.small_fm.height() + 4)
        if item.has_stats:  # one line, most often; formatting it waits until the row is painted
            height += PART_GAP + (1 + len(item.stats_text) * small[0] // inner) * small[1]
        return height + PART_GAP + self.content_height(item, inner, exact=False)

    def content_height(self, item: ChatItem, width: int, exact: bool) -> int:
        colour = self.colour_drafts
        known = item.content_size
        if known is not None and known[:3] == (item.revision, width, colour) and (known[4] or not exact):
            return known[3]
        if exact:
            height = math.ceil(self.document(item, width).size().height())
            item.row_size = None  # sizeHint must now answer the exact row
        else:
            height = self._estimate(item.text, width)
        item.content_size = (item.revision, width, colour, height, exact)
        return height

    def is_measured(self, item: ChatItem, width: int) -> bool:
        known = item.content_size
        return known is not None and known[:3] == (item.revision, width, self.colour_drafts) and known[4]

    def _estimate(self, text: str, width: int) -> int:
        """About how tall the rendered text is: wrapped lines at the average character width."""
        avg, line = self._estimate_metrics[1]
        return (1 + text.count("\n") + len(text) * avg // width) * line

    def document(self, item: ChatItem, width: int) -> QTextDocument:
        key = (item.message_id, item.revision, width, self.colour_drafts)
        doc = self._docs.get(key)
        if doc is not None:
            self._docs.move_to_end(key)
            return doc
        doc = QTextDocument()
        doc.setDocumentMargin(0)
        doc.setDefaultFont(self.font)
        doc.setHtml(item.html(self.colour_drafts))
        doc.setTextWidth(width)
        self._docs[key] = doc
        while len(self._docs) > DOC_CACHE:
            self._docs.popitem(last=False)
        return doc
