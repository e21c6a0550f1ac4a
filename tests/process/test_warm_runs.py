"""helpers.run_warm: a python -m/-c command forked from a warmed interpreter behaves as subprocess.run would."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from helpers import run_warm


def test_a_warm_run_gets_its_cwd_env_arguments_and_exit_code_and_skips_the_imports(tmp_path):
    code = (
        "import os, sys\n"
        "print(os.getcwd(), os.environ.get('XTF_PROBE'), sys.argv[1:], 'apache_beam' in sys.modules)\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    env = {"XTF_PROBE": "given", "PATH": "/usr/bin"}
    done = run_warm([sys.executable, "-c", code, "a", "b c"], cwd=tmp_path, env=env)
    # Beam already imported: the fork server's, not a fresh interpreter's (which would print False).
    assert done.stdout.split("\n")[0] == f"{tmp_path} given ['a', 'b c'] True"
    assert done.stderr == "to stderr\n" and done.returncode == 3


def test_a_warm_module_run_finds_modules_in_its_cwd_as_python_m_does(tmp_path):
    (tmp_path / "probe_module.py").write_text("import sys\nif __name__ == '__main__':\n    print(sys.argv)\n")
    done = run_warm([sys.executable, "-m", "probe_module", "--flag"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([str(tmp_path / "probe_module.py"), "--flag"])  # as python -m sets argv[0]


def test_a_warm_run_past_its_timeout_is_killed_and_raises(tmp_path):
    pid_file = tmp_path / "pid"
    code = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
    run_warm([sys.executable, "-c", "pass"], cwd=tmp_path)  # the fork server up (its imports take seconds) ...
    with pytest.raises(subprocess.TimeoutExpired):
        run_warm([sys.executable, "-c", code], cwd=tmp_path, timeout=2)  # ... a child starts in milliseconds
    pid = int(pid_file.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_anything_but_python_m_or_c_runs_fresh(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint('apache_beam' in sys.modules)\n")
    done = run_warm([sys.executable, str(script)], cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "False"  # a fresh interpreter: nothing imported
