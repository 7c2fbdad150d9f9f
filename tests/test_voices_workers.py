"""Voices shared by the gateway processes of one host through one directory
(``serve --workers N``): two libraries over one directory stand for two
workers. A voice named through one is listed, used and deleted through the
other; the per-key maximum holds for creates racing from threads and from
real processes; and two real apps share voices over HTTP and WebSocket."""

from __future__ import annotations

import asyncio
import base64
import fcntl
import multiprocessing
import os
import queue
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from gateway_support import open_session, send_event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from voice_clips_support import CloningFakeEngine, clip
from voice_workers_support import create_voices, create_voices_in_process

from bench.server import serve
from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.voice_backends import (
    AddOutcome,
    LocalVoiceBackend,
    shared_voice_dir_for_workers,
)
from gateway.voice_store import StoredName, name_digest
from gateway.voices import VoiceConflictError, VoiceLibrary, VoiceNotFoundError, VoiceStore

CLIP = clip(220)


def worker(root: Path, **kw: Any) -> tuple[VoiceLibrary, CloningFakeEngine]:
    """One worker process's library over the shared directory."""
    engine = CloningFakeEngine()
    return VoiceLibrary(engine, store=VoiceStore(root), **kw), engine


# -- two libraries over one directory ----------------------------------------------------


async def test_a_voice_named_through_one_worker_is_used_and_deleted_through_another(
    tmp_path: Path,
) -> None:
    a, engine_a = worker(tmp_path)
    b, engine_b = worker(tmp_path)
    await a.create(CLIP, "a tone", "mine", key_id="key_a")
    assert not b.has("mine", "key_a")  # has() does no I/O: b has not looked yet
    await b.refresh("mine", "key_a")
    assert b.has("mine", "key_a") and not b.has("mine", "key_b")
    mine_a, mine_b = await a.reference("mine", "key_a"), await b.reference("mine", "key_a")
    assert mine_a is not None and mine_b is not None
    assert np.array_equal(mine_a.codes, mine_b.codes) and mine_b.text == "a tone"
    assert [v.voice_id for v in await b.list("key_a") if not v.builtin] == ["mine"]
    assert [v.voice_id for v in await b.list("key_b") if not v.builtin] == []
    again = await b.create(CLIP, "a tone", None, key_id="key_a")  # the codes come from disk
    assert again.cached and again.voice_id == "mine" and engine_b.encoded == 0
    with pytest.raises(VoiceNotFoundError):
        await b.reference("mine", "key_b")
    await b.delete("mine", "key_a")
    # a still holds the codes in memory, but the name is gone at its next use
    assert a.has("mine", "key_a")
    with pytest.raises(VoiceNotFoundError, match="no voice named"):
        await a.reference("mine", "key_a")
    assert not a.has("mine", "key_a")
    with pytest.raises(VoiceNotFoundError):
        await a.delete("mine", "key_a")
    assert [v.voice_id for v in await a.list("key_a") if not v.builtin] == []
    assert engine_a.encoded == 1


async def test_an_id_taken_through_another_worker_is_a_conflict(tmp_path: Path) -> None:
    a, _ = worker(tmp_path)
    b, _ = worker(tmp_path)
    await a.create(CLIP, None, "same", "k")
    with pytest.raises(VoiceConflictError, match="already exists"):
        await b.create(clip(330), None, "same", "k")
    # the same clip again through b: the voice a made, not a second one
    again = await b.create(CLIP, None, None, "k")
    assert again.voice_id == "same" and again.cached
    assert len([v for v in await a.list("k") if not v.builtin]) == 1


async def test_the_list_order_is_the_creation_order_on_every_worker(tmp_path: Path) -> None:
    a, _ = worker(tmp_path)
    b, _ = worker(tmp_path)
    for i, voice_id in enumerate(["zeta", "alpha", "mid"]):
        await (a, b)[i % 2].create(clip(200 + 50 * i), None, voice_id, "k")
    for library in (a, b):
        assert [v.voice_id for v in await library.list("k") if not v.builtin] == [
            "zeta",
            "alpha",
            "mid",
        ]


def test_the_per_key_maximum_holds_for_creates_racing_from_threads(tmp_path: Path) -> None:
    """Two workers, one thread and event loop each, start together; each creates five
    voices at once for one key that may hold three."""
    start = threading.Barrier(2, timeout=60)
    results: dict[int, tuple[list[str], int]] = {}

    def run(index: int) -> None:
        hzs = [200.0 + 10 * (5 * index + i) for i in range(5)]
        results[index] = asyncio.run(create_voices(str(tmp_path), "k", hzs, 3, start))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()
    made = [voice for voices, _ in results.values() for voice in voices]
    refused = sum(count for _, count in results.values())
    assert len(made) == 3 and refused == 7, results
    assert sorted(n.voice_id for n in VoiceStore(tmp_path).list_names("k")) == sorted(made)


def test_the_per_key_maximum_holds_for_creates_racing_from_processes(tmp_path: Path) -> None:
    """Three real processes (spawned, as the workers are) create four voices each,
    all at once, for one key that may hold five."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(3, timeout=120)
    results = ctx.Queue()
    processes = [
        ctx.Process(
            target=create_voices_in_process,
            args=(
                str(tmp_path),
                "k",
                [300.0 + 10 * (4 * p + i) for i in range(4)],
                5,
                start,
                results,
            ),
        )
        for p in range(3)
    ]
    for process in processes:
        process.start()
    answers = []
    try:
        for _ in processes:
            answers.append(results.get(timeout=120))
    except queue.Empty:
        pytest.fail(f"a process gave no answer: exit codes {[p.exitcode for p in processes]}")
    finally:
        for process in processes:
            process.join(timeout=60)
    assert [p.exitcode for p in processes] == [0, 0, 0]
    made = [voice for voices, _ in answers for voice in voices]
    assert len(made) == 5 and sum(refused for _, refused in answers) == 7, answers
    assert sorted(n.voice_id for n in VoiceStore(tmp_path).list_names("k")) == sorted(made)


# -- the backend against a model ----------------------------------------------------------

VOICE_IDS = ("v0", "v1", "v2", "v3")
MAX_VOICES = 3
CODES = np.zeros((2, 8), dtype=np.int64)


def stored(voice_id: str, clip_index: int) -> StoredName:
    digest = name_digest("k", f"clip{clip_index}")  # any sha256 stands for a clip's
    return StoredName("k", voice_id, digest, 1.0, 2, None, 0)


OPERATIONS = st.lists(
    st.tuples(
        st.integers(0, 1),  # which worker
        st.sampled_from(["add", "delete", "get"]),
        st.sampled_from(VOICE_IDS),
        st.integers(0, 2),  # which clip
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPERATIONS)
def test_two_workers_agree_with_one_shared_model(
    operations: list[tuple[int, str, str, int]],
) -> None:
    """Whatever mix of creates, deletes and reads goes through either worker, both
    answer what one shared set of names would, and the key never passes its maximum."""
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(_check_against_model(root, operations))


async def _check_against_model(root: str, operations: list[tuple[int, str, str, int]]) -> None:
    workers = (LocalVoiceBackend(VoiceStore(root)), LocalVoiceBackend(VoiceStore(root)))
    model: dict[str, str] = {}  # voice id -> digest
    for index, action, voice_id, clip_index in operations:
        backend = workers[index]
        if action == "add":
            name = stored(voice_id, clip_index)
            result = await backend.add_name(name, CODES, None, MAX_VOICES)
            if voice_id in model:
                assert result.outcome is AddOutcome.EXISTS
                assert result.name is not None and result.name.digest == model[voice_id]
            elif len(model) >= MAX_VOICES:
                assert result.outcome is AddOutcome.FULL
            else:
                assert result.outcome is AddOutcome.ADDED
                model[voice_id] = name.digest
        elif action == "delete":
            assert await backend.delete_name("k", voice_id) is (
                model.pop(voice_id, None) is not None
            )
        got = await backend.get_name("k", voice_id)
        assert (got.digest if got else None) == model.get(voice_id)
        assert backend.known("k", voice_id) is (voice_id in model)
        for other in workers:
            listed = {n.voice_id: n.digest for n in await other.list_names("k")}
            assert listed == model and len(listed) <= MAX_VOICES


# -- directories written before the per-key folders ----------------------------------------


async def test_a_directory_in_the_flat_layout_is_moved_into_per_key_folders(
    tmp_path: Path,
) -> None:
    a, _ = worker(tmp_path)
    await a.create(CLIP, "a tone", "old", "key_a")
    (moved,) = list((tmp_path / "names").rglob("*.json"))
    flat = tmp_path / "names" / moved.name
    moved.rename(flat)  # as a gateway before the per-key folders left it
    b, engine_b = worker(tmp_path)
    assert not flat.exists() and moved.is_file()
    assert b.has("old", "key_a")
    reference = await b.reference("old", "key_a")
    assert reference is not None and reference.text == "a tone" and engine_b.encoded == 0


# -- the directory the workers of one server share -----------------------------------------


def test_one_worker_or_a_directory_or_a_store_needs_no_shared_directory(tmp_path: Path) -> None:
    for given_settings, expected in [
        (GatewaySettings(), ""),
        (GatewaySettings(workers=4, voice_dir=str(tmp_path)), str(tmp_path)),
        (GatewaySettings(workers=4, voice_store="redis://store:6379/0"), ""),
    ]:
        voice_dir, cleanup = shared_voice_dir_for_workers(given_settings)
        assert voice_dir == expected
        cleanup()
    assert tmp_path.is_dir()  # the operator's directory is never removed


async def test_several_workers_get_a_private_directory_removed_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker_settings = GatewaySettings(workers=2)
    voice_dir, cleanup = shared_voice_dir_for_workers(worker_settings, parent=str(tmp_path))
    root = Path(voice_dir)
    try:
        assert root.parent == tmp_path and root.name.startswith("speech-gateway-voices-")
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        # the server holds a lock on it: systemd-tmpfiles' aging skips a locked directory
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        a, _ = worker(root)
        b, _ = worker(root)
        await a.create(CLIP, None, "shared", "k")
        assert await b.reference("shared", "k") is not None
        # a worker forked from the server and exiting leaves the directory alone
        with monkeypatch.context() as patch:
            patch.setattr(os, "getpid", lambda: -1)
            cleanup()
        assert root.is_dir()
    finally:
        cleanup()
    assert not root.exists() and tmp_path.is_dir()
    cleanup()  # a second call is harmless
    default_dir, default_cleanup = shared_voice_dir_for_workers(worker_settings)
    assert Path(default_dir).parent == Path(tempfile.gettempdir())
    default_cleanup()
    assert not Path(default_dir).exists()


# -- two real apps over one directory ------------------------------------------------------


async def test_two_apps_share_voices_over_http_and_websocket(tmp_path: Path) -> None:
    engine_a, engine_b = CloningFakeEngine(), CloningFakeEngine()
    shared = GatewaySettings(port=0, voice_dir=str(tmp_path), workers=2)
    app_a = create_app(shared.model_copy(update={"worker_index": 0}), engine_a)
    app_b = create_app(shared.model_copy(update={"worker_index": 1}), engine_b)
    async with (
        serve(app_a) as base_a,
        serve(app_b) as base_b,
        httpx.AsyncClient(base_url=base_a) as http_a,
        httpx.AsyncClient(base_url=base_b) as http_b,
    ):
        audio = base64.b64encode(CLIP).decode()
        created = await http_a.post("/v1/voices", json={"audio": audio, "voice_id": "mine"})
        assert created.status_code == 201, created.text
        listed = (await http_b.get("/v1/voices")).json()["data"]
        assert "mine" in [v["voice_id"] for v in listed if not v["builtin"]]
        spoken = await http_b.post("/v1/audio/speech", json={"input": "Hi.", "voice": "mine"})
        assert spoken.status_code == 200, spoken.text
        ws_b = await open_session(base_b)
        try:
            update = {"type": "session.update", "session": {"voice": "mine"}}
            assert (await send_event(ws_b, update))["type"] == "session.updated"
            # a clip named on B's socket is a voice on A too
            event = {"type": "voice.create", "audio": audio, "voice_id": "from_ws", "text": "hi"}
            made = await send_event(ws_b, event)
            assert made["type"] == "voice.created", made
        finally:
            await ws_b.close()
        from_ws = await http_a.post("/v1/audio/speech", json={"input": "Hi.", "voice": "from_ws"})
        assert from_ws.status_code == 200, from_ws.text
        # each clip was encoded once, by the worker it was sent to; the other read its codes
        assert engine_a.encoded == 1 and engine_b.encoded == 1
        deleted = await http_b.delete("/v1/voices/mine")
        assert deleted.status_code == 200, deleted.text
        refused = await http_a.post("/v1/audio/speech", json={"input": "Hi.", "voice": "mine"})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "voice_not_found"
        listed = (await http_a.get("/v1/voices")).json()["data"]
        assert [v["voice_id"] for v in listed if not v["builtin"]] == ["from_ws"]
        gone = await http_a.delete("/v1/voices/mine")
        assert gone.status_code == 404
        ws_a = await open_session(base_a)
        try:
            update = {"type": "session.update", "session": {"voice": "mine"}}
            answer = await send_event(ws_a, update)
            assert answer["type"] == "error" and answer["error"]["code"] == "voice_not_found"
        finally:
            await ws_a.close()
