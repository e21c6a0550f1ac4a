"""Cancelled writes: a failed build's end at the next build, a stop's only at the next command."""

from __future__ import annotations

import pytest

from planning.run import cancellation
from planning.run.cancellation import (
    Cancelled,
    allow_writes,
    cancel,
    cancel_writes,
    check_cancelled,
    check_stopped,
    reset,
    writing,
)


@pytest.fixture(autouse=True)
def fresh():
    reset()
    yield
    reset()


def test_a_failed_builds_cancelled_writes_are_allowed_again_by_the_next_build():
    assert cancel_writes(timeout=1)
    with pytest.raises(Cancelled), writing():
        pass
    check_stopped()  # planning (make_plan called directly, a notebook) is no stop's business
    allow_writes()
    with writing():
        check_cancelled()


def test_a_stop_outlasts_the_next_build_start_until_the_next_command():
    cancel()  # a signal came while the command was still importing
    allow_writes()  # the build's start must not forget it
    with pytest.raises(Cancelled):
        check_stopped()
    reset()
    check_cancelled()
    assert not cancellation._stopped.is_set()
