"""A Python snippet run in a fresh interpreter: what it prints as JSON (imports, start-up)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]


def fresh_json(script: str, *args: str) -> Any:
    """Run ``script`` with ``args`` in a new interpreter at the repository's root; the JSON
    it printed."""
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=REPOSITORY,
    )
    return json.loads(out.stdout)
