"""How long the collector's full pass stops a served gateway process, with and without
the start-up heap frozen (``gateway.gc_heap``).

Builds and starts the engine ``serve`` would (``--engine``, ``--model``), with the
modules a gateway imports, then times ``gc.collect()`` a few times before and after
``freeze_startup_heap()``. With ``--talker vllm`` the process also imports vLLM's
client, as a gateway serving the vLLM talker does (the engine core is another
process and is not started here)::

    python -m bench.gc_pause                          # the CPU voice (the default engine)
    python -m bench.gc_pause --engine higgs --model tiny --import-vllm
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import time

from gateway.cli import build_engine
from gateway.gc_heap import freeze_startup_heap


def _full_pass_ms(repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        gc.collect()
        out.append(round((time.perf_counter() - t) * 1000, 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", default="cpu-voice", choices=["cpu-voice", "higgs", "fake"])
    parser.add_argument("--model")
    parser.add_argument("--import-vllm", action="store_true", help="import vLLM's async client")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    importlib.import_module("gateway.app")
    if args.import_vllm:
        importlib.import_module("vllm.v1.engine.async_llm")
    engine = build_engine(args.engine, args.model, "cpu")
    asyncio.run(engine.start())
    before = _full_pass_ms(args.repeat)
    tracked = len(gc.get_objects())
    frozen = freeze_startup_heap()
    after = _full_pass_ms(args.repeat)
    print(
        json.dumps(
            {
                "engine": args.engine,
                "import_vllm": args.import_vllm,
                "tracked_objects": tracked,
                "frozen_objects": frozen,
                "full_pass_ms_before": before,
                "full_pass_ms_after": after,
            }
        )
    )


if __name__ == "__main__":
    main()
