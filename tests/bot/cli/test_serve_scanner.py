"""``kestrel serve`` imports the PII scanner's every finder as it starts: a broken install
stops it there, in one line, instead of withholding the first text that reaches the finder
weeks later; and an upgrade installed under a running replica is never half taken up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.fakes.processes import clean_env

# ``kestrel`` with one module of the package made to fail its import (argv[1]), or none ("").
BROKEN_KESTREL = """
import importlib.abc, sys
broken = sys.argv[1]
class Broken(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == broken:
            raise ImportError("cannot import " + name)
sys.meta_path.insert(0, Broken())
sys.argv[0:2] = ["kestrel"]
from bot.cli.main import main
main()
"""


def serve(folder: Path, broken: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``kestrel serve`` (no platform: the pages and probes alone) with ``broken`` failing."""
    config = {"tools": [], "model": {"provider": "scripted"}, "database": "kestrel.db"}
    (folder / "kestrel.yaml").write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-c", BROKEN_KESTREL, broken, *args]
    return subprocess.run(
        argv, cwd=folder, env=clean_env(), capture_output=True, text=True, timeout=30
    )


def test_serve_with_a_finder_module_that_will_not_import_stops_at_start_in_one_line(
    tmp_path: Path,
) -> None:
    out = serve(tmp_path, "bot.pii.numbers", "serve", "--port", "0")
    assert out.returncode == 2, out.stderr
    said = [line for line in out.stderr.splitlines() if "scanner" in line]
    assert said == [
        "kestrel: pii: the scanner will not build: ImportError: cannot import bot.pii.numbers"
    ], out.stderr
    assert "Traceback" not in out.stderr


def test_a_command_that_scans_nothing_does_not_import_the_finders(tmp_path: Path) -> None:
    # The same broken module is not met by a command whose texts never reach it.
    out = serve(tmp_path, "bot.pii.numbers", "runs", "list")
    assert out.returncode == 0, out.stderr
