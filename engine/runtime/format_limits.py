"""Bounds on a reply format, checked in pure Python before the grammar library (llguidance) sees it.

llguidance compiles a schema's ``$ref`` links and a Lark grammar's rule references by recursion on the
native stack: a chain of about 1,400 links (8 MB of stack, ``ulimit -s`` here) ends the whole process
with SIGSEGV, and a regex such as ``(a{1000}){1000}`` or a grammar with no finite sentence compiles
and fails only after the model ran.  :func:`check` refuses these first, each with one sentence naming
what to change (:class:`FormatError`), in bounded time and with no recursion of its own:

* the format's size (``MAX_BYTES``) and a schema's JSON nesting (``MAX_JSON_DEPTH``);
* the longest path through nesting and ``$ref`` links, or through a grammar's rule references
  (``MAX_DEPTH``, about a tenth of the depth that crashed);
* how far a regex's counted repeats expand (``MAX_REPEAT``), in a schema's ``pattern`` too;
* emptiness: a schema or grammar whose every value needs itself (``{"$ref": "#"}``, an object that
  requires a property of its own type, ``a: "x" a``) has no finite reply, and is refused.

A pure check was chosen over compiling in a child process: it costs about 0.07 ms for an ordinary
schema (llguidance's own validation in process 0.38 ms), where a child that imports llguidance costs
about 235 ms a format (median of 10, ``docs/RELIABILITY.md``).
Where this reader cannot follow a grammar it leaves the judgement to llguidance, whose own limits
(``engine.runtime.grammar.LIMITS``) still apply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

MAX_BYTES = 256 * 1024  # a reply format's JSON text
MAX_JSON_DEPTH = 100  # llguidance's JSON reader stops at 128 levels with "recursion limit exceeded"
MAX_DEPTH = 128  # nesting plus $ref links, or rule references: llguidance's stack ran out at ~1,400
MAX_NODES = 20_000  # subschemas, or grammar rules
MAX_REPEAT = 10_000  # characters a regex's counted repeats expand to: (a{1000}){1000} is 1,000,000
MAX_CHOICES = 10_000

_SCHEMA_ONE = (
    "additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames",
    "unevaluatedItems", "unevaluatedProperties", "additionalItems",
)  # fmt: skip
_SCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


class FormatError(ValueError):
    """The reply format cannot be used; the message (the library's, where it has one) is for the user."""


def check(spec: dict[str, Any]) -> None:
    """Raise :class:`FormatError` where ``spec`` (a parsed ``engine.api.reply_format``) is past a bound."""
    kind = spec.get("type")
    if kind == "json_schema" and isinstance(spec.get("schema"), dict):
        check_schema(spec["schema"])
    elif kind == "regex" and isinstance(spec.get("pattern"), str):
        check_regex(spec["pattern"], "The regex")
    elif kind == "choice" and isinstance(spec.get("choices"), list) and len(spec["choices"]) > MAX_CHOICES:
        count = len(spec["choices"])
        raise FormatError(f"The choice list has {count:,} choices; the most Brisk takes is {MAX_CHOICES:,}.")
    elif kind == "lark" and isinstance(spec.get("grammar"), str):
        check_grammar(spec["grammar"])


def check_size(text: str, what: str = "The reply format") -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise FormatError(f"{what} is {size / 1024:,.0f} KB; the most Brisk takes is {MAX_BYTES // 1024} KB.")


# -- JSON schemas -------------------------------------------------------------------------------------------


def check_schema(schema: Any, what: str = "The schema") -> int:
    """Check one JSON schema; returns its depth (nesting and ``$ref`` links, for a grammar that embeds it)."""
    _json_depth(schema, what)
    nodes, paths, edges, musts, anys = _schema_graph(schema, what)
    depth = _longest(schema, edges)
    if depth > MAX_DEPTH:
        raise FormatError(
            f"{what} nests or chains $ref links {depth:,} levels deep; the most Brisk takes is {MAX_DEPTH}."
        )
    for node in nodes:
        if isinstance(node, dict) and isinstance(node.get("pattern"), str):
            check_regex(node["pattern"], f"{what}'s pattern at {paths[id(node)]}")
        for key in node.get("patternProperties", {}) if isinstance(node, dict) else ():
            check_regex(key, f"{what}'s property pattern at {paths[id(node)]}")
    done = _productive(schema, nodes, musts, anys)
    if id(schema) not in done:
        stuck = [n for n in nodes if id(n) not in done]
        loop = next((n for n in stuck[1:21] if _cyclic(n, edges)), None)  # a few tries: each walks the graph
        if loop is not None:
            raise FormatError(
                f"{what} allows no finite JSON value: {paths[id(loop)]} can only be completed by repeating "
                "itself, so a reply could never end."
            )
        raise FormatError(f"{what} allows no JSON value: {paths[id(stuck[-1])]} can never be met.")
    return depth


def _json_depth(value: Any, what: str) -> None:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise FormatError(f"{what} is nested more than {MAX_JSON_DEPTH} levels deep; flatten it or use $defs.")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def _subschemas(node: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for key in _SCHEMA_ONE:
        if isinstance(node.get(key), dict | bool):
            yield key, node[key]
    for key in _SCHEMA_MAP:
        if isinstance(node.get(key), dict):
            for name, child in node[key].items():
                if isinstance(child, dict | bool):
                    yield f"{key}/{_escape(name)}", child
    for key in _SCHEMA_LIST:
        if isinstance(node.get(key), list):
            for i, child in enumerate(node[key]):
                if isinstance(child, dict | bool):
                    yield f"{key}/{i}", child


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _resolve(root: Any, ref: str) -> Any:
    """The subschema a local ``$ref`` ("#", "#/$defs/x") names, or None (remote, or not there)."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:] if ref != "#" else ():
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, dict | bool) else None


def _schema_graph(
    root: Any, what: str
) -> tuple[list[Any], dict[int, str], dict[int, list[Any]], dict[int, list[Any]], dict[int, list[list[Any]]]]:
    """Every subschema (first-seen path), its edges (children and ``$ref`` target), and what a finite
    value of it needs: ``musts`` all productive, and one of each group in ``anys``."""
    nodes: list[Any] = []
    paths: dict[int, str] = {}
    edges: dict[int, list[Any]] = {}
    musts: dict[int, list[Any]] = {}
    anys: dict[int, list[list[Any]]] = {}
    todo: list[tuple[Any, str]] = [(root, "#")]
    while todo:
        node, path = todo.pop()
        if id(node) in paths or not isinstance(node, dict):
            continue
        paths[id(node)] = path
        nodes.append(node)
        if len(nodes) > MAX_NODES:
            raise FormatError(f"{what} has more than {MAX_NODES:,} subschemas; the most Brisk takes is {MAX_NODES:,}.")
        children = list(_subschemas(node))
        out = [child for _, child in children]
        need: list[Any] = []
        groups: list[list[Any]] = []
        ref = node.get("$ref")
        target = _resolve(root, ref) if isinstance(ref, str) else None
        if target is not None:
            out.append(target)
            need.append(target)
        need.extend(c for c in node.get("allOf", []) if isinstance(c, dict | bool))
        for key in ("anyOf", "oneOf"):
            if isinstance(node.get(key), list):
                groups.append([c for c in node[key] if isinstance(c, dict | bool)])
        kind = node.get("type")
        kind = kind[0] if isinstance(kind, list) and len(kind) == 1 else kind
        if kind == "object" and isinstance(node.get("required"), list) and isinstance(node.get("properties"), dict):
            props = node["properties"]
            need.extend(
                props[n] for n in node["required"] if isinstance(n, str) and isinstance(props.get(n), dict | bool)
            )
        if kind == "array" and isinstance(node.get("minItems"), int) and node["minItems"] > 0:
            prefix: list[Any] = node["prefixItems"] if isinstance(node.get("prefixItems"), list) else []
            rest = node.get("items")
            need.extend(c for c in prefix[: node["minItems"]] if isinstance(c, dict | bool))
            if node["minItems"] > len(prefix) and isinstance(rest, dict | bool):
                need.append(rest)
        if node.get("enum") == [] or node.get("type") == []:
            groups.append([])  # never met
        edges[id(node)], musts[id(node)], anys[id(node)] = out, need, groups
        todo.extend((child, f"{path}/{name}") for name, child in reversed(children))
        if target is not None:
            todo.append((target, str(ref)))
    return nodes, paths, edges, musts, anys


def _productive(root: Any, nodes: list[Any], musts: dict[int, list[Any]], anys: dict[int, list[list[Any]]]) -> set[int]:
    """The ids of the nodes with a finite value: the least fixpoint of "every must, and one of each group,
    has one" (a worklist, linear in the edges).  Keywords it does not model count as satisfiable."""
    waiting: dict[int, int] = {}
    parents: dict[int, list[tuple[int, int]]] = {}  # child -> (parent, group or -1)
    met: set[tuple[int, int]] = set()
    done: set[int] = set()
    ready: list[int] = []

    def mark(key: int) -> None:
        if key not in done:
            done.add(key)
            ready.append(key)

    for node in nodes:
        key = id(node)
        needs = [c for c in musts[key] if c is not True]
        groups = anys[key]
        if any(c is False for c in needs) or any(not g or all(c is False for c in g) for g in groups):
            waiting[key] = -1  # never
            continue
        waiting[key] = len(needs) + len(groups)
        for child in needs:
            parents.setdefault(id(child), []).append((key, -1))
        for g, group in enumerate(groups):
            if any(c is True for c in group):
                waiting[key] -= 1
                met.add((key, g))
            for child in group:
                parents.setdefault(id(child), []).append((key, g))
        if waiting[key] == 0:
            mark(key)
    while ready:
        child = ready.pop()
        for parent, g in parents.get(child, ()):
            if waiting[parent] < 0 or parent in done:
                continue
            if g >= 0:
                if (parent, g) in met:
                    continue
                met.add((parent, g))
            waiting[parent] -= 1
            if waiting[parent] == 0:
                mark(parent)
    return done


def _longest(root: Any, edges: dict[int, list[Any]]) -> int:
    """The longest path from ``root`` through ``edges`` with the links back into the path left out (the
    depth llguidance's recursion reaches), without recursion."""
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        node, i = stack.pop()
        key = id(node)
        if i == 0:
            if key in depth or key not in edges:
                continue
            on_path.add(key)
        out = edges[key]
        if i < len(out):
            stack.append((node, i + 1))
            child = out[i]
            if id(child) not in on_path and id(child) not in depth and id(child) in edges:
                stack.append((child, 0))
            continue
        on_path.discard(key)
        depth[key] = 1 + max((depth.get(id(c), 0) for c in out if id(c) not in on_path), default=0)
    return depth.get(id(root), 1)


def _cyclic(node: Any, edges: dict[int, list[Any]]) -> bool:
    """Whether ``node`` is reached again from itself (bounded: the graph was checked against ``MAX_NODES``)."""
    seen: set[int] = set()
    todo = list(edges.get(id(node), ()))
    while todo:
        child = todo.pop()
        if child is node:
            return True
        if id(child) not in seen:
            seen.add(id(child))
            todo.extend(edges.get(id(child), ()))
    return False


# -- regexes ------------------------------------------------------------------------------------------------

_COUNT = re.compile(r"\{(\d+)(,(\d*))?\}")


def regex_expansion(pattern: str) -> int:
    """About how many characters ``pattern``'s counted repeats expand to: each ``{n}``/``{n,m}`` multiplies
    the group or atom before it by its largest count (``*``, ``+`` and ``?`` count once).  Groups nested
    past ``MAX_JSON_DEPTH`` count as past every bound."""
    totals, lasts = [0], [0]
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            if i - 1 < len(pattern) and pattern[i - 1] in "pPxu" and i < len(pattern) and pattern[i] == "{":
                i = pattern.find("}", i) + 1 or len(pattern)
            totals[-1] += 1
            lasts[-1] = 1
            continue
        if ch == "[":
            j = i + 1 + (pattern[i + 1 : i + 2] == "^")
            j += pattern[j : j + 1] == "]"
            while j < len(pattern) and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
            totals[-1] += 1
            lasts[-1] = 1
            continue
        if ch == "(":
            totals.append(0)
            lasts.append(0)
            if len(totals) > MAX_JSON_DEPTH:
                return MAX_REPEAT * MAX_REPEAT
        elif ch == ")" and len(totals) > 1:
            size = totals.pop()
            lasts.pop()
            totals[-1] += size
            lasts[-1] = size
        elif ch == "{" and (count := _COUNT.match(pattern, i)):
            digits = count.group(3) or count.group(1)
            top = int(digits) if len(digits) < 9 else MAX_REPEAT + 1
            totals[-1] += lasts[-1] * (max(top, 1) - 1)
            lasts[-1] *= max(top, 1)
            i = count.end()
            if totals[-1] > MAX_REPEAT * MAX_REPEAT:
                return totals[-1]
            continue
        elif ch not in "|*+?^$":
            totals[-1] += 1
            lasts[-1] = 1
        i += 1
    return sum(totals)


def check_regex(pattern: str, what: str) -> None:
    if len(pattern) > MAX_REPEAT:
        raise FormatError(f"{what} is {len(pattern):,} characters long; the most Brisk takes is {MAX_REPEAT:,}.")
    if pattern.count("(") > MAX_JSON_DEPTH and regex_expansion(pattern) == MAX_REPEAT * MAX_REPEAT:
        raise FormatError(
            f"{what} nests groups more than {MAX_JSON_DEPTH} deep; the most Brisk takes is {MAX_JSON_DEPTH}."
        )
    size = regex_expansion(pattern)
    if size > MAX_REPEAT:
        shown = pattern if len(pattern) <= 40 else pattern[:37] + "..."
        raise FormatError(
            f"{what} {shown!r} repeats to about {size:,} characters; the most Brisk takes is {MAX_REPEAT:,} "
            "(use * or + for open-ended text)."
        )


# -- Lark grammars ------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<ws>[ \t\r]+) | (?P<comment>//[^\n]*) | (?P<nl>\n)
    | (?P<str>"(?:[^"\\\n]|\\.)*"i?) | (?P<re>/(?:[^/\\\n]|\\.)+/[imslux]*)
    | (?P<name>[!?]?[A-Za-z_][A-Za-z_0-9]*) | (?P<num>\d+) | (?P<special><\[?[^>\n]*>)
    | (?P<directive>%[a-z_]+) | (?P<op>\.\.|.)""",
    re.X,
)


def _lark_tokens(text: str) -> list[tuple[str, Any]]:
    """Lark's tokens as (kind, value), a ``%json``/``%regex`` body read as one JSON ("json", value)."""
    out: list[tuple[str, Any]] = []
    decoder = json.JSONDecoder()
    i = 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        assert m is not None  # the last alternative takes any character
        kind, value, i = m.lastgroup or "op", m.group(), m.end()
        if kind in ("ws", "comment"):
            continue
        if kind == "directive" and value in ("%json", "%regex", "%llguidance"):  # a JSON body follows
            j = text.find("{", i)
            try:
                body, i = decoder.raw_decode(text, j) if j >= 0 and not text[i:j].strip() else (None, i)
            except (json.JSONDecodeError, RecursionError):
                body = None
            out.append({"%json": ("json", body), "%regex": ("lexeme", body)}.get(value, ("directive", value)))
            continue
        out.append((kind, value))
    return out


def _definitions(tokens: list[tuple[str, Any]]) -> dict[str, list[tuple[str, Any]]]:
    """Each rule's (lower-case name) and terminal's tokens after its colon, by name."""
    defs: dict[str, list[tuple[str, Any]]] = {}
    body: list[tuple[str, Any]] | None = None
    at_line_start = True
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        if at_line_start and kind == "name":  # a definition: NAME, perhaps [attributes] or .priority, then ":"
            j = i + 1
            while j < min(len(tokens), i + 12) and tokens[j][0] != "nl" and tokens[j][1] not in (":", "|"):
                j += 1
            if j < len(tokens) and tokens[j][1] == ":":
                body = defs.setdefault(value.lstrip("!?"), [])
                i, at_line_start = j + 1, False
                continue
        at_line_start = kind == "nl"
        if kind == "directive":
            body = None  # %ignore, %import, %llguidance: to the end of the line, no rule's
        elif body is not None and kind != "nl":
            body.append((kind, value))
        i += 1
    return defs


def check_grammar(text: str) -> None:
    """Bound a Lark grammar: its ``%json`` schemas and regexes, the depth of its rule references, and that
    ``start`` has a finite sentence (where this reader follows every rule; else llguidance judges)."""
    defs = _definitions(_lark_tokens(text))
    if len(defs) > MAX_NODES:
        raise FormatError(f"The grammar has {len(defs):,} rules; the most Brisk takes is {MAX_NODES:,}.")
    inner = 0
    for name, body in defs.items():
        for kind, value in body:
            if kind == "json" and isinstance(value, dict):
                inner = max(inner, check_schema(value, f"The schema in rule {name!r}"))
            elif kind == "re":
                check_regex(value[1 : value.rindex("/")], f"The regex in rule {name!r}")
    nodes = {name: [name] for name in defs}  # one object per rule, for the graph's keys
    edges = {id(node): [nodes[v] for k, v in defs[name] if k == "name" and v in nodes] for name, node in nodes.items()}
    root: list[str] = []
    edges[id(root)] = list(nodes.values())
    depth = _longest(root, edges) - 1 + inner
    if depth > MAX_DEPTH:
        raise FormatError(
            f"The grammar's rules refer to each other {depth:,} levels deep; the most Brisk takes is {MAX_DEPTH}."
        )
    if "start" in defs:
        finite = _finite_rules(defs)
        if finite is not None and "start" not in finite:
            named = edges[id(nodes["start"])]
            stuck = next((n for n in defs if n[:1].islower() and n not in finite and nodes[n] in named), "start")
            raise FormatError(
                f"The grammar has no finite sentence: rule {stuck!r} can only be completed by repeating itself."
            )


def _finite_rules(defs: dict[str, list[tuple[str, Any]]]) -> set[str] | None:
    """The rules with a finite sentence (a least fixpoint, as for schemas), or None where a rule's syntax
    is beyond this reader."""
    rules: dict[str, dict[str, Any]] = {
        name: {} for name in defs if name[:1].islower()
    }  # terminals are always a finite text
    nodes: list[Any] = []
    musts: dict[int, list[Any]] = {}
    anys: dict[int, list[list[Any]]] = {}

    def node(need: list[Any], groups: list[list[Any]], into: dict[str, Any] | None = None) -> dict[str, Any]:
        made: dict[str, Any] = {} if into is None else into
        nodes.append(made)
        musts[id(made)], anys[id(made)] = need, groups
        return made

    def build(alts: list[list[Any]], into: dict[str, Any] | None = None) -> dict[str, Any]:
        return node([], [[node([item(x) for x in alt], []) for alt in alts]], into)

    def item(x: Any) -> Any:
        if isinstance(x, str):
            return rules.get(x, True)
        return True if x is True else build(x)

    for name, made in rules.items():
        parsed = _Expr(defs[name]).parse()
        if parsed is None:
            return None
        build(parsed, made)
    done = _productive(rules["start"], nodes, musts, anys)
    return {name for name, made in rules.items() if id(made) in done}


class _Expr:
    """A rule's alternatives as lists of what each needs: a rule name, a nested group, or True (always)."""

    def __init__(self, tokens: list[tuple[str, Any]]) -> None:
        self.tokens, self.i, self.depth = tokens, 0, 0

    def parse(self) -> list[list[Any]] | None:
        out = self._alternatives()
        return out if out is not None and self.i == len(self.tokens) else None

    def _peek(self) -> tuple[str, Any]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "")

    def _alternatives(self) -> list[list[Any]] | None:
        self.depth += 1
        if self.depth > 50:
            return None
        alts: list[list[Any]] = [[]]
        while True:
            kind, value = self._peek()
            if kind == "end" or value in (")", "]"):
                break
            self.i += 1
            if value == "|":
                alts.append([])
                continue
            if kind in ("str", "re", "special", "json", "lexeme", "num"):
                item: Any = True
            elif kind == "name":
                item = value.lstrip("!?")
            elif value in ("(", "["):
                inner = self._alternatives()
                if inner is None or self._peek()[1] != {"(": ")", "[": "]"}[value]:
                    return None
                self.i += 1
                item = True if value == "[" else inner
            elif value in ("?", "*") and alts[-1]:
                alts[-1][-1] = True  # the item before may be left out
                continue
            elif value in ("+", "..", "."):
                continue
            elif value == "~" or value == "{":
                item = self._count(alts[-1])
                if item is None:
                    return None
                continue
            else:
                return None
            alts[-1].append(item)
        self.depth -= 1
        return alts

    def _count(self, seq: list[Any]) -> bool | None:
        """``x ~ n``, ``x ~ n..m`` or ``x{n,m}``: with n = 0 the item may be left out."""
        kind, value = self._peek()
        if kind != "num" or not seq:
            return None
        self.i += 1
        while self._peek()[1] in ("..", ",", "}") or self._peek()[0] == "num":
            self.i += 1
            if self.tokens[self.i - 1][1] == "}":
                break
        if int(value) == 0:
            seq[-1] = True
        return True
