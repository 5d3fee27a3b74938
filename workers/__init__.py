"""Device-pinned worker processes that run the OpenVINO GenAI pipelines."""
