"""The grammar of what may still follow: a structured job's grammar after the text it has already written.

A job taken over by another worker goes on from the ids it had streamed (prompt + ids prefilled). GenAI's
grammar matcher starts at the grammar's beginning and takes no state: openvino-genai 2026.4.1's
`StructuredOutputConfig` holds only the grammar, and its `LogitProcessor` feeds the matcher the generated tokens
alone, never the prompt (docs/explanation/durability.md shows what that does). So the new request is constrained by the
*residual* grammar instead: the texts `s` such that `prefix + s` is in the job's language (the left quotient).
It is built here by Brzozowski derivatives of the grammar, one character at a time (each rule reached at a
character gets a derived copy), then written out as EBNF for GenAI to compile like any other grammar.

A job's structured tree (`common.structured`) becomes one grammar: compact JSON schemas (`compact_json`), EBNF,
constants, tags (free text inside a tag is any text without its end), concatenations, unions and tags with a
separator. Not taken apart (`grammar_of` answers None, and such a job still ends with an error on takeover):
JSON schemas that only xgrammar compiles, regexes, triggered tags and free text outside a tag.
"""
from __future__ import annotations

import json
from typing import Any

from workers.engine import ebnf
from workers.engine.compact_json import compact_grammar
from workers.engine.ebnf import EPSILON, NOTHING, Expr, Rules, alt, lit, rep, seq


class Grammar:
    """Rules with a root; derived rules are added as `derive` goes. Which rules match the empty text and which
    match any text at all is known for every rule, worked out once for each new one."""

    def __init__(self, rules: Rules, root: Expr) -> None:
        self.rules = rules
        self.root = root
        self.serial = 0
        self.nullable = _grow(rules, rules, set(), _empty_ok)
        self.productive = _grow(rules, rules, set(), _productive)
        self.live = len(rules)

    def derive(self, text: str) -> bool:
        """Move past `text`; False if no word of the grammar begins with it."""
        for char in text:
            derived: dict[str, str] = {}
            self.root = _derive(self.root, char, self, self.nullable, derived)
            self._settle(set(derived.values()))
            if self.root == NOTHING:
                return False
        return True

    def complete(self) -> bool:
        """Whether the text derived so far is a whole word of the grammar."""
        return _empty_ok(self.root, self.nullable)

    def new_name(self, base: str) -> str:
        self.serial += 1
        return f"{base.split('__')[0]}__{self.serial}"

    def _settle(self, new: set[str]) -> None:
        """New rules that match nothing are dropped, those with no references inlined (JSON text is mostly those:
        a string's next character), and now and then the rules no longer reached are forgotten."""
        self.productive = _grow(self.rules, new, self.productive, _productive)
        empty = new - self.productive
        swap = {name: NOTHING for name in empty}
        swap.update({name: self.rules[name] for name in new - empty if not _refs(self.rules[name])})
        if swap:
            for name in new:
                self.rules[name] = _substitute(self.rules[name], swap)
            self.root = _substitute(self.root, swap)
        self.nullable = _grow(self.rules, new, self.nullable, _empty_ok)
        if len(self.rules) > 2 * self.live + 64:
            reached = _reached(self.rules, self.root)
            self.rules = {name: body for name, body in self.rules.items() if name in reached}
            self.nullable &= reached
            self.productive &= reached
            self.live = len(self.rules)

    def text(self) -> str:
        """The grammar as EBNF for GenAI, the rules it reaches only."""
        reached = _reached(self.rules, self.root)
        rules = {"root": self.root, **{name: body for name, body in self.rules.items() if name in reached}}
        return ebnf.render(rules)


def residual(tree: dict[str, Any], prefix: str) -> str | None:
    """EBNF for what may follow `prefix` in `tree`'s language, or None where it cannot be built here."""
    grammar = grammar_of(tree)
    if grammar is None or not grammar.derive(prefix):
        return None
    return grammar.text()


def continuable(tree: dict[str, Any]) -> bool:
    """Whether a job with this structured output can go on after a takeover (its residual can be built)."""
    return grammar_of(tree) is not None


def grammar_of(tree: dict[str, Any]) -> Grammar | None:
    """The tree as one grammar, or None for a node this module does not take apart."""
    rules: Rules = {}
    try:
        root = _node(tree, rules)
    except ebnf.Unreadable:
        return None
    rules.pop("root", None)
    return Grammar(rules, root)


def _node(node: dict[str, Any], rules: Rules) -> Expr:
    (kind, value), = node.items()
    if kind == "json_schema":
        grammar = compact_grammar(json.loads(value))
        if grammar is None:
            raise ebnf.Unreadable("a JSON schema only xgrammar compiles")
        return _embed(grammar, rules)
    if kind == "ebnf":
        return _embed(value, rules)
    if kind == "const":
        return lit(value)
    if kind == "tag":
        content = value["content"]
        inner = (_without(value["end"], rules) if "any_text" in content else _node(content, rules))
        return seq(lit(value["begin"]), inner, lit(value["end"]))
    if kind == "tags_with_separator":
        return _separated(value, rules)
    if kind == "concat":
        return seq(*(_node(n, rules) for n in value))
    if kind == "union":
        return alt(*(_node(n, rules) for n in value))
    raise ebnf.Unreadable(f"{kind} is not taken apart")


def _embed(text: str, rules: Rules) -> Expr:
    """A grammar's rules under names of their own (several grammars share one set of rules)."""
    own = ebnf.parse(text)
    tag = f"g{len(rules)}_"
    # Unique, and without "__", which `Grammar.new_name` puts before a derived rule's number.
    names = {name: f"{tag}{i}_{name.replace('_', '')}" for i, name in enumerate(own)}
    for name, body in own.items():
        rules[names[name]] = _rename(body, names)
    return ("ref", names["root"])


def _rename(item: Expr, names: dict[str, str]) -> Expr:
    kind = item[0]
    if kind == "ref":
        if item[1] not in names:
            raise ebnf.Unreadable(f"rule {item[1]} is not defined")
        return ("ref", names[item[1]])
    if kind in ("seq", "alt"):
        return (kind, tuple(_rename(part, names) for part in item[1]))
    if kind == "rep":
        return ("rep", _rename(item[1], names), item[2], item[3])
    return item


def _separated(value: dict[str, Any], rules: Rules) -> Expr:
    """xgrammar's tags_with_separator: tags, `separator` between two, at least one if asked, one at most if
    `stop_after_first`."""
    one = alt(*(_node(t, rules) for t in value["tags"]))
    if value["stop_after_first"]:
        many = one
    else:
        name = f"g{len(rules)}_tags"
        rules[name] = seq(one, rep(seq(lit(value["separator"]), one), 0, None))
        many = ("ref", name)
    return many if value["at_least_one"] else alt(many, EPSILON)


def _without(end: str, rules: Rules) -> Expr:
    """Any text that does not contain `end` (a tag's free content): one rule per state of a KMP matcher of
    `end`, state i meaning the text ends with end[:i]."""
    if not end:
        return rep(ebnf.ANY_CHAR, 0, None)
    fail = [0] * (len(end) + 1)
    for i in range(1, len(end)):
        k = fail[i]
        while k and end[i] != end[k]:
            k = fail[k]
        fail[i + 1] = k + 1 if end[i] == end[k] else 0
    base = f"g{len(rules)}_free"
    for state in range(len(end)):
        moves: dict[str, int] = {}
        for char in dict.fromkeys(end):
            k = state
            while k and end[k] != char:
                k = fail[k]
            k = k + 1 if end[k] == char else 0
            if k < len(end):
                moves[char] = k
            else:
                moves[char] = -1  # would complete `end`: not allowed inside
        others = ("cls", tuple((ord(c), ord(c)) for c in moves), True)
        options = [EPSILON, seq(others, ("ref", f"{base}0"))]
        options += [seq(lit(c), ("ref", f"{base}{k}")) for c, k in moves.items() if k >= 0]
        rules[f"{base}{state}"] = alt(*options)
    return ("ref", f"{base}0")


def _grow(rules: Rules, names: Any, found: set[str], holds: Any) -> set[str]:
    """`found` grown, in place, by those of `names` whose body `holds` given what is found, to a fixpoint (rules
    matching the empty text, or matching any text at all)."""
    todo = {name for name in names if name not in found}
    while True:
        more = {name for name in todo if holds(rules[name], found)}
        if not more:
            return found
        found |= more
        todo -= more


def _empty_ok(item: Expr, nullable: set[str]) -> bool:
    kind = item[0]
    if kind == "lit" or kind == "cls":
        return False
    if kind == "ref":
        return item[1] in nullable
    if kind == "seq":
        return all(_empty_ok(part, nullable) for part in item[1])
    if kind == "alt":
        return any(_empty_ok(part, nullable) for part in item[1])
    return item[2] == 0 or _empty_ok(item[1], nullable)


def _derive(item: Expr, char: str, grammar: Grammar, nullable: set[str], derived: dict[str, str]) -> Expr:
    """The texts `s` with `char + s` matched by `item`."""
    kind = item[0]
    if kind == "lit":
        return lit(item[1][1:]) if item[1][0] == char else NOTHING
    if kind == "cls":
        return EPSILON if ebnf.matches(item, char) else NOTHING
    if kind == "ref":
        return ("ref", _derived_rule(item[1], char, grammar, nullable, derived))
    if kind == "alt":
        return alt(*(_derive(part, char, grammar, nullable, derived) for part in item[1]))
    if kind == "seq":
        options, parts = [], item[1]
        for at, part in enumerate(parts):
            options.append(seq(_derive(part, char, grammar, nullable, derived), *parts[at + 1:]))
            if not _empty_ok(part, nullable):
                break
        return alt(*options)
    inner, low, high = item[1], item[2], item[3]
    low = 0 if _empty_ok(inner, nullable) else max(low - 1, 0)
    return seq(_derive(inner, char, grammar, nullable, derived), rep(inner, low, None if high is None else high - 1))


def _derived_rule(name: str, char: str, grammar: Grammar, nullable: set[str], derived: dict[str, str]) -> str:
    """The name of rule `name`'s derivative by `char`, made once per character (a rule may reach itself)."""
    if name not in derived:
        derived[name] = grammar.new_name(name)
        grammar.rules[derived[name]] = _derive(grammar.rules[name], char, grammar, nullable, derived)
    return derived[name]


def _refs(item: Expr) -> bool:
    kind = item[0]
    if kind == "ref":
        return True
    if kind in ("seq", "alt"):
        return any(_refs(part) for part in item[1])
    return kind == "rep" and _refs(item[1])


def _productive(item: Expr, productive: set[str]) -> bool:
    kind = item[0]
    if kind in ("lit", "cls"):
        return True
    if kind == "ref":
        return item[1] in productive
    if kind == "seq":
        return all(_productive(part, productive) for part in item[1])
    if kind == "alt":
        return any(_productive(part, productive) for part in item[1])
    return item[2] == 0 or _productive(item[1], productive)


def _substitute(item: Expr, swap: dict[str, Expr]) -> Expr:
    kind = item[0]
    if kind == "ref":
        return swap.get(item[1], item)
    if kind == "seq":
        return seq(*(_substitute(part, swap) for part in item[1]))
    if kind == "alt":
        return alt(*(_substitute(part, swap) for part in item[1]))
    if kind == "rep":
        return rep(_substitute(item[1], swap), item[2], item[3])
    return item


def _reached(rules: Rules, root: Expr) -> set[str]:
    seen: set[str] = set()
    todo = [root]
    while todo:
        item = todo.pop()
        kind = item[0]
        if kind == "ref" and item[1] not in seen:
            seen.add(item[1])
            todo.append(rules[item[1]])
        elif kind in ("seq", "alt"):
            todo.extend(item[1])
        elif kind == "rep":
            todo.append(item[1])
    return seen
