"""The optimizer step on the GPU: HBM-bound Adam over the rank's state on the compute stream,
then (ZeRO-1/2, dp > 1) the all-gather of the updated parameters. Under the layer-wise schedule
the step only waits for the layers' updates, which ran during backward."""

from __future__ import annotations

from dataclasses import dataclass

from offsim.core.enums import Activity, MechanismId, Phase
from offsim.mechanisms.base import BlockBuilder, Need, Setup, Site, SiteKind, Stage, tag
from offsim.mechanisms.compute import COMPUTE
from offsim.mechanisms.grads import grad_home
from offsim.schedule.ops import Delay, Flow, Join


@dataclass(frozen=True)
class GpuOptimizer:
    """``adam_s``: GPU Adam seconds (0: the step only waits, layer-wise); ``gather``: ZeRO-1/2's
    all-gather of updated parameters; ``n_layers``: layers whose gradients it waits for."""

    adam_s: float
    gather: Flow | None
    n_layers: int
    id: MechanismId = MechanismId.GPU_OPTIMIZER

    def footprint(self) -> tuple[Need, ...]:
        return ()  # no memory of its own

    def setup(self) -> Setup:
        return Setup()

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is not SiteKind.STEP or stage is not Stage.RUN:
            return
        t = tag(Activity.OPTIMIZER, self.id, Phase.OPTIMIZER)
        b.add(Join(), tag(Activity.OPTIMIZER, self.id, Phase.OPTIMIZER, label="gradients home"), COMPUTE,
              reads=tuple(grad_home(u) for u in range(self.n_layers)))
        if self.adam_s > 0:
            b.add(Delay(self.adam_s), tag(Activity.OPTIMIZER, self.id, Phase.OPTIMIZER, label="GPU Adam"), COMPUTE)
        if self.gather is not None:
            b.add(self.gather, tag(Activity.PARAM_GATHER, self.id, Phase.OPTIMIZER), COMPUTE)
        del t
