"""bench.gpu.first_chunk_trace on a small one-stream trace, laid out as vLLM's profiler writes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from bench.gpu.first_chunk_trace import (
    PCM_FRAME_BYTES,
    STATUS_BYTES,
    chunk_row,
    first_chunks,
    main,
)
from realtime_engine.format import DELAY_ROWS, PRESETS

TALKER, CODEC, MAIN, SENDER = 7, 21, 100, 200
ROW_US = 4000.0


def _request(start: float, rows: int, corr: int) -> tuple[list[dict[str, Any]], int]:
    """A prefill at ``start`` (annotated twice, nested, as vLLM does) and one status
    copy per row; then the codec's two graph launches and the PCM copy after the
    row that makes `latency`'s first chunk due."""
    step = "execute_context_1(13)_generation_0(0)"
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "gpu_user_annotation", "name": step, "ts": start, "dur": 3000},
        {"ph": "X", "cat": "gpu_user_annotation", "name": step, "ts": start + 100, "dur": 80},
        {"ph": "X", "cat": "user_annotation", "name": step, "ts": start - 500, "dur": 400}
        | {"tid": MAIN},
    ]
    for r in range(rows):
        end = start + 3000 + r * ROW_US
        events.append(_copy(end - 5, 5, STATUS_BYTES, TALKER))
    due = start + 3000 + chunk_row("latency") * ROW_US
    for launch_at, gpu_at, ops in ((due + 1000, due + 1100, 3), (due + 1500, due + 2600, 4)):
        corr += 1
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaGraphLaunch",
                "ts": launch_at,
                "dur": 10,
                "tid": MAIN,
                "args": {"correlation": corr},
            }
        )
        for k in range(ops):
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"codec{k}",
                    "ts": gpu_at + 300 * k,
                    "dur": 250,
                    "args": {"stream": CODEC, "correlation": corr},
                }
            )
    pcm = _copy(due + 4000, 10, PCM_FRAME_BYTES, CODEC)
    events.append(pcm)
    events.append(
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaEventSynchronize",
            "ts": due + 3000,
            "dur": 1050,
            "tid": SENDER,
            "args": {},
        }
    )
    return events, corr


def _copy(ts: float, dur: float, size: int, stream: int) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "gpu_memcpy",
        "name": "Memcpy DtoH (Device -> Pinned)",
        "ts": ts,
        "dur": dur,
        "args": {"stream": stream, "bytes": size},
    }


def _trace(tmp_path: Path) -> Path:
    first, corr = _request(0.0, 12, 0)
    second, _ = _request(200_000.0, 12, corr)
    # a request cut after two rows (aborted before its first chunk) is skipped
    cut, _ = _request(400_000.0, 2, 1000)
    cut = [e for e in cut if e.get("args", {}).get("stream") != CODEC]
    path = tmp_path / "rank0.1.pt.trace.json.gz"
    payload = {"traceEvents": first + second + cut}
    path.write_bytes(gzip.compress(json.dumps(payload).encode()))
    return path


def test_the_due_row_is_the_first_chunk_plus_holdback_plus_the_delay() -> None:
    latency = PRESETS["latency"]
    assert chunk_row("latency") == (
        latency.first_chunk_frames + latency.right_holdback_frames + DELAY_ROWS - 1
    )
    assert chunk_row("exact") > chunk_row("latency")


def test_each_request_is_followed_from_its_prefill_to_its_first_pcm(tmp_path: Path) -> None:
    from bench.gpu.trace_steps import load_trace

    chunks = first_chunks(load_trace(_trace(tmp_path)), chunk_row("latency"))
    assert len(chunks) == 2
    for chunk in chunks:
        assert chunk.rows_ms[0] == pytest.approx(3.0)
        assert chunk.rows_ms[1] - chunk.rows_ms[0] == pytest.approx(ROW_US / 1000)
        assert chunk.launch_ms == pytest.approx(1.0)
        assert [launch.ops for launch in chunk.launches] == [3, 4]
        assert chunk.codec_busy_ms == pytest.approx(7 * 0.25)
        assert chunk.pcm_ms == pytest.approx(4.01)
        assert chunk.sent_ms == pytest.approx(4.05)
        assert chunk.pcm_bytes == PCM_FRAME_BYTES


def test_the_report_gives_the_medians(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.txt"
    assert main([str(_trace(tmp_path)), "--out", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out
    assert text.startswith("2 requests; `latency`'s first chunk is due at row 9")
    assert text.splitlines()[-1] == (
        "median: row 0 3.00 ms, due row 39.00 ms; after it: host launch +1.00, "
        "codec busy 1.75, PCM copied +4.01, sent +4.05 ms"
    )


def test_a_trace_without_statuses_reports_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty.pt.trace.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": []}).encode()))
    out = tmp_path / "report.txt"
    assert main([str(path), "--out", str(out)]) == 0
    assert out.read_text().startswith("no request")
