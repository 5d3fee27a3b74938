"""An API process's aliases: the conversation key's precedence, the count per alias and target, a reload that
keeps an unchanged alias's place in its deal."""
from __future__ import annotations

from api.openai.aliases import AliasRoutes, conversation_key
from common.models.aliases import Alias

CANARY = Alias(name="chat", weights={"model-a": 1, "model-b": 1})


def test_prompt_cache_key_comes_before_user() -> None:
    assert conversation_key({"prompt_cache_key": "p", "user": "u"}) == "p"
    assert conversation_key({"prompt_cache_key": "", "user": "u"}) == "u"
    assert conversation_key({"user": 7}) is None and conversation_key({}) is None


def test_a_model_name_is_no_alias_and_each_routing_is_counted() -> None:
    counted: list[tuple[str, str]] = []
    routes = AliasRoutes([CANARY], lambda alias, target: counted.append((alias, target)))
    assert routes.route("model-a", None) is None
    keyed = routes.route("chat", "conversation-1")
    assert keyed == CANARY.by_key("conversation-1")
    assert counted == [("chat", keyed)]


def test_a_reload_keeps_an_unchanged_alias_s_deal_and_replaces_a_changed_one() -> None:
    routes = AliasRoutes([CANARY])
    assert routes.route("chat", None) == "model-a"
    routes.apply([Alias(name="chat", weights={"model-a": 1, "model-b": 1})])  # the same weights
    assert routes.route("chat", None) == "model-b"  # where the deal was
    routes.apply([Alias(name="chat", weights={"model-b": 1})])
    assert [routes.route("chat", None) for _ in range(3)] == ["model-b"] * 3
    routes.apply([])
    assert not routes and routes.route("chat", None) is None
