"""The server's session limits counted across worker processes (gateway/shared_admission.py).

Two :class:`SharedAdmission` on one file stand for two workers (the lock is a
``flock`` of the file, which orders processes; a process per worker is tested
end to end in test_workers.py). Every answer must be the one a single
process's :class:`Admission` gives for the same sequence of calls.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.auth import ANONYMOUS
from gateway.shared_admission import (
    SharedAdmission,
    admission_capacity,
    admission_file_size,
    create_admission_file,
)
from gateway.state import Admission

LIMITS = {"max_sessions": 5, "max_sessions_per_key": 2, "max_contexts_per_key": 2}


def _workers(path: Path, capacity: int, count: int = 2, **limits: int) -> list[SharedAdmission]:
    create_admission_file(str(path), capacity)
    return [SharedAdmission(str(path), **(LIMITS | limits)) for _ in range(count)]


def test_two_workers_share_the_server_limits(tmp_path: Path) -> None:
    a, b = _workers(tmp_path / "admission", 1024)
    assert a.try_open_session("k") is None
    assert b.try_open_session("k") is None
    assert a.try_open_session("k") == "key" and b.try_open_session("k") == "key"
    assert a.try_open_context("k") and b.try_open_context("k")
    assert not a.try_open_context("k"), "the key's contexts are counted on the server"
    for _ in range(3):
        assert b.try_open_session(ANONYMOUS) is None  # no key limit for an open server
    assert a.try_open_session("other") == "server"
    assert a.sessions == b.sessions == 5
    b.close_context("k")
    assert a.try_open_context("k")
    a.close_session("k")
    assert b.try_open_session("other") is None


def test_a_closed_table_is_empty_again(tmp_path: Path) -> None:
    path = tmp_path / "admission"
    (a,) = _workers(path, 4, count=1, max_sessions=100)  # four entries: keys collide
    for round_ in range(3):
        keys = [f"key-{round_}-{i}" for i in range(4)]  # fills the table
        for key in keys:
            assert a.try_open_session(key) is None and a.try_open_context(key)
        for key in reversed(keys) if round_ % 2 else keys:
            a.close_context(key)
            a.close_session(key)
    assert a.sessions == 0
    assert path.read_bytes() == bytes(admission_file_size(4)), "no entry left behind"


def test_the_table_is_sized_for_the_session_limit() -> None:
    assert admission_capacity(10) == 1024
    assert admission_capacity(5000) == 10_000


def test_a_file_of_another_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "not-admission"
    path.write_bytes(b"\0" * 13)
    with pytest.raises(ValueError, match="not an admission file"):
        SharedAdmission(str(path), **LIMITS)


_KEYS = st.sampled_from(["a", "b", "c", "d", "e", ANONYMOUS])
_CALLS = st.lists(
    st.tuples(st.sampled_from(["session", "close_session", "context", "close_context"]), _KEYS),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(calls=_CALLS, worker_of_call=st.lists(st.integers(0, 1), min_size=60, max_size=60))
def test_the_shared_counts_answer_as_one_process_does(
    tmp_path_factory: pytest.TempPathFactory,
    calls: list[tuple[str, str]],
    worker_of_call: list[int],
) -> None:
    """Whichever worker each call lands on, and with a table small enough that
    keys collide and chains are cut and cleared, the answers are those of one
    process's counters."""
    path = tmp_path_factory.mktemp("admission") / "admission"
    workers = _workers(path, 4, max_sessions=4)  # at most 4 keys have sessions at once
    local = Admission(max_sessions=4, max_sessions_per_key=2, max_contexts_per_key=2)
    open_sessions: dict[str, int] = {}
    open_contexts: dict[str, int] = {}
    for (call, key), index in zip(calls, worker_of_call, strict=False):
        shared = workers[index]
        if call == "session":
            answer = local.try_open_session(key)
            assert shared.try_open_session(key) == answer
            if answer is None:
                open_sessions[key] = open_sessions.get(key, 0) + 1
        elif call == "close_session" and open_sessions.get(key):
            if open_contexts.get(key):
                continue  # a session's contexts close before it does
            open_sessions[key] -= 1
            local.close_session(key)
            shared.close_session(key)
        elif call == "context" and open_sessions.get(key):
            answer_context = local.try_open_context(key)
            assert shared.try_open_context(key) == answer_context
            if answer_context:
                open_contexts[key] = open_contexts.get(key, 0) + 1
        elif call == "close_context" and open_contexts.get(key):
            open_contexts[key] -= 1
            local.close_context(key)
            shared.close_context(key)
        assert shared.sessions == local.sessions
    for key, count in open_contexts.items():
        for _ in range(count):
            workers[0].close_context(key)
    for key, count in open_sessions.items():
        for _ in range(count):
            workers[1].close_session(key)
    assert path.read_bytes() == bytes(admission_file_size(4))
