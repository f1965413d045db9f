"""The optimizer step on the GPU: HBM-bound Adam over the rank's state on the compute stream,
then (ZeRO-1/2, dp > 1) the all-gather of the updated parameters. Under the layer-wise schedule
the step only waits for the layers' updates, which ran during backward."""

from __future__ import annotations

from dataclasses import dataclass

from offsim.core.enums import Activity, MechanismId, Phase, TensorKind, Tier
from offsim.mechanisms.base import BlockBuilder, Moment, Need, Setup, Site, SiteKind, Stage, tag
from offsim.mechanisms.compute import COMPUTE
from offsim.mechanisms.grads import grad_home
from offsim.schedule.ops import Alloc, Delay, Flow, Free, Join, TensorRef


@dataclass(frozen=True)
class GpuOptimizer:
    """``adam_s``: GPU Adam seconds (0: the step only waits, layer-wise); ``gather``: ZeRO-1/2's
    all-gather of updated parameters; ``n_layers``: layers whose gradients it waits for;
    ``step_transient_bytes``: GPU bytes a sub-group's step holds besides the state (DeepSpeed
    ZeRO-3 without offload, stage3.py ``_prepare_fp32_grad_for_sub_group``: the sub-group's 16-bit
    gradients flattened, then cast to the fp32 gradient Adam reads, both alive during the cast;
    0: none)."""

    adam_s: float
    gather: Flow | None
    n_layers: int
    step_transient_bytes: int = 0
    id: MechanismId = MechanismId.GPU_OPTIMIZER

    def footprint(self) -> tuple[Need, ...]:
        """The step's per-sub-group temporaries, at the step only."""
        if self.step_transient_bytes <= 0:
            return ()
        return (Need(Tier.GPU, "step temporaries (flattened and fp32 gradients of a sub-group)",
                     self.step_transient_bytes, Moment.STEP),)

    def setup(self) -> Setup:
        return Setup()

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        if site.what is not SiteKind.STEP or stage is not Stage.RUN:
            return
        t = tag(Activity.OPTIMIZER, self.id, Phase.OPTIMIZER)
        b.add(Join(), tag(Activity.OPTIMIZER, self.id, Phase.OPTIMIZER, label="gradients home"), COMPUTE,
              reads=tuple(grad_home(u) for u in range(self.n_layers)))
        buf = TensorRef(TensorKind.BUFFER, unit=-10)  # the step's temporaries (no layer, no group)
        if self.step_transient_bytes > 0:
            b.add(Alloc(Tier.GPU, self.step_transient_bytes, buf), t, COMPUTE)
        if self.adam_s > 0:
            b.add(Delay(self.adam_s), tag(Activity.OPTIMIZER, self.id, Phase.OPTIMIZER, label="GPU Adam"), COMPUTE)
        if self.step_transient_bytes > 0:
            b.add(Free(Tier.GPU, buf), t, COMPUTE)
        if self.gather is not None:
            b.add(self.gather, tag(Activity.PARAM_GATHER, self.id, Phase.OPTIMIZER), COMPUTE)
