"""The sweep heatmap marks cells without a simulated feasible point instead of leaving them out."""

from __future__ import annotations

import pandas as pd

from offsim.sweep.figures import heatmap


def test_heatmap_marks_infeasible_and_too_slow_cells() -> None:
    df = pd.DataFrame({
        "dram_gib": [128, 128, 256, 256, 256],
        "nvme_drives": [1, 2, 1, 2, 2],
        "status": ["infeasible", "ok", "too_slow", "ok", "infeasible"],
        "iteration_time_s": [None, 10.0, None, 5.0, None],
    })
    fig = heatmap(df, "dram_gib", "nvme_drives")
    values, marks = fig.data
    assert list(values.x) == ["128", "256"] and list(values.y) == ["1", "2"]
    assert list(values.text[1]) == ["10", "5"]  # y=2: both simulated; the infeasible one at 256 does not hide 5 s
    assert list(marks.text[0]) == ["no fit", "too slow"]  # y=1: nothing simulated, and why
    assert list(marks.text[1]) == ["", ""]
    assert list(marks.z[0]) == [1.0, 1.0] and list(marks.z[1]) == [None, None]
