"""``offsim tune`` when nothing fits (issue 20): the search raises an InfeasibleError that names
the base's reason and the closest miss, and the command exits 1 (the answer is no), not 2."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from offsim.cli import app
from offsim.commands._common import ExitCode
from offsim.errors import InfeasibleError
from offsim.search.protrain import Grid, NothingFitsError, search

runner = CliRunner()

#: Three candidates (no swap or recompute, every block swaps, every block recomputes): a 70B model
#: fits the 16 GiB tiny GPU in none.
THREE = Grid((0.0,), (1,), (0.0, 1.0), (False,))


def test_search_raises_infeasible_with_the_closest_miss() -> None:
    with pytest.raises(InfeasibleError) as info:
        search("tiny", "llama2-70b", "zero-infinity-cpu", THREE)
    exc = info.value
    assert isinstance(exc, NothingFitsError)
    assert exc.need_bytes > exc.capacity_bytes > 0 and exc.tier
    text = str(exc)
    assert text.startswith("no configuration fits: the base (")
    assert re.search(r"and all 3 ProTrain candidates are infeasible; the closest is persist 0", text)
    assert f"{exc.tier} memory: needs" in text.split("the closest is ")[1]


def test_tune_exits_1_when_nothing_fits() -> None:
    res = runner.invoke(app, ["tune", "-H", "tiny", "-w", "llama2-70b", "--grid", "small"])
    assert res.exit_code == ExitCode.NO, res.output
    assert "no configuration fits" in res.output and "Traceback" not in res.output


def test_tune_json_says_infeasible_on_stdout_and_exits_1() -> None:
    res = runner.invoke(app, ["tune", "-H", "tiny", "-w", "llama2-70b", "--grid", "small", "--json"])
    assert res.exit_code == ExitCode.NO
    doc = json.loads(res.stdout)
    assert doc["feasible"] is False and "no configuration fits" in doc["reason"]
