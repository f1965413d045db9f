"""``mechanisms.base.tag`` hands out one object per distinct set of fields (issue 16): the same
tag as building it, shared; the memo is emptied when full, never grows past its cap."""

from __future__ import annotations

import pytest

from offsim.core.enums import Activity, MechanismId, Phase
from offsim.mechanisms import base
from offsim.mechanisms.base import BlockBuilder, tag
from offsim.schedule.ops import Delay, Tag, TensorKind, TensorRef


def test_equal_fields_give_one_shared_tag_equal_to_a_built_one() -> None:
    a = tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD, 3, label="x")
    b = tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD, 3, label="x")
    assert a is b
    assert a == Tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD, 3, -1, "x")
    other = tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD, 4, label="x")
    assert other is not a and other.layer == 4 and a.layer == 3


def test_the_memo_is_emptied_at_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "_TAGS", {})
    monkeypatch.setattr(base, "TAGS_KEPT", 3)
    made = [tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD, layer) for layer in range(3)]
    assert len(base._TAGS) == 3
    fourth = tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD, 3)  # full: emptied, then kept
    assert list(base._TAGS.values()) == [fourth]
    again = tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD, 0)
    assert again == made[0] and again is not made[0]  # a new object, equal


def test_add_keeps_what_it_is_given_as_tuples() -> None:
    b = BlockBuilder("b")
    t = tag(Activity.FORWARD, MechanismId.COMPUTE, Phase.FORWARD)
    ref = TensorRef(TensorKind.PARAM16, 0)
    first = b.add(Delay(1.0), t, reads=[ref], writes=(ref,))
    second = b.add(Delay(1.0), t, after=[first, first], reads=(ref,), writes=[ref])
    ops = b.build().ops
    assert ops[0].reads == ops[0].writes == (ref,) and type(ops[0].reads) is tuple
    assert ops[1].after == (0,) and ops[1].reads == ops[1].writes == (ref,) and type(ops[1].writes) is tuple
    assert second == 1
