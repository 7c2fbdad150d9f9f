"""Cost of the talker's per-step code sampling outside the model, by stage (no vLLM needed).

Runs the same tensor operations the vLLM sampler runs each step (delay
masks, counter noise, RAS history, per-codebook sampling, machine advance,
row write-back, row copy-out) on random logits, and reports per stage the
GPU time (CUDA events) and the host time to issue it; then the whole step
as the engine runs it: eager, replayed from its captured CUDA graph, and
through torch.compile before capture (the engine's default), with a check
that the graphs draw the eager rows. Writes
``$OUT/talker_sampler_step.json``.

    python -m bench.talker_sampler_step [--batches 1,16,64,256] [--iters 200]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from realtime_engine.talker.sampling import BatchSampling, sample_codes
from realtime_engine.talker.termination import NEVER, BatchTermination, allowed_for_modes
from realtime_engine.talker.types import CODEBOOK_VOCAB, NUM_CODEBOOKS
from realtime_engine.talker.vllm_protocol import MAX_RAS_WINDOW, TalkerArgs
from realtime_engine.talker.vllm_sampler_graphs import PaddedStepGraphs
from realtime_engine.talker.vllm_sampling import counter_noise, recent_codes
from realtime_engine.talker.vllm_slots import TalkerSlots

MAX_LEN = 4096
# steps of the whole-step check (graphs and compiled graphs against eager)
CHECK_STEPS = 40


def measure(batch: int, iters: int, device: torch.device) -> dict[str, dict[str, float]]:
    slots = torch.arange(batch, device=device)
    n, v = NUM_CODEBOOKS, CODEBOOK_VOCAB
    codes_by_pos = torch.randint(0, 1024, (batch + 1, MAX_LEN, n), dtype=torch.int16, device=device)
    prompt_len = torch.full((batch + 1,), 32, device=device)
    term = BatchTermination(batch + 1, n, device)
    term.reset(slots, torch.zeros(batch, dtype=torch.int64), torch.full((batch,), 1 << 40))
    params = BatchSampling(
        temperature=torch.ones(batch, device=device),
        top_k=torch.full((batch,), 50, device=device),
        top_p=torch.full((batch,), 0.95, device=device),
        ras_window=torch.full((batch,), 7, device=device),
        ras_max_repeat=torch.full((batch,), 2, device=device),
    )
    seed = torch.arange(batch, device=device)
    logits = torch.randn(batch, n, v, device=device)
    state: dict[str, Any] = {}

    def masks() -> None:
        state["step"] = term.step.index_select(0, slots)
        state["allowed"] = allowed_for_modes(term.modes(slots), v)

    def noise() -> None:
        state["noise"] = counter_noise(seed, state["step"], n, v)

    def history() -> None:
        state["history"] = recent_codes(
            codes_by_pos, prompt_len, slots, state["step"], MAX_RAS_WINDOW
        )

    def sample() -> None:
        state["codes"] = sample_codes(
            logits, state["allowed"], params, state["noise"], state["history"]
        ).codes

    def advance() -> None:
        rows, _done = term.advance(slots, state["codes"])
        pos = (prompt_len[slots] + state["step"]).clamp(max=MAX_LEN - 1)
        codes_by_pos[slots, pos] = rows.to(torch.int16)
        state["rows"] = rows

    def copy_out() -> None:
        host = torch.empty((batch, n), dtype=torch.int64, pin_memory=device.type == "cuda")
        host.copy_(state["rows"], non_blocking=True)

    stages: list[tuple[str, Callable[[], None]]] = [
        ("masks", masks),
        ("noise", noise),
        ("history", history),
        ("sample", sample),
        ("advance", advance),
        ("copy_out", copy_out),
    ]
    cuda = device.type == "cuda"
    gpu_ms = dict.fromkeys((name for name, _ in stages), 0.0)
    host_ms = dict.fromkeys((name for name, _ in stages), 0.0)
    for it in range(iters + 10):
        for name, fn in stages:
            start = torch.cuda.Event(enable_timing=True) if cuda else None
            end = torch.cuda.Event(enable_timing=True) if cuda else None
            if start is not None:
                start.record()
            t = time.perf_counter()
            fn()
            issued = time.perf_counter() - t
            if end is not None:
                end.record()
                end.synchronize()
            if it >= 10:
                host_ms[name] += 1000 * issued / iters
                if start is not None and end is not None:
                    gpu_ms[name] += start.elapsed_time(end) / iters
    total_wall = 0.0
    for it in range(iters + 10):
        t = time.perf_counter()
        for _, fn in stages:
            fn()
        if cuda:
            torch.cuda.synchronize()
        if it >= 10:
            total_wall += 1000 * (time.perf_counter() - t) / iters
    return {
        "gpu_ms": {k: round(x, 4) for k, x in gpu_ms.items()},
        "host_issue_ms": {k: round(x, 4) for k, x in host_ms.items()},
        "step_wall_ms": {"all_stages": round(total_wall, 4)},
    }


def measure_whole_step(batch: int, iters: int, device: torch.device) -> dict[str, float]:
    """The vLLM sampler's whole device step (:meth:`TalkerSlots.step`): eager and, on
    CUDA, replayed from the captured graph of its batch bucket, as captured and
    through torch.compile first (``compiled``, the engine's default). Wall ms per
    step, and how many of ``CHECK_STEPS`` steps' tokens and rows differ from eager
    (seeded top-k/top-p sampling with RAS, the same logits for each)."""
    cuda = device.type == "cuda"
    # on CPU "compiled" is Inductor's CPU code, without graphs
    names = ["eager", *(["graph"] if cuda else []), "compiled"]
    state = {
        name: TalkerSlots(batch, MAX_LEN, NUM_CODEBOOKS, CODEBOOK_VOCAB, device) for name in names
    }
    for slots in state.values():
        for slot in range(batch):
            slots.admit(slot, _release_args(slot), 32, 32)
    idx = torch.arange(batch, device=device)
    runners: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, ...]]] = {}
    for name, slots in state.items():
        if name == "eager":
            run: Callable[..., Any] = slots.step
        else:
            run = PaddedStepGraphs(
                slots.step,
                max_batch=batch,
                pad_slot=slots.trash_slot,
                device=device,
                capture=cuda,
                compiled=name == "compiled",
            )

        def runner(
            logits: torch.Tensor, slots: TalkerSlots = slots, run: Callable[..., Any] = run
        ) -> tuple[torch.Tensor, ...]:
            seq_lens = slots.prefill_len[idx] + slots.termination.step[idx]
            out = run(logits, idx, seq_lens)
            assert out is not None
            return tuple(out)

        runners[name] = runner
    out: dict[str, float] = {}
    gen = torch.Generator(device=device).manual_seed(batch)
    mismatched = dict.fromkeys(names[1:], 0)
    for _ in range(CHECK_STEPS):
        logits = torch.randn(batch, NUM_CODEBOOKS * CODEBOOK_VOCAB, device=device, generator=gen)
        want = runners["eager"](logits)
        for name in names[1:]:
            got = runners[name](logits)
            if not all(torch.equal(x, y) for x, y in zip(want, got, strict=True)):
                mismatched[name] += 1
    for name, steps in mismatched.items():
        out[f"{name}_steps_unlike_eager"] = steps
    logits = torch.randn(batch, NUM_CODEBOOKS * CODEBOOK_VOCAB, device=device)
    for name, fn in runners.items():
        for _ in range(10):
            fn(logits)
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            fn(logits)
        if cuda:
            torch.cuda.synchronize()
        out[f"{name}_ms"] = round(1000 * (time.perf_counter() - t) / iters, 4)
    return out


def _release_args(slot: int) -> TalkerArgs:
    return TalkerArgs(
        correlation_id=f"r{slot}",
        endpoint="ipc:///unused",
        audio_token_id=1,
        eos_token_id=2,
        temperature=1.0,
        top_k=50,
        top_p=0.95,
        ras_window=7,
        ras_max_repeat=2,
        seed=slot,
        eoc_not_before=0,
        eoc_at=NEVER,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    report: dict[str, Any] = {"device": str(device), "torch": torch.__version__}
    for batch in (int(b) for b in args.batches.split(",")):
        report[str(batch)] = measure(batch, args.iters, device)
        report[str(batch)]["whole_step"] = measure_whole_step(batch, args.iters, device)
        print(batch, json.dumps(report[str(batch)]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "talker_sampler_step.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
