"""A bench's report: written as ``OUT/<name>.json`` and printed on one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(out: str | Path, name: str, report: dict[str, Any]) -> Path:
    """``report`` to ``out/name.json`` (indented; the folder made if missing) and
    to stdout as one line; returns the file's path."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report), flush=True)
    return path
