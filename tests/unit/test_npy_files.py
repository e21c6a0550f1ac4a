"""The run's .npy/.npz files are parsed one at a time, whatever the threads (CPython 3.11's ast is not thread-safe)."""

from __future__ import annotations

import ast
import io
import pathlib
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from schemas.npy_files import mapped_npy, npz_arrays

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_threads_never_parse_two_headers_at_once(tmp_path, monkeypatch):
    buffer = io.BytesIO()
    np.savez(buffer, a=np.arange(5), b=np.ones((2, 3)))
    data = buffer.getvalue()
    np.save(tmp_path / "ends.npy", np.arange(7, dtype=np.int64))
    inside, most = [0], [0]
    count = threading.Lock()
    literal_eval = ast.literal_eval

    def parsing(text):  # numpy parses every header with ast.literal_eval: count the threads in it at once
        with count:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)
        try:
            return literal_eval(text)
        finally:
            with count:
                inside[0] -= 1

    monkeypatch.setattr(ast, "literal_eval", parsing)

    def load(i: int) -> int:
        if i % 2:
            with npz_arrays(data) as arrays:
                return int(arrays["a"].sum() + arrays["b"].sum())
        return int(mapped_npy(str(tmp_path / "ends.npy")).sum())

    with ThreadPoolExecutor(8) as pool:
        totals = list(pool.map(load, range(64)))
    assert totals == [21, 16] * 32
    assert most[0] == 1


def test_the_packages_load_npy_files_only_through_the_lock():
    loads = re.compile(r"\bnp\.load\(|numpy\.load\(|open_memmap\(")
    found = [
        str(path.relative_to(ROOT))
        for package in ("pipelines", "transforms", "planning", "schemas")
        for path in (ROOT / package).rglob("*.py")
        # (parser.py's template is one standalone file: it holds a lock of its own)
        if loads.search(path.read_text()) and path.name not in ("npy_files.py", "parser_template.py")
    ]
    assert found == []
