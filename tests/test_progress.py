"""Long work shows progress on stderr after a delay; short work shows nothing (issue 20, item 8)."""

from __future__ import annotations

import io
import time

from rich.console import Console

from offsim.report.progress import progress_bar


def _log() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=200), buf


def test_work_past_the_delay_prints_plain_lines_to_a_log() -> None:
    console, buf = _log()
    with progress_bar(3, "simulating iterations", delay_s=0.05, every_s=0.05, console=console) as advance:
        advance()
        time.sleep(0.3)
    lines = buf.getvalue().splitlines()
    assert len(lines) >= 2
    assert lines[0].startswith("simulating iterations: 1 of 3 done, ")


def test_short_work_and_quiet_print_nothing() -> None:
    console, buf = _log()
    with progress_bar(3, "quick", delay_s=5.0, console=console) as advance:
        advance()
    with progress_bar(3, "quiet", enabled=False, delay_s=0.0, console=console) as advance:
        time.sleep(0.05)
    assert buf.getvalue() == ""
