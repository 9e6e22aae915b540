"""Markdown to Qt rich-text HTML for chat messages (no Qt).

:func:`render_reply` turns an assistant reply, given as ``(text, drafted)``
segments, into HTML that ``QLabel``/``QTextDocument`` render well: fenced code
in a monospace block with a background, inline code tinted, raw HTML from the
model shown as text (never interpreted).  With ``colour_drafts`` the drafted
segments get a subtle colour (and text the reply's format forced, ``FORCED``
segments, a colour of its own); the markers used for that never break Markdown
structure (fences, headings, list bullets); inside a fenced block the colours
are the language's (Pygments, where the fence names one), not the drafts'.  An
unclosed code fence is closed for display, so a half-written block already
looks like code and a reply cut off inside one (Stop, the token limit) keeps
its formatting.  Links keep only ``http(s)`` targets and images are never loaded (a
web image becomes a link with its alt text), so rendered text cannot open or
load a local file.  :func:`render_user` shows a user's message as plain text.
"""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Sequence
from xml.etree.ElementTree import Element

import markdown
from markdown.treeprocessors import Treeprocessor

from app.state.reply import FORCED

DRAFT_COLOUR = "#2f7d6d"
COPY_LINK = "brisk-copy:"  # + the block's number: a code block's "Copy code" (app.views.chat_delegate)
COPY_COLOUR = "#4b5563"
CODE_BG = "#f3f4f6"
_S, _E = "\ue000", "\ue001"  # private-use markers around drafted text
_FS, _FE = "\ue002", "\ue003"  # and around text the reply's format forced
_MARKERS = _S + _E + _FS + _FE
FORCED_COLOUR = "#7c3aed"
_FENCE = re.compile(r"^\s*(```|~~~)")
_RULE = re.compile(r"^\s*(?:[-*_=]\s*){3,}$")
_PREFIX = re.compile(r"^\s*(?:(?:#{1,6}|>|[*+-]|\d{1,9}[.)])(?:\s+|$))*")
_CODE_BLOCK = re.compile(
    r'(?:<div class="codehilite"[^>]*>)?<pre[^>]*>(?:<span></span>)?<code[^>]*>(.*?)</code></pre>(?:</div>)?', re.S
)
_TAG_SPLIT = re.compile(r"(<[^>]*>)")
_BLOCK_END = re.compile(r"</(?:p|li|h[1-6]|td|th|pre|blockquote)>")

SAFE_SCHEMES = ("http://", "https://")


def safe_url(url: str) -> bool:
    """Only web links leave the app: no ``file://``, no relative paths (which resolve to local files)."""
    return url.strip().lower().startswith(SAFE_SCHEMES)


class _SafeLinks(Treeprocessor):
    """Links keep their text but lose a non-web target; images become their alt text (a link to a web
    image), so nothing the model writes loads or opens a local file."""

    def run(self, root: Element) -> None:
        for element in root.iter():
            if element.tag == "a" and not safe_url(element.get("href", "")):
                element.tag = "span"
                element.attrib.clear()
            elif element.tag == "img":
                src, alt = element.get("src", ""), element.get("alt", "") or "image"
                element.attrib.clear()
                element.text = f"[{alt}]"
                if safe_url(src):
                    element.tag = "a"
                    element.set("href", src)
                else:
                    element.tag = "span"


def _converter(pygments_style: str) -> markdown.Markdown:
    md = markdown.Markdown(
        extensions=["fenced_code", "codehilite", "tables", "sane_lists", "nl2br"],
        # Pygments colours a block whose fence names its language, as inline styles (Qt's rich text has no classes)
        extension_configs={"codehilite": {"noclasses": True, "guess_lang": False, "pygments_style": pygments_style}},
    )
    md.preprocessors.deregister("html_block")  # the model's raw HTML is shown, not run
    md.inlinePatterns.deregister("html")
    md.treeprocessors.register(_SafeLinks(md), "brisk_safe_links", 0)
    return md


_md = _converter("friendly")


def use_colours(draft: str, link: str, code_bg: str, pygments_style: str, forced: str = FORCED_COLOUR) -> None:
    """The colours replies are rendered with from now on (the theme in use: ``app.views.style.apply``)."""
    global DRAFT_COLOUR, COPY_COLOUR, CODE_BG, FORCED_COLOUR, _md
    DRAFT_COLOUR, COPY_COLOUR, CODE_BG, FORCED_COLOUR = draft, link, code_bg, forced
    _md = _converter(pygments_style)


def render_user(text: str) -> str:
    body = html.escape(text).replace("\n", "<br>")
    return f"<div>{body}</div>"


def render_reply(
    segments: Sequence[tuple[str, bool | str]] | str,
    *,
    colour_drafts: bool = False,
    streaming: bool = False,
) -> str:
    if isinstance(segments, str):
        segments = [(segments, False)]
    source = _mark(segments) if colour_drafts else "".join(_clean(t) for t, _ in segments)
    source = _unmark_code(source)
    if sum(1 for line in _clean(source).split("\n") if _FENCE.match(line)) % 2:
        source += "\n```"  # a block still being written, or cut by Stop or the token limit, stays code
    _md.reset()
    body = _md.convert(source)
    numbers = itertools.count()
    body = _CODE_BLOCK.sub(lambda match: _code_block(match, next(numbers)), body)
    body = body.replace("<code>", f'<code style="background-color:{CODE_BG}; font-family:monospace;">')
    return _resolve_markers(body)


def _unmark_code(source: str) -> str:
    """No draft markers inside fenced code: its colours are the language's (Pygments), and a marker would
    split the tokens it colours."""
    if not any(marker in source for marker in (_S, _FS)):
        return source
    lines, inside = source.split("\n"), False
    for i, line in enumerate(lines):
        fence = bool(_FENCE.match(_clean(line)))
        if inside or fence:
            lines[i] = _clean(line)
        if fence:
            inside = not inside
    return "\n".join(lines)


def _clean(text: str) -> str:
    return text.translate(_NO_MARKERS)


_NO_MARKERS = {ord(ch): None for ch in _MARKERS}


def _mark(segments: Sequence[tuple[str, bool | str]]) -> str:
    """Wrap drafted and forced text in their markers, line by line, then lift them off block syntax."""
    pieces: list[str] = []
    for text, kind in segments:
        text = _clean(text)
        if not kind:
            pieces.append(text)
            continue
        start, end = (_FS, _FE) if kind == FORCED else (_S, _E)
        pieces.append("\n".join(f"{start}{line}{end}" if line else "" for line in text.split("\n")))
    return "\n".join(_fix_line(line) for line in "".join(pieces).split("\n"))


def _fix_line(line: str) -> str:
    clean = _clean(line)
    if clean == line:
        return line
    if _FENCE.match(clean) or _RULE.match(clean) or not clean.strip():
        return clean
    keep = len(_PREFIX.match(clean).group(0))  # type: ignore[union-attr]
    out: list[str] = []
    seen, inside, opened = 0, "", ""  # the start marker of the run a character is in, and of the one written
    for ch in line:
        if ch in (_S, _FS):
            inside = ch
        elif ch in (_E, _FE):
            inside = ""
            if opened:
                out.append(_E if opened == _S else _FE)
                opened = ""
        else:
            if seen >= keep and inside and not opened:
                out.append(inside)
                opened = inside
            out.append(ch)
            seen += 1
    if opened:
        out.append(_E if opened == _S else _FE)
    return "".join(out)


def _code_block(match: re.Match[str], number: int) -> str:
    copy = (
        f'<tr><td align="right" style="padding:2px 8px 0 8px;"><a href="{COPY_LINK}{number}" '
        f'style="color:{COPY_COLOUR}; text-decoration:none;">Copy code</a></td></tr>'
    )
    return (
        f'<table width="100%" cellspacing="0" cellpadding="8" style="background-color:{CODE_BG};">{copy}'
        f'<tr><td><pre style="font-family:monospace; white-space:pre-wrap;">{match.group(1).rstrip()}</pre>'
        "</td></tr></table>"
    )


def code_blocks(text: str) -> list[str]:
    """The fenced code blocks of a reply's Markdown, as written (an unclosed last one included), in order:
    what ``Copy code`` link number ``n`` copies."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in _clean(text).split("\n"):
        if _FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        blocks.append("\n".join(current))
    return blocks


def _resolve_markers(body: str) -> str:
    """Turn markers into spans; markers inside a tag are dropped and spans stay balanced."""
    out: list[str] = []
    opened = False
    colours = {_S: DRAFT_COLOUR, _FS: FORCED_COLOUR}
    for i, part in enumerate(_TAG_SPLIT.split(body)):
        if i % 2:  # a tag: a marker here would corrupt it
            if opened and (_E in part or _FE in part or _BLOCK_END.match(part)):
                out.append("</span>")
                opened = False
            out.append(_clean(part))
            continue
        for ch in part:
            if ch in colours:
                if opened:  # one kind's run right after the other's
                    out.append("</span>")
                out.append(f'<span style="color:{colours[ch]};">')
                opened = True
            elif ch in (_E, _FE):
                if opened:
                    out.append("</span>")
                    opened = False
            else:
                out.append(ch)
    if opened:
        out.append("</span>")
    return "".join(out)
