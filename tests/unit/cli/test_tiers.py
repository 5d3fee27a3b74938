"""`ovq api` and `ovq serve` take the API's options alike, and pass them on alike."""
from __future__ import annotations

from pathlib import Path

from cli.main import parser
from cli.tiers import api_env, key_env

OPTIONS = ["--config", "m.yaml", "--host", "0.0.0.0", "--port", "9000", "--ovms-config", "repo", "--api-key", "k1",
           "--log_level", "DEBUG"]


def test_api_and_serve_read_the_same_options_into_the_same_environment() -> None:
    api = parser().parse_args(["api", *OPTIONS, "--processes", "3"])
    serve = parser().parse_args(["serve", *OPTIONS, "--api-processes", "3"])
    expected = {"OVQ_CONFIG": str(Path("m.yaml").absolute()), "OVQ_OVMS_CONFIG": str(Path("repo").absolute()),
                "OVQ_LOG_LEVEL": "debug", "OVQ_HOST": "0.0.0.0", "OVQ_PORT": "9000", "OVQ_API_PROCESSES": "3"}
    assert api_env(api) == api_env(serve) == expected
    assert key_env(api) == key_env(serve) == {"OVQ_API_KEYS": '["k1"]'}


def test_ovms_spellings_of_port_and_host() -> None:
    args = parser().parse_args(["serve", "--rest_port", "9001", "--rest_bind_address", "::"])
    assert api_env(args) == {"OVQ_HOST": "::", "OVQ_PORT": "9001"}
