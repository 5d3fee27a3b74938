"""Request values that need the model served a certain way: assisted generation (a draft model, prompt lookup)."""
from __future__ import annotations

import pytest

from api.openai.checks import check_for_model
from api.openai.protocol import ChatCompletionRequest
from common.errors import OvqError
from common.modelcard import ModelCard
from common.servable import ServableType

MSG = [{"role": "user", "content": "hi"}]


def card(**served: bool) -> ModelCard:
    return ModelCard(name="m", device="CPU", servable_type=ServableType.LM_CB, created=0, **served)


@pytest.mark.parametrize(("extra", "served", "refused"), [
    ({"num_assistant_tokens": 3}, {}, "num_assistant_tokens"),
    ({"num_assistant_tokens": 3}, {"speculative": True}, None),
    ({"num_assistant_tokens": 3}, {"prompt_lookup": True}, None),
    ({"max_ngram_size": 2}, {"speculative": True}, "max_ngram_size"),
    ({"assistant_confidence_threshold": 0.4}, {"prompt_lookup": True}, "assistant_confidence_threshold"),
    ({"assistant_confidence_threshold": 0.4}, {"speculative": True}, None),
])
def test_assisted_generation_values_need_a_model_served_with_it(extra: dict, served: dict,
                                                                refused: str | None) -> None:
    body = ChatCompletionRequest(model="m", messages=MSG, **extra)
    if refused is None:
        check_for_model(body, card(**served))
        return
    with pytest.raises(OvqError) as caught:
        check_for_model(body, card(**served))
    assert caught.value.status == 400 and caught.value.body.param == refused
