"""The disk under shards written in place, across a fork: a forked child hands its files to a thread of its own."""

from __future__ import annotations

import os
import sys

import pytest

from planning.run.disk import Writeback

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_a_thread_of_its_own(tmp_path):
    writeback = Writeback(every=1)
    (tmp_path / "f").write_bytes(b"f")
    writeback.wrote(str(tmp_path / "f"), 1)
    assert writeback.idle(timeout=30) and writeback.handed == 1
    child = os.fork()
    if child == 0:  # the parent's thread did not come along: without a thread of its own, idle() would wait
        code = 1
        try:
            writeback.wrote(str(tmp_path / "f"), 1)
            code = 0 if writeback.idle(timeout=30) and writeback.handed == 1 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
