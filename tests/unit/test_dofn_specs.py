"""Beam's look for state and timers in a DoFn, memoised per DoFn object: the same answers, each looked over once."""

from __future__ import annotations

import gc

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import userstate
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from pipelines.dofn_specs import look_once_per_dofn, once_per_object


class _Plain(beam.DoFn):
    def process(self, element):
        yield element


class _Counting(beam.DoFn):
    COUNT = ReadModifyWriteStateSpec("count", VarIntCoder())

    def process(self, element, count=beam.DoFn.StateParam(COUNT)):  # noqa: B008 (how Beam declares state)
        yield element


def test_each_object_is_looked_over_once_while_it_lives():
    looked = []

    def look(dofn):
        looked.append(type(dofn).__name__)
        return userstate.get_dofn_specs(dofn)

    remembered = once_per_object(look)
    plain, counting = _Plain(), _Counting()
    for _ in range(3):
        assert remembered(plain) == (set(), set())
        assert {spec.name for spec in remembered(counting)[0]} == {"count"}
    assert looked == ["_Plain", "_Counting"]
    del plain
    gc.collect()
    assert remembered(_Plain()) == (set(), set()) and looked[-1] == "_Plain" and len(looked) == 3
    assert remembered(3) == remembered(3) and looked[-2:] == ["int", "int"]  # no weak reference: looked at each time


def test_installed_beam_still_sees_a_stateful_dofn():
    look_once_per_dofn()
    look_once_per_dofn()  # idempotent
    counting, plain = _Counting(), _Plain()
    for _ in range(2):
        assert userstate.is_stateful_dofn(counting) and not userstate.is_stateful_dofn(plain)
    userstate.validate_stateful_dofn(counting)
