"""EBNF in xgrammar's notation read into expressions and written back."""
from __future__ import annotations

import pytest

from workers.engine import ebnf
from workers.engine.compact_json import compact_grammar


def test_a_grammar_written_back_reads_as_the_same_rules() -> None:
    text = compact_grammar({"type": "object", "properties": {"a": {"type": "array", "items": {"enum": ["x", 1]},
                                                                   "maxItems": 3}}})
    rules = ebnf.parse(text)
    assert ebnf.parse(ebnf.render(rules)) == rules
    assert rules["json_char"][1][0] == ("cls", ((34, 34), (92, 92), (0, 31)), True)


def test_escapes_are_characters_and_come_back_escaped() -> None:
    rules = ebnf.parse('root ::= "a\\n\\x41\\u00e9\\"" [\\]\\-^a-c] other\nother ::= ""')
    assert rules["root"] == ("seq", (("lit", 'a\nAé"'), ("cls", ((93, 93), (45, 45), (94, 94), (97, 99)), False),
                                     ("ref", "other")))
    assert rules["other"] == ebnf.EPSILON
    assert ebnf.parse(ebnf.render(rules)) == rules


@pytest.mark.parametrize("text", ['root ::= "a" (= "b")', 'root ::= TagDispatch(("<a>", b))', "root ::= 'a'",
                                  'rule ::= "a"\nroot ::= rule'])
def test_notation_not_read_here_is_refused(text: str) -> None:
    with pytest.raises(ebnf.Unreadable):
        rules = ebnf.parse(text)
        if "root" not in rules or next(iter(rules)) != "root":
            raise ebnf.Unreadable("root is not first")
