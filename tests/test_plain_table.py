"""``offsim run``'s table written without rich (``offsim/commands/_plain_table.py``, issue 16) is
character for character what rich writes, or is not written at all (rich writes it then)."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from offsim import make_run_config, simulate
from offsim.commands._common import metrics_rows, metrics_table, print_metrics_table
from offsim.commands._plain_table import console_width, two_column_table, writes_plain
from offsim.config.loading import shipped_files


def _rich_text(title: str, rows: list[tuple[str, str]], width: int) -> str:
    """What rich prints for the table on a plain (not a terminal) console ``width`` wide."""
    out = io.StringIO()
    Console(file=out, width=width).print(metrics_table(title, rows))
    return out.getvalue()


def _table_width(rows: list[tuple[str, str]]) -> int:
    """Hand count: each column's widest text plus a space either side, and three edges."""
    return max(len(a) for a, _ in rows) + max(len(b) for _, b in rows) + 4 + 3


@pytest.fixture(scope="module")
def shipped_tables() -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, rows) of every shipped strategy on the tiny machine and model, and of the README's
    main example."""
    points = [("tiny", "tiny", name) for name in shipped_files("strategy")]
    points.append(("rtx4090-pcie4-ws", "llama2-7b", "zero-offload"))
    tables = []
    for hardware, workload, strategy in points:
        result = simulate(make_run_config(hardware, workload, strategy, iterations=2, warmup_iterations=1))
        if result.feasible:
            cfg = result.config
            tables.append((f"{cfg.workload.name} on {cfg.hardware.name} with {cfg.strategy.name}",
                           metrics_rows(result)))
    return tables


def test_every_shipped_strategy_prints_as_rich_prints_it(shipped_tables: list) -> None:
    """At the table's own width, one less, one more, 80 and 200 columns: the same text, or None
    (rich's own then) where the table does not fit."""
    assert len(shipped_tables) >= 20
    for title, rows in shipped_tables:
        own = _table_width(rows)
        for width in (own - 1, own, own + 1, 80, 200):
            plain = two_column_table(title, rows, width)
            if width < own:
                assert plain is None
            elif len(title) <= own:
                assert plain == _rich_text(title, rows, width), (title, width)


def test_the_main_example_is_written_without_rich() -> None:
    """Two of the README example's rows fit 80 columns and need no fallback."""
    rows = [("iteration time", "5.892 s"), ("hardware TFLOP/s per GPU (recompute incl.)", "42.5")]
    title = "llama2-7b on rtx4090-pcie4-ws with zero-offload"
    assert _table_width(rows) == (42 + 2) + (7 + 2) + 3  # the 42-character label, the 7-character value
    assert two_column_table(title, rows, 80) == _rich_text(title, rows, 80)
    assert two_column_table(title, rows, 80).splitlines()[0] == " " * 4 + title + " " * 5  # (56 - 47) // 2


@pytest.mark.parametrize("cell", ["[bold]x[/]", "a:smile:b", "back\\", "é", " lead", "trail ", "tab\there", ""])
def test_text_that_rich_would_change_falls_back(cell: str) -> None:
    """Markup, emoji codes, backslashes, non-ASCII and surrounding spaces are left to rich; an
    empty cell is plain."""
    rows = [("label", cell), ("other", "1")]
    plain = two_column_table("title", rows, 80)
    if cell == "":
        assert plain == _rich_text("title", rows, 80)
    else:
        assert plain is None
    assert two_column_table(f"title {cell}".strip() if cell else "", [("a", "b")], 80) is None


def test_a_title_wider_than_the_table_falls_back() -> None:
    rows = [("a", "b")]  # 9 wide
    assert two_column_table("123456789", rows, 80) == _rich_text("123456789", rows, 80)
    assert two_column_table("1234567890", rows, 80) is None


def test_plain_only_off_a_terminal_and_without_forced_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    # the suite's notebook tests import IPython, where writes_plain defers to rich (False): not here
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    monkeypatch.delitem(sys.modules, "idlelib", raising=False)

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert writes_plain(io.StringIO(), {})
    assert not writes_plain(Tty(), {})
    assert not writes_plain(io.StringIO(), {"FORCE_COLOR": "1"})
    assert not writes_plain(io.StringIO(), {"TTY_COMPATIBLE": "1"})
    ascii_file = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    assert not writes_plain(ascii_file, {})  # rich draws ASCII boxes there


def test_console_width_follows_columns_as_rich_does() -> None:
    assert console_width({"COLUMNS": "132"}) == 132 == Console(file=io.StringIO(), _environ={"COLUMNS": "132"}).width
    assert console_width({"COLUMNS": "wide"}) == Console(file=io.StringIO(), _environ={"COLUMNS": "wide"}).width


def test_print_metrics_table_writes_what_rich_writes(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the command's own function, on a captured stdout: 80 columns (written without
    rich) and 40 (too narrow: rich wraps the cells), each equal to rich's text."""
    result = simulate(make_run_config("rtx4090-pcie4-ws", "llama2-7b", "zero-offload"))
    cfg = result.config
    title = f"{cfg.workload.name} on {cfg.hardware.name} with {cfg.strategy.name}"
    for width in (80, 40):
        monkeypatch.setenv("COLUMNS", str(width))
        print_metrics_table(result)
        assert capsys.readouterr().out == _rich_text(title, metrics_rows(result), width)
