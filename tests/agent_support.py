"""Shared by the voice-agent framework tests: a CPU-voice gateway, LLM-like tokens, metrics."""

from __future__ import annotations

import re

import httpx
import numpy as np
from starlette.applications import Starlette

from gateway.app import create_app
from gateway.settings import GatewaySettings
from realtime_engine.engines.cpu_voice import CpuVoiceEngine

# Replies the CPU voice says clearly enough for the small Whisper model (its
# noise makes every run a little different; these stay well under MAX_WER).
TURN_ONE = (
    "Good morning and thank you for calling. Your new phone will arrive on Friday. "
    "Is there anything else I can help you with today?"
)
TURN_TWO = "Is there anything else I can help you with today?"
# Long enough (about 25 s of speech) that the server, which runs at most
# ``max_lead_s`` (10 s) ahead of playback, is still speaking it when a test cuts in.
LONG_TURN = (
    "Let me read the whole list of stores near you. The first one is on Main Street, "
    "the second one is by the river, the third one is next to the station, and the "
    "fourth one is at the end of the long road that runs past the old school. "
    "The fifth one opened last spring in the new mall, the sixth one is across from "
    "the park, and the seventh one, which is the largest, sits right by the airport. "
    "All of them are open every day from eight in the morning until nine at night."
)
MAX_WER = 0.10
TOKENS_PER_SECOND = 30


def cpu_voice_app(**settings: object) -> Starlette:
    """A gateway serving the embedded CPU voice (run it with ``lifespan="on"``)."""
    return create_app(GatewaySettings.model_validate(settings), CpuVoiceEngine())


def llm_tokens(text: str) -> list[str]:
    """Word pieces with their leading space, the way chat models stream text."""
    return re.findall(r"\s*\S+", text)


def pcm16_to_float(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


async def contexts_total(base_url: str, status: str) -> float:
    """The server's ``speech_contexts_total{status=...}`` counter."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{base_url}/metrics")).text
    pattern = rf'^speech_contexts_total\{{status="{status}"\}} (\S+)$'
    match = re.search(pattern, text, flags=re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def mint_token(base_url: str, api_key: str) -> str:
    async with httpx.AsyncClient() as client:
        reply = await client.post(
            f"{base_url}/v1/tokens", headers={"Authorization": f"Bearer {api_key}"}
        )
    reply.raise_for_status()
    token: str = reply.json()["token"]
    return token
