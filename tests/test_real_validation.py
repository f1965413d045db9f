"""The closed loop: the simulated twin of the real trainer, and `offsim validate --real` on CPU."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from offsim import load_profile, load_workload
from offsim.cli import app
from offsim.real_validation import compare, simulate_twin, twin_strategy, twin_workload


def test_twin_matches_the_real_model() -> None:
    """Blocks only (one-token vocabulary), no checkpointing, prefetch depth 1, one optimizer group."""
    wl = twin_workload(load_workload("llama2-7b"), layers=3)
    assert wl.model.layers == 3 and wl.model.vocab == 1
    assert not wl.training.activation_checkpointing
    st = twin_strategy()
    assert (st.prefetch_depth, st.placement.params, st.placement.optimizer_states) == (1, "cpu", "cpu")
    result = simulate_twin(load_profile("rtx4090-pcie4-ws"), load_workload("llama2-7b"), 3)
    assert result.feasible


def test_compare_rows_are_errors_relative_to_measured() -> None:
    result = simulate_twin(load_profile("tiny"), load_workload("tiny"), 2)
    m = result.metrics
    measured = {"forward_s": [2 * m.phases_s.forward], "backward_s": [m.phases_s.backward],
                "optimizer_s": [m.phases_s.optimizer], "iteration_s": [m.iteration_time_s]}
    rows = {r["what"]: r for r in compare(measured, result)}
    assert rows["forward"]["error"] == pytest.approx(-0.5)
    assert rows["backward"]["error"] == pytest.approx(0.0)
    assert rows["iteration"]["error"] == pytest.approx(0.0)


def test_validate_real_runs_the_trainer_on_cpu(tmp_path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "real.json"
    result = CliRunner().invoke(app, ["validate", "--real", "-H", "tiny", "-w", "tiny", "--device", "cpu",
                                      "--layers", "2", "--iterations", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [r["what"] for r in report["rows"]] == ["forward", "backward", "optimizer", "iteration"]
    assert all(r["measured_s"] > 0 for r in report["rows"])


def test_validate_real_without_cuda_says_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = CliRunner().invoke(app, ["validate", "--real", "-H", "tiny", "-w", "tiny", "--layers", "2"])
    assert result.exit_code == 2
    assert "no CUDA device" in result.output


def test_validate_real_json_on_stdout() -> None:
    """--json prints the report on stdout as strict JSON (the shared habit), nothing else there."""
    pytest.importorskip("torch")
    result = CliRunner().invoke(app, ["validate", "--real", "-H", "tiny", "-w", "tiny", "--device", "cpu",
                                      "--layers", "2", "--iterations", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["iteration"] in ("within", "outside")
    assert [r["what"] for r in report["rows"]] == ["forward", "backward", "optimizer", "iteration"]
