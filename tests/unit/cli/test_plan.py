"""`ovq plan`: the capacity model from the command line, as a table or JSON; bad input is one line and exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.capacity import Costs, Load, plan
from cli.main import main


def test_json_is_the_models_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--requests-per-s", "200", "--tokens", "64", "--streams", "400", "--workers", "40",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = plan(Load(requests_per_s=200, tokens_per_s=12_800, streams=400, workers=40, apis=1), Costs.load())
    assert out == json.loads(expected.model_dump_json())


def test_tenants_are_part_of_the_load(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--requests-per-s", "50", "--workers", "10", "--tenants", "20", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["load"]["tenants"] == 20


def test_workers_are_sized_from_what_one_engine_streams(capsys: pytest.CaptureFixture[str]) -> None:
    # 100 req/s x 100 tokens = 10,000 tok/s; 500 tok/s per worker at 0.8 of it: 25 workers.
    assert main(["plan", "--requests-per-s", "100", "--tokens", "100", "--worker-tokens-per-s", "500",
                 "--headroom", "0.8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["load"]["workers"] == 25
    assert out["load"]["streams"] == 500  # 100 req/s x the default 5 s a request


def test_the_table_names_each_tier_and_the_first_limits(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--requests-per-s", "50", "--workers", "10"]) == 0
    out = capsys.readouterr().out
    for text in ("API process", "Redis master", "worker(s)", "first limits", "unit costs: benchmarks/capacity.py"):
        assert text in out


@pytest.mark.parametrize("argv", [["--requests-per-s", "0", "--workers", "1"],
                                  ["--requests-per-s", "1", "--workers", "1", "--headroom", "1.5"],
                                  ["--requests-per-s", "inf", "--workers", "1"],
                                  ["--requests-per-s", "1"]])
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["plan", *argv])
    assert done.value.code == 2


@pytest.mark.parametrize(("argv", "field"), [(["--workers", "0"], "workers"),
                                             (["--workers", "1", "--streams", "0"], "streams"),
                                             (["--workers", "1", "--tokens", "-1"], "tokens_per_s"),
                                             (["--workers", "1", "--tenants", "-1"], "tenants")])
def test_a_load_the_model_refuses_is_one_line(argv: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--requests-per-s", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ovq: {field}:") and len(err.strip().splitlines()) == 1


def test_costs_of_ones_own_machines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doubled = Costs.load().model_dump()
    for tier in ("api", "workers", "redis"):
        doubled[tier] = {k: v * 2 for k, v in doubled[tier].items()}
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps(doubled))
    argv = ["plan", "--requests-per-s", "100", "--workers", "10", "--json"]
    assert main(argv) == 0
    shipped = json.loads(capsys.readouterr().out)
    assert main([*argv, "--costs", str(mine)]) == 0
    ours = json.loads(capsys.readouterr().out)
    load = Load(requests_per_s=100, tokens_per_s=12_800, streams=500, workers=10, apis=1)
    assert ours == json.loads(plan(load, Costs.model_validate(doubled)).model_dump_json()) != shipped
    assert ours["cores"]["workers"] > 1.9 * shipped["cores"]["workers"]
    (tmp_path / "broken.json").write_text("{}")
    assert main([*argv, "--costs", str(tmp_path / "broken.json")]) == 2
    assert "cannot read the unit costs" in capsys.readouterr().err
