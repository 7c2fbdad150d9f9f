"""Server settings: one validated object built from CLI flags or the environment."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from gateway.protocol import Limits


class GatewaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    # No keys: the server is open (local use). With keys every WebSocket and
    # HTTP call needs one (or an ephemeral token minted with one).
    api_keys: tuple[str, ...] = ()
    # HMAC secret for ephemeral tokens; random per process when empty.
    token_secret: str = ""
    token_ttl_s: float = Field(default=60.0, gt=0)
    max_token_ttl_s: float = Field(default=600.0, gt=0)
    limits: Limits = Field(default_factory=Limits)
    # Per API key, across its sessions (only when keys are configured).
    max_sessions_per_key: int = Field(default=1000, ge=1)
    max_contexts_per_key: int = Field(default=8000, ge=1)
    # Protocol-level keepalive pings sent by the server (uvicorn).
    ws_ping_interval_s: float = Field(default=20.0, gt=0)
    ws_ping_timeout_s: float = Field(default=20.0, gt=0)
    # Frames and events waiting for the socket, per session: a slow client
    # slows only its own engine work.
    outbound_queue_items: int = Field(default=256, ge=4)
    # Displayed as the session's model; the engine's model id when empty.
    model_name: str = ""
    # Accept connections while the engine warms up (/health answers, /ready
    # says "loading", sessions get 1013) instead of after it.
    warm_in_background: bool = False
    # A segment whose engine yields nothing for this long fails (and is aborted).
    engine_stall_timeout_s: float = Field(default=60.0, gt=0)
    # On SIGTERM/SIGINT, open contexts may finish for this long (docs/reliability.md).
    drain_timeout_s: float = Field(default=30.0, ge=0)
    # Exit (status 3) when the engine dies while serving, instead of staying up
    # with /ready at 503 (for supervisors that cannot probe /ready).
    exit_on_engine_death: bool = False
    # PCM chunks longer than this are encoded on a worker thread (a context's
    # first audio never is: TTFA waits on it).
    encode_inline_max_ms: float = Field(default=60.0, ge=0)
    # Threads encoding every session's audio (Opus spends its time in C with the
    # GIL released). Few on purpose: each one also takes the GIL back after
    # every packet, in turn with the event loop.
    encode_threads: int = Field(default=4, ge=1, le=64)
    # From a self-paced engine (the Higgs talkers), read each context's audio
    # up to this far ahead of what was sent, so that its next segment starts
    # as soon as the engine is done with the last one. Off by default: audio
    # read ahead of a listener who stops is wasted engine work
    # (gateway.realtime.contexts.DEFAULT_READ_AHEAD_S says what it measured).
    read_ahead_s: float = Field(default=0.0, ge=0, le=30)
    # Once the engine is warm, freeze the start-up heap so that the collector's
    # full passes (0.5 s and more with vLLM loaded) skip it (gateway.gc_heap).
    # `serve` turns it on; off here so in-process apps (tests) leave gc alone.
    freeze_gc_heap: bool = False
    # Encoded voices kept in memory (least recently used out first).
    voice_cache_entries: int = Field(default=1024, ge=1)
    # Where encoded voices persist across restarts; none when empty.
    voice_dir: str = ""
    # A store shared by gateway replicas (redis://host:6379/0); replaces
    # voice_dir. Empty: voices live in this process (docs/scaling.md).
    voice_store: str = ""
    # Gateway processes sharing one listening socket (`serve --workers N`).
    # Each owns the connections it accepts; a vLLM talker is one engine for
    # all of them (docs/scaling.md, "Worker processes").
    workers: int = Field(default=1, ge=1, le=64)
    # This process's index among the workers, and every worker's private Unix
    # socket, where /metrics answers for that worker alone (the public /metrics
    # merges them all). Empty with one worker.
    worker_index: int = Field(default=0, ge=0)
    worker_sockets: tuple[str, ...] = ()
    # Whether the workers share one engine (the vLLM talker's host). False when
    # each runs its own: /metrics then labels the engine's families per worker
    # too, instead of taking them once.
    workers_share_engine: bool = True
    # The file in which the workers count sessions and contexts against the
    # server's limits (gateway/shared_admission.py). Empty with one worker.
    admission_file: str = ""

    @classmethod
    def from_env(cls, **overrides: object) -> GatewaySettings:
        """Settings from ``SPEECH_GATEWAY_*`` variables, then explicit overrides."""
        values: dict[str, object] = {}
        keys = os.environ.get("SPEECH_GATEWAY_API_KEYS", "")
        if keys.strip():
            values["api_keys"] = tuple(k.strip() for k in keys.split(",") if k.strip())
        if secret := os.environ.get("SPEECH_GATEWAY_TOKEN_SECRET"):
            values["token_secret"] = secret
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
