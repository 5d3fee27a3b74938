"""A request's priority level: the body's `priority` (vLLM's), the header, and what the API key allows."""
from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr
from starlette.requests import Request

from api.http.auth import KeyAttributes
from api.queue.priority import priority_of, service_tier
from common.errors import OvqError


def request(header: str | None = None, field: Any = None, max_priority: str | None = None) -> Request:
    state: dict[str, Any] = {"priority_field": field}
    if max_priority is not None:
        state["api_key"] = KeyAttributes(key=SecretStr("k"), max_priority=max_priority)
    headers = [(b"x-ovq-priority", header.encode())] if header is not None else []
    return Request({"type": "http", "headers": headers, "state": state})


@pytest.mark.parametrize(("header", "field", "level"), [
    (None, None, "interactive"), ("batch", None, "batch"), ("low", None, "low"), (None, 3, "low"),
    (None, 0, "interactive"), ("interactive", 5, "low"), ("batch", -1, "batch"), ("2", None, "low"),
])
def test_anyone_may_lower_their_priority_and_the_lower_of_two_holds(header: str | None, field: Any,
                                                                     level: str) -> None:
    assert priority_of(request(header, field)) == level


@pytest.mark.parametrize(("header", "field"), [("high", None), (None, -1), ("-5", None)])
def test_raising_it_takes_a_key_that_allows_it(header: str | None, field: Any) -> None:
    for refused in (request(header, field), request(header, field, max_priority="interactive")):
        with pytest.raises(OvqError) as caught:
            priority_of(refused)
        assert caught.value.status == 403 and caught.value.body.code == "priority_not_allowed"
    assert priority_of(request(header, field, max_priority="high")) == "high"


@pytest.mark.parametrize(("header", "field"), [("urgent", None), (None, "high"), (None, True), (None, 1.5)])
def test_a_priority_that_is_not_one_is_a_400(header: str | None, field: Any) -> None:
    with pytest.raises(OvqError) as caught:
        priority_of(request(header, field))
    assert caught.value.status == 400


def tiered(tier: Any, header: str | None = None, max_priority: str | None = None) -> Request:
    req = request(header, None, max_priority)
    req.state.tier_field = tier
    return req


@pytest.mark.parametrize(("tier", "header", "level", "echo"), [
    ("auto", None, "interactive", "default"), ("default", None, "interactive", "default"),
    ("flex", None, "low", "flex"), ("flex", "batch", "batch", "flex"), ("default", "low", "low", "flex"),
])
def test_service_tier_flex_is_the_low_level_and_auto_or_default_change_nothing(tier: str, header: str | None,
                                                                                 level: str, echo: str) -> None:
    req = tiered(tier, header)
    assert priority_of(req) == level and service_tier(req) == echo


def test_service_tier_priority_is_the_high_level_for_keys_that_may_raise_it() -> None:
    assert service_tier(tiered("priority", max_priority="high")) == "priority"
    for refused in (tiered("priority"), tiered("priority", max_priority="interactive")):
        with pytest.raises(OvqError) as caught:
            priority_of(refused)
        assert caught.value.status == 403 and caught.value.body.code == "priority_not_allowed"
        assert caught.value.body.param == "service_tier"
    assert priority_of(tiered("priority", header="low")) == "low"  # the lowest asked for holds: nothing raised


@pytest.mark.parametrize("tier", ["scale", "PRIORITY", 1, True])
def test_a_service_tier_that_is_not_one_is_a_400(tier: Any) -> None:
    with pytest.raises(OvqError) as caught:
        priority_of(tiered(tier))
    assert caught.value.status == 400 and caught.value.body.param == "service_tier"
