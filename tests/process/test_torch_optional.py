"""Without PyTorch, the torch reader's module still imports and asking for its dataset says what to install."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

_WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # as if torch were not installed: `import torch` raises ImportError
import schemas.torch_dataset as module
try:
    module.SplitDataset("no/such/output")
except ImportError as error:
    print(error)
else:
    raise SystemExit("SplitDataset was created without torch")
"""


def test_the_torch_reader_without_torch_names_what_to_install():
    result = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = result.stdout.splitlines()
    assert "needs PyTorch" in line and "pip install torch" in line
