"""``offsim compare`` and ``offsim rok`` through the CLI (typer's CliRunner), on `tiny`."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from offsim.cli import app
from offsim.compare import apply_policies, rok_points
from offsim.config.loading import load_strategy
from offsim.errors import ConfigError

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_help() -> None:
    for cmd in ("compare", "rok"):
        result = _invoke(cmd, "--help")
        assert result.exit_code == 0
        assert "--hardware" in result.output


def test_compare_writes_table_csv_and_chart(tmp_path) -> None:
    csv, html = tmp_path / "c.csv", tmp_path / "c.html"
    result = _invoke("compare", "-H", "tiny", "-w", "tiny", "-s", "zero-infinity-nvme",
                     "--policies", "lru,belady,belady-size,opt,keep-last-2,lru+alternating", "--dram-cache-gib",
                     "0.4", "--csv", str(csv), "--html", str(html))
    assert result.exit_code == 0, result.output
    assert "keep-last-2" in result.output and "regret" in result.output
    assert result.output.startswith("With the GPU parameter buffer at")  # the decision comes first
    table = pd.read_csv(csv)
    assert list(table["variant"]) == ["lru", "belady", "belady-size", "opt", "keep-last-2", "lru+alternating"]
    assert table["feasible"].all()
    for col in ("iteration_time_s", "stall_s", "h2d_bytes", "nvme_read_bytes", "hit_rate_gpu_params",
                "hit_rate_dram_optimizer", "peak_gpu_bytes", "peak_host_bytes", "total_bytes",
                "lower_bound_bytes", "upper_bound_bytes", "regret_bytes", "bound_exact", "cache_gib",
                "dram_cache_gib", "lower_bound_gpu_params_bytes", "regret_dram_optimizer_bytes",
                "bound_method_gpu_params", "iteration_time_lower_bound_s", "iteration_time_bound_binding",
                "iteration_time_above_bound_s"):
        assert col in table
    assert (table["iteration_time_above_bound_s"] >= 0).all()
    assert "no policy can take less than" in result.output.splitlines()[0]
    assert (table["regret_bytes"] >= 0).all()
    assert (table["total_bytes"] >= table["lower_bound_bytes"]).all()
    assert (table["regret_bytes"] == table["total_bytes"] - table["lower_bound_bytes"]).all()
    text = html.read_text()
    assert "plotly" in text.lower() and "lower bound (any policy)" in text
    assert "time lower bound (any eviction policy)" in text


def test_curves_over_cache_size(tmp_path) -> None:
    """A row per policy and size; LRU and the bound never move more with a larger buffer; the
    chart has one line per policy plus the bounds."""
    csv, html = tmp_path / "k.csv", tmp_path / "k.html"
    result = _invoke("compare", "-H", "tiny", "-w", "tiny", "-s", "zero-infinity-cpu", "--policies",
                     "lru,fifo,mru,belady", "--cache-gib", "0.05,0.1,0.2,0.4", "--csv", str(csv), "--html", str(html))
    assert result.exit_code == 0, result.output
    table = pd.read_csv(csv)
    assert len(table) == 16 and sorted(table["cache_gib"].unique()) == pytest.approx([0.05, 0.1, 0.2, 0.4])
    ok = table[table["feasible"]]
    assert (ok["regret_bytes"] >= 0).all()
    lru = ok[ok["variant"] == "lru"].sort_values("cache_gib")
    assert lru["total_bytes"].is_monotonic_decreasing
    bound = ok.groupby("cache_gib")["lower_bound_bytes"].first().sort_index()
    assert bound.is_monotonic_decreasing
    text = html.read_text()
    assert "GPU parameter buffer (GiB)" in text and '"name":"fifo"' in text and "lower bound (any policy)" in text
    assert "time lower bound (any eviction policy)" in text
    assert "With the GPU parameter buffer at 0.05 GiB" in result.output


def test_compare_strategies_as_they_are(tmp_path) -> None:
    result = _invoke("compare", "-H", "tiny", "-w", "tiny", "--strategies", "zero-offload,zero-infinity-cpu",
                     "--csv", str(tmp_path / "s.csv"), "--html", str(tmp_path / "s.html"))
    assert result.exit_code == 0, result.output
    assert list(pd.read_csv(tmp_path / "s.csv")["variant"]) == ["zero-offload", "zero-infinity-cpu"]


def test_a_variant_with_an_illegal_decision_gets_a_row(tmp_path) -> None:
    """Keeping the first 5 of tiny's 6 layers in a 0.1 GiB budget cannot work: that variant's
    row carries the policy error (policy name and op); the other variant still runs."""
    csv = tmp_path / "e.csv"
    result = _invoke("compare", "-H", "tiny", "-w", "tiny", "-s", "zero-infinity-cpu", "--policies",
                     "lru,keep-first-5", "--param-buffer-gib", "0.1", "--csv", str(csv), "--html",
                     str(tmp_path / "e.html"))
    assert result.exit_code == 0, result.output
    table = pd.read_csv(csv).set_index("variant")
    assert table.loc["lru", "feasible"] and not table.loc["keep-first-5", "feasible"]
    reason = table.loc["keep-first-5", "infeasible_reason"]
    for part in ("static(first=5)", "at op 4 (forward block3", "evicts too little"):
        assert part in reason


def test_unknown_policy_name_lists_the_valid_ones(tmp_path) -> None:
    result = _invoke("compare", "-H", "tiny", "-w", "tiny", "--policies", "lru,bogus",
                     "--csv", str(tmp_path / "x.csv"), "--html", str(tmp_path / "x.html"))
    assert result.exit_code == 2
    assert "unknown policy name 'bogus'" in result.output
    assert "belady" in result.output and "keep-last-K" in result.output


def test_unknown_kind_in_a_strategy_file(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema_version: 1\nname: bad\nprovenance: {kind: synthetic, source: test, date: '2026'}\n"
                   "policies: {eviction: {kind: lruu}}\n")
    result = _invoke("compare", "-H", "tiny", "-w", "tiny", "-s", str(bad), "--policies", "lru",
                     "--csv", str(tmp_path / "x.csv"), "--html", str(tmp_path / "x.html"))
    assert result.exit_code == 2
    assert "policies.eviction" in result.output and "'belady'" in result.output


def test_rok_curve(tmp_path) -> None:
    csv, html = tmp_path / "r.csv", tmp_path / "r.html"
    result = _invoke("rok", "-H", "tiny", "-w", "tiny", "--points", "3",
                     "--csv", str(csv), "--html", str(html))
    assert result.exit_code == 0, result.output
    curve = pd.read_csv(csv)
    assert list(curve["placement"].unique()) == ["recompute", "offload-cpu", "offload-nvme"]
    assert list(curve["blocks"][:3]) == [0, 2, 4]  # tiny has 4 blocks
    assert (curve[curve["blocks"] == 0]["memory_saved_bytes"] == 0).all()
    recompute = curve[curve["placement"] == "recompute"]
    assert recompute["memory_saved_bytes"].is_monotonic_increasing
    # recomputing costs time only where the GPU binds: on tiny's zero-infinity-cpu the iteration is
    # bound by DeepSpeed's gradient round trips over tiny's 1 GB/s PCIe (deepspeed_runtime.md section 3),
    # so the forward done again hides under them (cost 0), while offloading the same blocks to NVMe adds
    # their SSD traffic to the bound path
    assert (recompute["time_cost_s"] >= 0).all()
    nvme = curve[curve["placement"] == "offload-nvme"]
    assert nvme["time_cost_s"].iloc[-1] > recompute["time_cost_s"].iloc[-1]
    assert html.exists() and html.stat().st_size > 100_000  # plotly.js is embedded


def test_policy_names() -> None:
    base = load_strategy("zero-infinity-cpu")
    st = apply_policies(base, "keep-last-3+lookahead-2+alternating+recompute", gpu_param_buffer_gib="auto")
    p = st.policies
    assert (p.eviction.kind, p.eviction.keep_last, p.prefetch.depth) == ("static", 3, 2)
    assert (p.optimizer_order.kind, p.activations.kind) == ("alternating", "recompute")
    assert p.gpu_param_buffer_gib == "auto"
    with pytest.raises(ConfigError, match="unknown policy name"):
        apply_policies(base, "lru+nope")
    assert rok_points(4, 3) == [0, 2, 4]
    assert rok_points(32, 5) == [0, 8, 16, 24, 32]


# ----------------------------------------------------------------------------- the shared CLI habits
def _strict(text: str) -> object:
    """Parse ``text`` as strict JSON (NaN or Infinity fail)."""
    import json

    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("command", [["compare", "--policies", "lru,fifo"], ["rok", "--points", "2"]])
def test_no_files_unless_asked(command: list[str], tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = _invoke(*command, "-H", "tiny", "-w", "tiny")
    assert result.exit_code == 0, result.output
    assert list(tmp_path.iterdir()) == []
    assert "written" not in result.output


def test_compare_json_is_strict_and_alone_on_stdout(tmp_path) -> None:
    out = tmp_path / "c.csv"
    result = _invoke("compare", "-H", "tiny", "-w", "tiny", "--policies", "lru,keep-first-5",
                     "--param-buffer-gib", "0.1", "--json", "-o", str(out))
    assert result.exit_code == 0, result.output
    doc = _strict(result.stdout)
    assert isinstance(doc, dict)
    assert doc["decision"].startswith("With the GPU parameter buffer at")
    assert [r["variant"] for r in doc["rows"]] == ["lru", "keep-first-5"]
    assert doc["rows"][1]["feasible"] is False and doc["rows"][1]["iteration_time_s"] is None  # NaN -> null
    assert doc["files"] == {"csv": str(out)} and out.exists()


def test_compare_quiet_prints_the_decision_only() -> None:
    result = _invoke("compare", "-H", "tiny", "-w", "tiny", "--policies", "lru,fifo", "-q")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("With the GPU parameter buffer at")


def test_rok_json(tmp_path) -> None:
    result = _invoke("rok", "-H", "tiny", "-w", "tiny", "--points", "2", "--json")
    assert result.exit_code == 0, result.output
    doc = _strict(result.stdout)
    assert isinstance(doc, dict) and doc["files"] == {}
    assert {r["placement"] for r in doc["rows"]} == {"recompute", "offload-cpu", "offload-nvme"}


@pytest.mark.parametrize(("args", "fragment"), [
    (["compare", "-o", "{tmp}"], "is a folder"),
    (["compare", "--html", "{tmp}"], "is a folder"),
    (["rok", "-o", "{tmp}/file.csv/x.csv"], "is a file, not a folder"),
    (["compare", "--cache-gib", "2,x"], "--cache-gib: expected comma-separated GiB"),
    (["compare", "--param-buffer-gib", "lots"], "--param-buffer-gib: expected a number"),
    (["rok", "--points", "0"], "--points"),
    (["rok", "-s", "no-such-strategy"], "no-such-strategy"),
])
def test_bad_options_exit_2(args: list[str], fragment: str, tmp_path) -> None:
    (tmp_path / "file.csv").write_text("")
    result = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args] + ["-H", "tiny", "-w", "tiny"],
                           terminal_width=200)
    assert result.exit_code == 2, result.output
    assert fragment in " ".join(result.output.split())
    assert "Traceback" not in result.output
