"""The GPU benchmark scripts run dry here: every step they would take is printed,
none runs (``DRY_RUN=1``), in the project's own environment (``LOCAL=1``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dry_run(script: str, tmp_path: Path, **env: str) -> list[str]:
    """What ``bash script`` prints with ``env`` on top of the dry-run settings
    (it must succeed); its work and output folders under ``tmp_path``."""
    done = subprocess.run(
        ["bash", str(ROOT / script)],
        env={
            **os.environ,
            "DRY_RUN": "1",
            "LOCAL": "1",
            "PYTHON": sys.executable,
            "MODEL": "tiny",
            "WORK": str(tmp_path / "work"),
            "OUT": str(tmp_path / "out"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()
