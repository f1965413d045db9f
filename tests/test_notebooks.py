"""The notebooks in notebooks/ run top to bottom on shipped profiles, and are stored without outputs.

(The same check as ``pytest --nbmake notebooks/``; here so that a plain ``pytest`` covers them.)
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_the_notebooks_ship() -> None:
    assert {p.name for p in NOTEBOOKS} >= {"quickstart.ipynb", "memory-wall.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_clean(path: Path) -> None:
    """No outputs or execution counts in the repository (small diffs, no stale numbers)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    run_in = {"metadata": {"path": str(tmp_path)}}  # files a notebook writes land in tmp_path
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources=run_in)
    client.execute()  # raises CellExecutionError, with the cell and traceback, on the first failing cell
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
