"""The decision sentence of ``offsim compare`` (and ``offsim report --policies``) on hand-made
tables: ties at the top and at the bottom are named, and the tie is broken by a stated rule
(fewest bytes moved, then the order given)."""

from __future__ import annotations

import pandas as pd

from offsim.compare import decision


def _table(rows: list[tuple[str, float, float]]) -> pd.DataFrame:
    """(variant, iteration s, total GB) rows at one budget; the bounds at 100 GB, exact."""
    return pd.DataFrame([{"variant": v, "iteration_time_s": t, "total_bytes": gb * 1e9, "feasible": True,
                          "cache_gib": 8.0, "dram_cache_gib": 0.0, "lower_bound_bytes": 100e9,
                          "upper_bound_bytes": 100e9, "bound_exact": True, "regret_bytes": gb * 1e9 - 100e9}
                         for v, t, gb in rows])


def test_one_fastest_and_the_slowest_tie_named() -> None:
    text = decision(_table([("lru", 2.0, 110), ("mru", 1.0, 100), ("fifo", 2.0, 110)]))
    assert "`mru` is fastest (1 s per iteration, 1 s faster than `lru` and `fifo`, which tie as slowest)" in text
    assert "`mru` moves 100 GB per iteration, at the optimum" in text


def test_a_tie_is_broken_by_fewer_bytes() -> None:
    text = decision(_table([("lru", 1.0, 120), ("fifo", 1.0, 110), ("mru", 3.0, 100)]))
    assert "`lru` and `fifo` tie as fastest" in text
    assert "`fifo` is named below: it moves the fewest bytes of them" in text
    assert "faster than `mru`" in text and "`fifo` moves 110 GB" in text


def test_a_tie_in_time_and_bytes_names_the_first_listed() -> None:
    text = decision(_table([("lfu", 1.0, 120), ("fifo", 1.0, 110), ("lru", 1.0, 110)]))
    assert "`lfu`, `fifo` and `lru` tie as fastest" in text
    assert "`fifo` is named below: of those moving the fewest bytes (`fifo` and `lru`) it is listed first" in text


def test_all_tied() -> None:
    text = decision(_table([("lru", 1.0, 110), ("fifo", 1.0 + 1e-12, 110)]))
    assert "`lru` and `fifo` tie as fastest (1 s per iteration; `lru` is named below: they move the same bytes " \
           "and it is listed first)" in text
    assert "faster than" not in text
