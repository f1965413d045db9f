"""The verdict of fit with its margin, as ``offsim fit``, ``offsim validate`` and ``offsim run``
print it (issue 23: "the GPU verdict near the edge stated with its margin").

Every tier's margin is :func:`offsim.fit_check.tier_margins`: the GPU's by gpu_memory.md §4
"Verdict rule" (spare X = capacity - (allocated + fragmentation + memory outside PyTorch's pool),
with its uncertainty Y, and fits / marginal / out of memory), the other tiers' need against their
capacity. Here they are laid out: a table cell per tier, the note that says how the GPU's is
counted, the lines under an infeasible run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape

from offsim.commands._common import console

if TYPE_CHECKING:
    from offsim.config.run import RunConfig
    from offsim.fit_check import TierMargin

#: Where the GPU's margin comes from, said once under a table of margins.
GPU_MARGIN_NOTE = ("GPU to spare = capacity - (allocated + {frag:.0%} allocator fragmentation + memory outside "
                   "PyTorch's pool) ± ({half:.0%} of allocated + {outside:.2f} GiB), gpu_memory.md §4; within "
                   "± it is marginal and accepted; the other tiers: capacity - need")


def gpu_margin_note() -> str:
    """:data:`GPU_MARGIN_NOTE` with the shares and half-range :mod:`offsim.plan.footprint` uses."""
    from offsim.core.units import GiB
    from offsim.plan.footprint import FRAGMENTATION_HALF_RANGE, FRAGMENTATION_SHARE, OUTSIDE_POOL_HALF_RANGE_BYTES

    return GPU_MARGIN_NOTE.format(frag=FRAGMENTATION_SHARE, half=FRAGMENTATION_HALF_RANGE,
                                  outside=OUTSIDE_POOL_HALF_RANGE_BYTES / GiB)


def margin_cell(margin: dict[str, Any] | None) -> str:
    """A tier's margin (a :meth:`TierMargin.to_dict`) in a cell, GiB: ``7.10 ± 1.02 to spare: fits``,
    ``short 0.52 ± 1.25: marginal`` for the GPU; ``66.00 to spare`` or ``short 20.00`` for the
    others; ``-`` when the tier holds nothing."""
    if margin is None:
        return "-"
    spare = margin["spare_bytes"] / 2**30
    spread = f" ± {margin['uncertainty_bytes'] / 2**30:.2f}" if margin["tier"] == "gpu" else ""
    text = f"{spare:.2f}{spread} to spare" if spare >= 0 else f"short {-spare:.2f}{spread}"
    text = f"{text}: {margin['verdict']}" if margin["tier"] == "gpu" else text
    return text if margin["verdict"] == "fits" else f"[red]{escape(text)}[/]"


def run_margins(cfg: RunConfig) -> list[TierMargin]:
    """The margins of ``cfg`` (a run's resolved configuration: ``RunResult.config``)."""
    from offsim.fit_check import footprint, tier_margins

    return tier_margins(footprint(cfg))


def print_run_margins(cfg: RunConfig) -> None:
    """Under an infeasible run: the planner's verdict of every tier with its margin, one line each
    (where the simulation overflowed a tier the planner passed, every line may say it fits)."""
    console.print("the planner's verdict per tier, with its margin:", highlight=False)
    for m in run_margins(cfg):
        console.print(f"  {escape(m.sentence)}", highlight=False, soft_wrap=True)
