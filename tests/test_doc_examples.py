"""Every code block of README.md and docs/ runs as written, or says why it cannot.

Python blocks run as scripts and bash blocks under ``bash -euo pipefail``,
each in a fresh process in an empty directory, against a live gateway (the
fake engine) wherever they name ``localhost:8000``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from doc_blocks import ROOT, RUNNABLE, blocks, doc_files, runnable_programs
from live_server import live_server

from gateway.app import create_app
from gateway.settings import GatewaySettings
from realtime_engine.engines.fake import FakeEngine

PROGRAMS = runnable_programs()


def test_every_block_is_executed_or_says_why_not() -> None:
    problems = []
    for path in doc_files():
        for block in blocks(path):
            if block.not_runnable == "":
                problems.append(f"{block.name}: 'not runnable' without a reason")
            elif block.not_runnable is None and block.language not in RUNNABLE:
                problems.append(f"{block.name}: a {block.language or 'plain'} block is never run")
    assert problems == []
    assert len(runnable_programs()) >= 6


def test_markers_are_read() -> None:
    readme = blocks(ROOT / "README.md")
    assert readme[0].not_runnable and readme[0].language == "bash"


async def run_program(language: str, code: str, url: str, cwd: Path) -> tuple[int, str]:
    host = url.removeprefix("http://")
    code = code.replace("localhost:8000", host).replace("127.0.0.1:8000", host)
    argv = [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    stdin = code.encode() if language == "bash" else b""
    out, _ = await asyncio.wait_for(proc.communicate(stdin), 300)
    return proc.returncode or 0, out.decode(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "language", "code"), PROGRAMS, ids=[name for name, _, _ in PROGRAMS]
)
async def test_the_block_runs_as_written(
    name: str, language: str, code: str, tmp_path: Path, tiny_checkpoint: Path
) -> None:
    app = create_app(GatewaySettings(), FakeEngine())
    async with live_server(app, lifespan="on") as url:
        code_, output = await run_program(language, code, url, tmp_path)
    assert code_ == 0, f"{name} failed:\n{output}"
