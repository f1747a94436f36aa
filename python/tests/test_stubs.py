"""The type stubs (kvslots.pyi) match the extension module: mypy's stubtest
compares every class, method, signature and default (skipped without
mypy; CI installs it)."""

import subprocess
import sys

import pytest


def test_stubs_match_the_module(tmp_path):
    pytest.importorskip("mypy.stubtest")
    # The extension module itself (kvslots.kvslots) is re-exported whole by
    # the package, whose stubs are the ones to check.
    allowlist = tmp_path / "allowlist.txt"
    allowlist.write_text("kvslots.kvslots\n")
    run = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "kvslots", "--allowlist", str(allowlist)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
