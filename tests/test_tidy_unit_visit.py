"""The unit-major visit's mechanisms (:mod:`offsim.mechanisms.unit_visit`), shared by Harmony and
GreedySnake: checked by hand on a recording stub, and both systems compose the same classes."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from offsim import load_workload, make_run_config
from offsim.core.enums import MechanismId, Tier
from offsim.mechanisms.base import BlockBuilder, Need, Setup, Site, SiteKind, Stage
from offsim.mechanisms.unit_visit import AccumulateOnGpu, BlockLocalThrottle, FetchOncePerVisit, visit_mechanisms
from offsim.systems._registry import compose


@dataclass(frozen=True)
class _Stub:
    """Records the (site kind, first_mb, last_mb, stage) it is asked to emit at."""

    id: MechanismId = MechanismId.COMPUTE
    seen: list[tuple[SiteKind, bool, bool, Stage]] = field(default_factory=list)
    needs: tuple[Need, ...] = ()

    def setup(self) -> Setup:
        return Setup()

    def footprint(self) -> tuple[Need, ...]:
        return self.needs

    def emit(self, b: BlockBuilder, site: Site, stage: Stage) -> None:
        self.seen.append((site.what, site.first_mb, site.last_mb, stage))


def test_fetch_once_per_visit_issues_on_the_first_micro_batch_and_ends_on_the_last() -> None:
    """Three micro-batches of one layer's forward: ISSUE only for mb 0, DONE only for mb 2, the
    other stages every time; outside forward/backward every stage passes through."""
    inner = _Stub()
    fetch = FetchOncePerVisit(inner)
    b = BlockBuilder("t")
    for first, last in ((True, False), (False, False), (False, True)):
        for stage in (Stage.ISSUE, Stage.WAIT, Stage.DONE):
            fetch.emit(b, Site(SiteKind.FORWARD, layer=0, first_mb=first, last_mb=last), stage)
    fetch.emit(b, Site(SiteKind.STEP, first_mb=False, last_mb=False), Stage.ISSUE)
    assert [(f, ll, s) for _, f, ll, s in inner.seen] == [
        (True, False, Stage.ISSUE), (True, False, Stage.WAIT),
        (False, False, Stage.WAIT),
        (False, True, Stage.WAIT), (False, True, Stage.DONE),
        (False, False, Stage.ISSUE)]


def test_block_local_throttle_scales_only_per_micro_batch_needs() -> None:
    """M = 4: the kept activations (100 B) and offloaded ones (10 B) x 4; the working set (7 B)
    is one micro-batch's at a time, unchanged."""
    inner = _Stub(needs=(Need(Tier.GPU, "activations kept for backward", 100),
                         Need(Tier.HOST_PINNED, "offloaded activations", 10),
                         Need(Tier.GPU, "activation working set", 7)))
    got = {n.what: n.nbytes for n in BlockLocalThrottle(inner, 4).footprint()}
    assert got == {"activations kept for backward": 400, "offloaded activations": 40, "activation working set": 7}


def test_visit_mechanisms_wraps_by_name_and_keeps_order() -> None:
    """Gradients are wrapped only with an accumulator size and more than one micro-batch; the
    names keep their order (the order the system's setup walks them)."""
    mechs = {"static": _Stub(), "params": _Stub(), "activations": _Stub(), "grads": _Stub()}
    one = visit_mechanisms(mechs, 1, (8, 8))
    assert list(one) == list(mechs)
    assert isinstance(one["params"], FetchOncePerVisit) and isinstance(one["activations"], BlockLocalThrottle)
    assert one["grads"] is mechs["grads"] and one["static"] is mechs["static"]
    assert visit_mechanisms(mechs, 2)["grads"] is mechs["grads"]
    two = visit_mechanisms(mechs, 2, (8, 16))
    assert isinstance(two["grads"], AccumulateOnGpu)
    assert two["grads"].footprint()[-1] == Need(Tier.GPU, "unit gradient accumulation", 16)


def test_harmony_and_greedysnake_compose_the_shared_mechanisms() -> None:
    """Both systems, at M = 2 on tiny, use the visit's three mechanisms, and GreedySnake no longer
    reaches into Harmony's module for them."""
    wl = load_workload("tiny")
    wl = wl.model_copy(update={"training": wl.training.model_copy(update={"grad_accumulation": 2})})
    for strategy in ("harmony", "greedysnake"):
        sysm = compose(make_run_config("tiny", wl, strategy, iterations=2))
        kinds = {type(m) for m in sysm.mechanisms.values()}
        assert {FetchOncePerVisit, BlockLocalThrottle, AccumulateOnGpu} <= kinds, strategy
    src = Path(__file__).resolve().parent.parent / "offsim" / "systems" / "greedysnake.py"
    imported = {n.module for n in ast.walk(ast.parse(src.read_text())) if isinstance(n, ast.ImportFrom)}
    assert "offsim.systems.harmony" not in imported
