"""Checks that need the model: its limits (OVMS's best_of_limit, max_tokens_limit) and its servable type."""
from __future__ import annotations

from api.openai.protocol import SamplingRequest
from common.errors import OvqError
from common.modelcard import ModelCard
from common.servable import ServableType

STATEFUL = (ServableType.LM, ServableType.VLM)


def check_for_model(body: SamplingRequest, card: ModelCard) -> None:
    limit = card.max_tokens_limit
    if limit is not None and body.max_tokens is not None and body.max_tokens > limit:
        raise OvqError(f"max_tokens value {body.max_tokens} exceeds the limit {limit} (max_tokens_limit)",
                       param="max_tokens")
    if body.best_of is not None and body.best_of > card.best_of_limit:
        raise OvqError(f"best_of exceeds limit provided in the model config: {card.best_of_limit} (best_of_limit)",
                       param="best_of")
    if body.n > card.best_of_limit:
        raise OvqError(f"n exceeds limit provided in the model config: {card.best_of_limit} (best_of_limit)",
                       param="n")
    _check_token_ids(body, card)
    _check_assisted(body, card)
    if card.servable_type in STATEFUL:
        _check_stateful(body)


def _check_assisted(body: SamplingRequest, card: ModelCard) -> None:
    """Assisted generation's request values need a model served with it: prompt lookup or a draft model."""
    if body.num_assistant_tokens is not None and not (card.prompt_lookup or card.speculative):
        raise OvqError("num_assistant_tokens needs a model served with a draft model (draft_models_path) or with "
                       'prompt lookup decoding (plugin_config {"prompt_lookup": true})', param="num_assistant_tokens")
    if body.max_ngram_size is not None and not card.prompt_lookup:
        raise OvqError('max_ngram_size needs a model served with prompt lookup decoding (plugin_config '
                       '{"prompt_lookup": true})', param="max_ngram_size")
    if body.assistant_confidence_threshold is not None and not card.speculative:
        raise OvqError("assistant_confidence_threshold needs a model served with a draft model (draft_models_path)",
                       param="assistant_confidence_threshold")


def _check_token_ids(body: SamplingRequest, card: ModelCard) -> None:
    """Token ids must name tokens of this model, as prompt token ids must (an unknown id would never match)."""
    ids = body.stop_token_ids or []
    vocab = card.vocab_size
    bad = [i for i in ids if i < 0 or (vocab is not None and i >= vocab)]
    if bad:
        limit = f"[0, {vocab})" if vocab is not None else "non-negative"
        raise OvqError(f"stop_token_ids must be in {limit}: {bad[0]} is not", param="stop_token_ids")


def _check_stateful(body: SamplingRequest) -> None:
    """What LLMPipeline/VLMPipeline cannot do: one sequence per request, no per-token log-probabilities."""
    if body.n > 1 or (body.best_of or 1) > 1:
        param = "n" if body.n > 1 else "best_of"
        raise OvqError(f"this stateful servable generates one sequence per request: {param} must be 1 "
                       "(n, best_of and beam search are not supported)", param=param)
    if body.top_logprobs_asked is not None:
        raise OvqError("logprobs are not supported by stateful servables: their pipeline reports no per-token "
                       "log-probabilities", param="logprobs")
    if getattr(body, "echo", False):
        raise OvqError("echo is not supported by stateful servables", param="echo")
