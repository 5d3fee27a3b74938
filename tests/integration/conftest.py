from __future__ import annotations

import pytest
from openai import OpenAI

from tests.conftest import Stack


@pytest.fixture()
def client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)
