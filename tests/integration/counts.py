"""What a fault test tallies: accepted (answered), completed (2xx), failed with a clean error (a 4xx in the
OpenAI envelope), hung (no answer in time: must be 0) and 5xx (must be 0)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

REPR = re.compile(r"object at 0x[0-9a-fA-F]+")


@dataclass
class Tally:
    accepted: int = 0
    completed: int = 0
    clean: int = 0
    hung: int = 0
    server_errors: int = 0
    odd: list[str] = field(default_factory=list)

    def record(self, response: Any | None) -> Any | None:
        if response is None:
            self.hung += 1
            return None
        self.accepted += 1
        if response.status_code >= 500:
            self.server_errors += 1
        elif response.status_code < 300:
            self.completed += 1
        elif _clean_error(response):
            self.clean += 1
        else:
            self.odd.append(response.text[:200])
        return response

    def __str__(self) -> str:
        return (f"accepted {self.accepted}, completed {self.completed}, failed with a clean error {self.clean}, "
                f"hung {self.hung}, 5xx {self.server_errors}, other {len(self.odd)}")

    def check(self) -> None:
        print(self)
        assert self.hung == 0 and self.server_errors == 0 and not self.odd, f"{self}: {self.odd}"


def _clean_error(response: Any) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return set(error) == {"message", "type", "param", "code"} and bool(error["message"]) and not REPR.search(str(error))
