"""Which worker class runs a model: the servable type (from its directory and the device) says. Shared by a
dedicated worker (`python -m workers --model M`) and a pool worker, which hosts one of these per resident model."""
from __future__ import annotations

from common.models.config import ModelConfig
from common.servable import ServableType, infer_servable


def worker_class(model: ModelConfig, device: str) -> type:
    kind = infer_servable(model.path, device, model.pipeline_type)
    if kind is ServableType.IMAGE:
        from workers.image.worker import ImageWorker

        return ImageWorker
    if kind is ServableType.VIDEO:
        from workers.video.worker import VideoWorker

        return VideoWorker
    if kind in (ServableType.S2T, ServableType.T2S):
        from workers.audio.worker import SpeechWorker

        return SpeechWorker
    if kind in (ServableType.EMBEDDINGS, ServableType.RERANK):
        from workers.embed.worker import EncoderWorker

        return EncoderWorker
    from workers.text.worker import TextWorker

    return TextWorker
