"""Beam's state samplers, made to sample every 10 ms in a build's process (and only where Beam is as expected)."""

from __future__ import annotations

from apache_beam.runners.worker import statesampler
from apache_beam.utils.counters import CounterFactory

from pipelines.state_sampling import SAMPLING_PERIOD_MS, sample_often


def test_a_bundles_sampler_samples_often_once_installed_and_installing_again_changes_nothing(monkeypatch):
    start = statesampler.StateSampler.__init__
    monkeypatch.setattr(start, "__defaults__", (statesampler.DEFAULT_SAMPLING_PERIOD_MS,))  # (restored after)
    assert statesampler.StateSampler("before", CounterFactory()).sampling_period_ms == 200
    sample_often()
    sample_often()
    assert statesampler.StateSampler("after", CounterFactory()).sampling_period_ms == SAMPLING_PERIOD_MS == 10
    assert statesampler.StateSampler("chosen", CounterFactory(), sampling_period_ms=50).sampling_period_ms == 50


def test_a_beam_whose_sampler_takes_its_period_otherwise_is_left_alone(monkeypatch):
    start = statesampler.StateSampler.__init__
    monkeypatch.setattr(start, "__defaults__", (123,))  # another release's default: not the one this patch knows
    sample_often()
    assert start.__defaults__ == (123,)


def test_a_local_build_installs_it(tmp_path, monkeypatch):
    """Through the command line, as a user runs it: the build's bundles were made with the short period."""
    from pipelines.build import main

    start = statesampler.StateSampler.__init__
    monkeypatch.setattr(start, "__defaults__", (statesampler.DEFAULT_SAMPLING_PERIOD_MS,))
    periods = []
    made = statesampler.StateSampler.start

    def start_and_note(sampler):
        periods.append(sampler.sampling_period_ms)
        made(sampler)

    monkeypatch.setattr(statesampler.StateSampler, "start", start_and_note)
    monkeypatch.chdir(tmp_path)  # (the demo writes its archive here)
    assert main(["--output", str(tmp_path / "demo-output"), "--quiet"]) == 0
    assert periods and set(periods) == {SAMPLING_PERIOD_MS}
