"""The README stays true: its walkthrough runs as written, its config reference matches the code."""

from __future__ import annotations

import re
import subprocess
import sys

from pipelines.config_reference import END, START, config_reference

from conftest import REPO

README = (REPO / "README.md").read_text()


def _block(marker: str) -> str:
    match = re.search(rf"<!-- {marker} -->\n```\w*\n(.*?)```", README, re.S)
    assert match, f"README has no block marked {marker}"
    return match.group(1)


def test_config_reference_is_generated_from_the_config_model():
    embedded = README.split(START, 1)[1].split(END, 1)[0]
    assert embedded.strip() == config_reference().strip(), "run: python -m pipelines.config_reference --write README.md"


def test_walkthrough_runs_as_written(tmp_path, sample_file):
    source = sample_file("eraint_uvz.nc")  # the real file when shared data has it, else the stand-in
    output = str(tmp_path / "erainterim")
    for line in _block("walkthrough:shell").strip().splitlines():
        command = line.replace("out/erainterim", output).split()
        assert command[:2] == ["python", "-m"]
        if command[2] == "pipelines.build":  # instead of the config's ../shared/data
            command += ["--input", str(source)]
        result = subprocess.run([sys.executable, *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{line}\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "erainterim.png").stat().st_size > 50_000
    script = tmp_path / "walkthrough.py"
    script.write_text(_block("walkthrough:python").replace("out/erainterim", output) + "\nprint('trained')\n")
    result = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("trained"), result.stderr[-3000:]
