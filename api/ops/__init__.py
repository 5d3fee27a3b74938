"""The operators' page at /ops: queues, workers, rates and latencies, dead letters, failures; drain and retry."""
from api.ops.routes import router

__all__ = ["router"]
