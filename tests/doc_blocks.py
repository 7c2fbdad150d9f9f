"""The fenced code blocks of README.md and docs/, and how each one is checked.

A block is executed by ``tests/test_doc_examples.py`` unless the line before
its fence says why it cannot be, as an HTML comment readers do not see::

    <!-- not runnable: installs system packages, then serves until stopped -->

``<!-- continues -->`` runs a block together with the one before it.
Executed blocks are ``python`` (a script) or ``bash``; ``localhost:8000`` and
``127.0.0.1:8000`` in them point at a live test gateway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
MARKER = re.compile(r"<!--\s*(not runnable:\s*(?P<reason>.*?)|(?P<continues>continues))\s*-->\s*$")
RUNNABLE = ("python", "bash")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    language: str
    code: str
    not_runnable: str | None  # the reason, when marked
    continues: bool

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _reason(marker: re.Match[str] | None) -> str | None:
    if marker is None or marker.group("continues"):
        return None
    return (marker.group("reason") or "").strip()


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.search(before)
        found.append(
            Block(
                path=path,
                line=text.count("\n", 0, m.start()) + 1,
                language=m.group(1).strip().split(" ")[0],
                code=m.group(2),
                not_runnable=_reason(marker),
                continues=bool(marker and marker.group("continues")),
            )
        )
    return found


def runnable_programs() -> list[tuple[str, str, str]]:
    """``(name, language, code)`` of every executed block, continuations joined."""
    programs: list[tuple[str, str, str]] = []
    for path in doc_files():
        for block in blocks(path):
            if block.not_runnable is not None:
                continue
            if block.continues:
                name, language, code = programs.pop()
                programs.append((name, language, code + block.code))
            else:
                programs.append((block.name, block.language, block.code))
    return programs
