"""Flows of the optimizer step's host work that is neither CPU Adam nor a transfer (issue 23
part 1): PyTorch CPU ops over a whole buffer, which ATen splits over the intra-op threads
(``at::parallel_for``), so they stream at the rank's DRAM share, shared with the transfers
running beside them; their bytes count as host copies (``dram_copy``), as
:meth:`offsim.plan.paths.Paths.cpu_step_passes` does for the unscale and the cast.
"""

from __future__ import annotations

from offsim.core.enums import Link, Res
from offsim.plan.paths import UNCAPPED_BYTES_PER_S
from offsim.schedule.ops import Flow


def host_pass(dram_bytes: int) -> Flow:
    """A multi-threaded host pass touching ``dram_bytes`` of DRAM (reads plus writes)."""
    return Flow(dram_bytes, ((Res.DRAM, 1.0),), UNCAPPED_BYTES_PER_S, (Link.DRAM_COPY,))
