"""``offsim report``: the self-contained HTML page, the command, and a headless browser check."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from offsim import make_run_config, simulate
from offsim.cli import app
from offsim.report.bottleneck import bottleneck
from offsim.report.html import render_report, write_report
from offsim.results import RunResult

runner = CliRunner()
TINY = ["-H", "tiny", "-w", "tiny"]


@pytest.fixture(scope="module")
def runs() -> list[RunResult]:
    """Two feasible strategies on the tiny machine and one configuration that does not fit."""
    return [simulate(make_run_config("tiny", "tiny", "zero-offload")),
            simulate(make_run_config("tiny", "tiny", "zero-infinity-nvme")),
            simulate(make_run_config("tiny", "llama2-70b", "gpu-only"))]


def figure_count(page: str) -> int:
    return len(re.findall(r'<div id="figure-\d+" class="plotly-graph-div"', page))


def test_a_single_run_page(runs: list[RunResult]) -> None:
    page = render_report(runs[:1])
    assert page.startswith("<!DOCTYPE html>")
    assert "<h1>offsim: tiny on tiny with zero-offload</h1>" in page
    assert bottleneck(runs[0]).sentence in page
    for section in ("Headline metrics", "Configuration", "Full configuration"):
        assert section in page
    assert figure_count(page) == 3  # timeline, memory, links
    assert "Per-layer compute and GPU stalls" in page
    assert "<h2>Comparison</h2>" not in page


def test_a_comparison_page(runs: list[RunResult]) -> None:
    page = render_report(runs, title="three runs")
    assert "<h1>three runs</h1>" in page
    assert figure_count(page) == 3 + 3 * 2  # comparison figures, then three per feasible run
    assert "does not fit: gpu memory" in page
    for label in ("zero-offload / tiny", "zero-infinity-nvme / tiny", "gpu-only / llama2-70b"):
        assert label in page


def test_the_page_is_self_contained(runs: list[RunResult], tmp_path: Path) -> None:
    page = write_report(runs[:2], tmp_path / "page.html").read_text()
    assert not re.search(r"<script[^>]+src=", page)  # no CDN, no external file
    assert "<link" not in page
    assert page.count("<script type=\"text/javascript\">/**") == 1  # plotly.js inlined once


def test_report_command_writes_the_page_and_figures(tmp_path: Path) -> None:
    out, figs = tmp_path / "page.html", tmp_path / "figs"
    result = runner.invoke(app, ["report", *TINY, "-s", "zero-offload", "-s", "zero-infinity-nvme",
                                 "--iterations", "2", "-o", str(out), "--figures", str(figs)])
    assert result.exit_code == 0, result.output
    assert "report written to" in result.output and "The GPU waited on" in result.output
    assert figure_count(out.read_text()) == 9
    assert sorted(p.name for p in figs.iterdir()) == ["zero-infinity-nvme", "zero-offload"]
    assert (figs / "zero-offload" / "timeline.html").exists()


def test_report_command_without_out_prints_and_writes_only_what_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No page without ``-o``: the sentences are printed; ``--figures`` alone writes only the figures."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["report", *TINY, "-s", "gpu-only", "--iterations", "2"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("gpu-only: ") and "-o FILE writes the HTML report" in result.stderr
    assert list(tmp_path.iterdir()) == []
    result = runner.invoke(app, ["report", *TINY, "-s", "gpu-only", "--iterations", "2", "--figures", "figs", "-q"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in tmp_path.iterdir()] == ["figs"]
    assert (tmp_path / "figs" / "gpu-only" / "timeline.html").exists()


def test_report_command_quiet_prints_nothing(tmp_path: Path) -> None:
    out = tmp_path / "p.html"
    result = runner.invoke(app, ["report", *TINY, "-s", "gpu-only", "-o", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert result.output == ""


def test_report_command_exits_1_when_nothing_fits(tmp_path: Path) -> None:
    out = tmp_path / "p.html"
    args = ["report", "-H", "tiny", "-w", "llama2-70b", "-s", "gpu-only", "-o", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "does not fit" in out.read_text()


def test_report_command_rejects_unknown_names(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", *TINY, "-s", "no-such-strategy", "-o", str(tmp_path / "p.html")])
    assert result.exit_code == 2
    assert "unknown strategy" in result.output



def test_report_with_policies_puts_the_decision_first(tmp_path: Path) -> None:
    """``--policies``: the decision sentence of ``offsim compare`` leads the output and the page."""
    import json

    out = tmp_path / "p.html"
    result = runner.invoke(app, ["report", *TINY, "-s", "zero-infinity-cpu", "--iterations", "2", "-o", str(out),
                                 "--policies", "lru,fifo"])
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith("zero-infinity-cpu: policies lru,fifo: With the GPU parameter buffer at"), first
    page = out.read_text()
    assert "<h2>Which policy</h2>" in page and page.index("Which policy") < page.index("<h2>Bottleneck</h2>")
    assert "policies lru,fifo: With the GPU parameter buffer at" in page
    doc = json.loads(runner.invoke(app, ["report", *TINY, "-s", "zero-infinity-cpu", "--iterations", "2",
                                         "-o", str(out), "--policies", "lru", "--json"]).stdout)
    assert doc["runs"][0]["policy_decision"].startswith("policies lru: With")


def test_report_with_an_unknown_policy_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", *TINY, "-s", "zero-infinity-cpu", "-o", str(tmp_path / "p.html"),
                                 "--policies", "lru,bogus"])
    assert result.exit_code == 2
    assert "unknown policy name 'bogus'" in result.output

# ------------------------------------------------------------------ headless browser

BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
needs_browser = pytest.mark.skipif(BROWSER is None, reason="no headless Chromium on PATH "
                                   "(Debian: apt-get install chromium; scripts/test.sh does it)")


def render_in_browser(page: Path, profile: Path) -> tuple[str, str]:
    """The DOM after scripts ran, and the browser's log (console messages included)."""
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000",
           "--dump-dom", page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def console_messages(log: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(r":CONSOLE[:(\]]", line) or "Uncaught" in line]


@needs_browser
def test_the_browser_check_catches_script_errors(tmp_path: Path) -> None:
    """The check below is meaningful: a page with a script error is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>notDefined();</script></body></html>")
    _, log = render_in_browser(bad, tmp_path / "profile")
    assert any("Uncaught" in m for m in console_messages(log))


@needs_browser
def test_figures_draw_in_a_headless_browser(runs: list[RunResult], tmp_path: Path) -> None:
    page = write_report(runs, tmp_path / "page.html")
    dom, log = render_in_browser(page, tmp_path / "profile")
    assert console_messages(log) == []
    expected = figure_count(page.read_text())
    assert dom.count('class="plot-container plotly"') == expected
    assert dom.count('class="main-svg"') >= expected
    assert dom.count('class="trace bars"') >= 2  # timeline and breakdown bars were drawn
    assert dom.count('class="point"') > 100
    assert "scatterlayer" in dom
