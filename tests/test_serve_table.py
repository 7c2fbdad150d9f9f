"""Every CPU row of the README's serve table starts and speaks, on a machine without vLLM.

Each row runs as ``speech-gateway serve ARGS`` (what ``scripts/serve.sh``
execs after installing) in its own process, with ``vllm`` and ``zmq`` made
unimportable: ``--talker auto`` must then start the reference talker. The
checkpoint rows use the tiny checkpoint, as a directory and from a Hugging
Face cache. Each server must answer ``/ready`` and speak a short utterance.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from gateway.client import speak_async

README = Path(__file__).resolve().parent.parent / "README.md"
HF_ID = "bosonai/higgs-audio-v3"
# What a machine without vLLM looks like: neither vLLM nor pyzmq can be imported.
WITHOUT_VLLM = (
    "import sys; sys.modules.update(vllm=None, zmq=None); "
    "from gateway.cli import main; sys.exit(main())"
)


def serve_rows() -> list[list[str]]:
    """Arguments of the table's ``bash scripts/serve.sh ...`` rows that need no GPU."""
    rows = re.findall(
        r"^\| `((?:\w+=\S+ )?bash scripts/serve\.sh[^`]*)` \|", README.read_text(), re.M
    )
    assert len(rows) >= 4, rows
    cpu = [shlex.split(row) for row in rows if not row.startswith("EXTRAS=")]
    return [argv[2:] for argv in cpu]


def test_the_table_is_read() -> None:
    rows = serve_rows()
    assert [] in rows and ["--model", "tiny"] in rows and ["--model", HF_ID] in rows


def hf_cache_with(checkpoint: Path, root: Path) -> Path:
    """A Hugging Face hub cache holding ``checkpoint`` as ``HF_ID``."""
    repo = root / ("models--" + HF_ID.replace("/", "--"))
    revision = "0" * 40
    shutil.copytree(checkpoint, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return root


@asynccontextmanager
async def serving(args: list[str], env: dict[str, str]) -> AsyncIterator[str]:
    argv = [sys.executable, "-c", WITHOUT_VLLM, "serve", *args, "--port", "0"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        url = None
        while url is None:
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 300)
            assert line, f"serve {args} stopped:\n{''.join(lines)}"
            lines.append(line)
            if match := re.search(r"open (http://\S+)/ ", line):
                url = match.group(1)
        yield url
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
        proc.stdout.close()


@pytest.mark.slow
@pytest.mark.parametrize("row", serve_rows(), ids=lambda row: " ".join(row) or "(default)")
async def test_every_cpu_row_of_the_serve_table_speaks(
    row: list[str], tiny_checkpoint: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("SPEECH_GATEWAY_API_KEYS", None)
    env["HF_HUB_CACHE"] = str(hf_cache_with(tiny_checkpoint, tmp_path / "hub"))
    args = [str(tiny_checkpoint) if a == "/path/to/higgs-audio-v3" else a for a in row]
    async with serving(args, env) as url:
        async with httpx.AsyncClient() as http:
            ready = await http.get(url + "/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        # random tiny weights never end an utterance: cap it at one second
        cap = {"max_audio_seconds": 1.0}
        wav = await speak_async("Hello there.", url=url, session=cap, timeout=120)
    assert wav[:4] == b"RIFF" and len(wav) > 44 + 2 * 2400  # more than 0.1 s of audio
