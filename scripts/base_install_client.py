"""Run inside a venv holding only the base install: stream speech from a live gateway.

Usage: python base_install_client.py ws://HOST:PORT

Exits non-zero when the SDK cannot stream, or when importing and using it
pulled in a server-side package (torch above all).
"""

from __future__ import annotations

import asyncio
import sys

from gateway.client import connect
from gateway.client.sync import speak

SERVER_SIDE = {
    *("torch", "onnxruntime", "av", "soxr", "starlette", "uvicorn", "matplotlib", "vllm"),
    "redis",  # the [redis] extra: replicas' shared voice store
}


async def stream(url: str) -> tuple[int, int]:
    """Chunks and samples of one utterance, streamed as Opus (the default format)."""
    async with connect(url) as conn:
        ctx = conn.context()
        await ctx.append("Hello from a client ")
        await ctx.append("that installs without torch.")
        await ctx.end()
        chunks = samples = 0
        async for chunk in ctx.audio():
            assert chunk.pcm is not None
            chunks += 1
            samples += chunk.pcm.size
    return chunks, samples


def main(url: str) -> int:
    import gateway

    chunks, samples = asyncio.run(stream(url))
    wav = speak("And a blocking call.", url=url)
    loaded = SERVER_SIDE & {name.split(".")[0] for name in sys.modules}
    print(f"streamed {chunks} chunks, {samples / 24000:.2f} s; speak(): {len(wav)} WAV bytes")
    print(f"gateway from {gateway.__file__}; server-side modules loaded: {sorted(loaded)}")
    ok = chunks > 1 and samples > 12_000 and wav[:4] == b"RIFF" and not loaded
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
