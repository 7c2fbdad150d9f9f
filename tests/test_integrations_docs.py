"""The agents in docs/integrations.md run as written, and what they say is intelligible.

Each ``python`` block that starts with ``# <name>.py`` is written to a file
and run in its own process against a CPU-voice gateway on loopback; the WAV
it leaves is checked by the bundled Whisper.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from agent_support import MAX_WER, cpu_voice_app
from asr import transcribe, wer
from live_server import live_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "integrations.md"
REPLY = re.compile(r'reply = "([^"]+)"')


def agent_scripts() -> dict[str, str]:
    blocks = re.findall(r"```python\n(# (\w+\.py)\n.*?)```", DOC.read_text(), flags=re.DOTALL)
    return {name: code for code, name in blocks}


SCRIPTS = agent_scripts()


def test_the_page_has_an_agent_for_each_framework() -> None:
    assert set(SCRIPTS) == {"pipecat_agent.py", "livekit_agent.py"}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
async def test_agent_script_runs_and_speaks_its_reply(name: str, tmp_path: Path) -> None:
    code = SCRIPTS[name]
    (tmp_path / name).write_text(code)
    match = REPLY.search(code)
    assert match is not None, "the script names its reply"
    async with live_server(cpu_voice_app(), lifespan="on") as url:
        env = {**os.environ, "SPEECH_GATEWAY_URL": url, "PYTHONPATH": str(ROOT)}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            name,
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), 180)
    assert process.returncode == 0, output.decode(errors="replace")[-3000:]
    with wave.open(str(tmp_path / name.replace(".py", ".wav")), "rb") as wav:
        rate = wav.getframerate()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2") / 32768.0
    heard = transcribe(pcm.astype(np.float32), rate)
    assert wer(match.group(1), heard) <= MAX_WER, heard
