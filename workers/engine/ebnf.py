"""EBNF grammars in xgrammar's notation (what GenAI's `StructuredOutputConfig(grammar=...)` compiles) as data.

Only what ovq writes or derives is read: rules `name ::= expression`, alternatives `|`, sequences, groups, string
literals and character classes with xgrammar's escapes (`\\n \\t \\r \\\\ \\" \\xHH \\uHHHH \\UHHHHHHHH`), and the
repetitions `* + ? {m} {m,} {m,n}`. Anything else (lookahead, TagDispatch, comments) raises `Unreadable`, and the
caller treats the grammar as one it cannot take apart. Expressions are immutable tuples so that they hash:
  ("lit", text)  ("cls", ((lo, hi), ...), negated)  ("seq", (e, ...))  ("alt", (e, ...))
  ("rep", e, min, max | None)  ("ref", name)
`EPSILON` (the empty sequence) matches the empty text, `NOTHING` (the empty alternative) matches no text.
"""
from __future__ import annotations

import re
from typing import Any

Expr = tuple[Any, ...]
Rules = dict[str, Expr]
EPSILON: Expr = ("seq", ())
NOTHING: Expr = ("alt", ())
ANY_CHAR: Expr = ("cls", (), True)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "[": "[", "]": "]", "-": "-",
            "^": "^", "/": "/", "b": "\b", "f": "\f", "v": "\v", "0": "\0"}
_HEX = {"x": 2, "u": 4, "U": 8}
_TOKEN = re.compile(r'\s+|::=|[A-Za-z_][A-Za-z0-9_.-]*|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{[0-9, ]+\}|[|()*+?]')


class Unreadable(ValueError):
    """A grammar in notation this module does not read."""


def lit(text: str) -> Expr:
    return ("lit", text) if text else EPSILON


def seq(*items: Expr) -> Expr:
    """A sequence, flattened: empty parts dropped; a part that matches nothing makes it match nothing."""
    flat: list[Expr] = []
    for item in items:
        if item == NOTHING:
            return NOTHING
        flat.extend(item[1] if item[0] == "seq" else (item,))
    return flat[0] if len(flat) == 1 else ("seq", tuple(flat))


def alt(*items: Expr) -> Expr:
    """A choice, flattened and without repeats; alternatives that match nothing dropped."""
    flat: dict[Expr, None] = {}
    for item in items:
        for each in item[1] if item[0] == "alt" else (item,):
            flat[each] = None
    return next(iter(flat)) if len(flat) == 1 else ("alt", tuple(flat))


def rep(item: Expr, low: int, high: int | None) -> Expr:
    if high == 0 or item == EPSILON:
        return EPSILON
    if item == NOTHING:
        return EPSILON if low == 0 else NOTHING
    return item if (low, high) == (1, 1) else ("rep", item, low, high)


def parse(text: str) -> Rules:
    """The rules of an EBNF grammar, in order (`root` first where the text has it first)."""
    tokens = [t for t in _tokens(text) if not t.isspace()]
    starts = [i for i in range(len(tokens) - 1) if tokens[i + 1] == "::="]
    if not starts or starts[0] != 0:
        raise Unreadable("no rule at the start")
    rules: Rules = {}
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(tokens)
        body, at = _alternatives(tokens, start + 2, end)
        if at != end:
            raise Unreadable(f"unexpected {tokens[at]!r} in rule {tokens[start]}")
        rules[tokens[start]] = body
    return rules


def _tokens(text: str) -> list[str]:
    out, at = [], 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise Unreadable(f"cannot read {text[at:at + 20]!r}")
        out.append(match.group())
        at = match.end()
    return out


def _alternatives(tokens: list[str], at: int, end: int) -> tuple[Expr, int]:
    options = []
    while True:
        items = []
        while at < end and tokens[at] not in ("|", ")"):
            item, at = _repeated(tokens, at, end)
            items.append(item)
        options.append(seq(*items))
        if at < end and tokens[at] == "|":
            at += 1
            continue
        return alt(*options), at


def _repeated(tokens: list[str], at: int, end: int) -> tuple[Expr, int]:
    item, at = _primary(tokens, at, end)
    while at < end and (tokens[at] in ("*", "+", "?") or tokens[at].startswith("{")):
        mark = tokens[at]
        if mark.startswith("{"):
            low, _, high = mark[1:-1].replace(" ", "").partition(",")
            bounds = (int(low), int(high) if high else (None if _ else int(low)))
        else:
            bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[mark]
        item = ("rep", item, *bounds)
        at += 1
    return item, at


def _primary(tokens: list[str], at: int, end: int) -> tuple[Expr, int]:
    if at >= end:
        raise Unreadable("an expression ends early")
    token = tokens[at]
    if token == "(":
        inner, at = _alternatives(tokens, at + 1, end)
        if at >= end or tokens[at] != ")":
            raise Unreadable("unclosed group")
        return inner, at + 1
    if token.startswith('"'):
        return lit(_unescape(token[1:-1])), at + 1
    if token.startswith("["):
        return _class(token[1:-1]), at + 1
    if token[0].isalpha() or token[0] == "_":  # a macro (TagDispatch) is a name no rule defines: refused later
        return ("ref", token), at + 1
    raise Unreadable(f"unexpected {token!r}")


def _chars(body: str) -> list[tuple[str, bool]]:
    """Each character of a literal or class body, with whether it was escaped."""
    out, at = [], 0
    while at < len(body):
        char = body[at]
        if char != "\\":
            out.append((char, False))
            at += 1
            continue
        code = body[at + 1]
        if code in _HEX:
            width = _HEX[code]
            out.append((chr(int(body[at + 2:at + 2 + width], 16)), True))
            at += 2 + width
        elif code in _ESCAPES:
            out.append((_ESCAPES[code], True))
            at += 2
        else:
            raise Unreadable(f"unknown escape \\{code}")
    return out


def _unescape(body: str) -> str:
    return "".join(char for char, _ in _chars(body))


def _class(body: str) -> Expr:
    chars = _chars(body)
    negated = bool(chars) and chars[0] == ("^", False)
    chars = chars[1:] if negated else chars
    ranges, at = [], 0
    while at < len(chars):
        if at + 2 < len(chars) and chars[at + 1] == ("-", False):
            ranges.append((ord(chars[at][0]), ord(chars[at + 2][0])))
            at += 3
        else:
            ranges.append((ord(chars[at][0]), ord(chars[at][0])))
            at += 1
    return ("cls", tuple(ranges), negated)


def matches(item: Expr, char: str) -> bool:
    """Whether the class `item` takes `char`."""
    code = ord(char)
    return any(lo <= code <= hi for lo, hi in item[1]) != item[2]


def render(rules: Rules) -> str:
    """The grammar as EBNF text, `root` first."""
    order = ["root", *(name for name in rules if name != "root")]
    return "\n".join(f"{name} ::= {_render(rules[name], 0)}" for name in order) + "\n"


def _render(item: Expr, outer: int) -> str:
    """`outer`: 0 at the top of a rule, 1 inside a sequence, 2 under a repetition (how tightly it must bind)."""
    kind = item[0]
    if kind == "lit":
        return '"' + "".join(_escape(c) for c in item[1]) + '"'
    if kind == "cls":
        body = "".join(_escape(chr(lo), True) + ("" if lo == hi else "-" + _escape(chr(hi), True))
                       for lo, hi in item[1])
        return "[" + ("^" if item[2] else "") + body + "]"
    if kind == "ref":
        return item[1]
    if kind == "rep":
        low, high = item[2], item[3]
        mark = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((low, high))
        mark = mark or (f"{{{low},}}" if high is None else f"{{{low},{high}}}")
        return _render(item[1], 2) + mark
    if kind == "seq":
        if not item[1]:
            return '""'
        text = " ".join(_render(part, 1) for part in item[1])
        return f"({text})" if outer == 2 and len(item[1]) > 1 else text
    if not item[1]:
        raise Unreadable("a rule that matches nothing cannot be written")
    text = " | ".join(_render(part, 1) for part in item[1])
    return f"({text})" if outer and len(item[1]) > 1 else text


def _escape(char: str, in_class: bool = False) -> str:
    if char in '"\\' or (in_class and char in "[]^-"):
        return "\\" + char
    code = ord(char)
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    return char
