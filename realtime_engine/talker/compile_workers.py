"""Inductor settings for the plugin's own compiles (the codec step, the code sampler)
inside vLLM's engine core: parallel workers and a cache of their own.

Importing vLLM pins Inductor to one compile thread in every process
(``TORCHINDUCTOR_COMPILE_THREADS=1``, overriding the environment, and
``torch._inductor.config.compile_threads = 1`` when plugins load), so that
its workers do not each keep a pool of compile processes. The compiled codec
step and whole tail are traced once at start-up, and compiling their kernels
one at a time took more than four minutes of a cold start on an H200 host
(docs/bench/RESULTS.md section 22). :func:`parallel_compile` lends the codec's
warm-up Inductor's own default, a worker per core up to 32, and shuts the
workers down and restores vLLM's setting afterwards, so nothing of it stays
running beside the engine.

vLLM also points Inductor's and Triton's caches at a folder named by the hash of
its whole configuration (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``, set in
the process's environment). The codec and the sampler compiled there would start
cold whenever any engine argument changed, which the codec's compile does not
depend on: on one H100, 90-94 s against 41 s warm (RESULTS.md section 42).
:func:`own_compile_cache` gives them a folder of their own; Inductor's and
Triton's cache keys already hash the graph, the device and the versions.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger("vllm.plugins.higgs_talker.codec")

# Inductor's own cap on its default number of compile workers.
MAX_COMPILE_WORKERS = 32


def default_compile_workers() -> int:
    """A worker per core this process may run on, up to :data:`MAX_COMPILE_WORKERS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_COMPILE_WORKERS, cores))


@contextlib.contextmanager
def parallel_compile(workers: int | None = None) -> Iterator[int]:
    """Compile with ``workers`` Inductor workers inside the block (default:
    :func:`default_compile_workers`); yields the number used. The workers are shut
    down and the previous setting restored on the way out."""
    from torch._inductor import async_compile
    from torch._inductor import config as inductor_config

    count = default_compile_workers() if workers is None else max(1, workers)
    before = inductor_config.compile_threads
    inductor_config.compile_threads = count
    try:
        yield count
    finally:
        if count > 1:
            try:
                async_compile.shutdown_compile_workers()
            except Exception:  # a pool that failed to start: nothing left to stop
                logger.warning("stopping the codec's compile workers failed", exc_info=True)
        inductor_config.compile_threads = before


# Where Inductor and Triton read their cache folders from, each time they look.
CACHE_DIR_VARIABLES = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor_cache",
    "TRITON_CACHE_DIR": "triton_cache",
}


@contextlib.contextmanager
def own_compile_cache(root: Path | None) -> Iterator[None]:
    """Inductor's and Triton's caches under ``root`` inside the block (None: as
    they are); the environment as it was on the way out, an unset variable unset."""
    folders = _made_folders(root) if root is not None else {}
    before = {name: os.environ.get(name) for name in folders}
    os.environ.update(folders)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _made_folders(root: Path) -> dict[str, str]:
    """Each cache variable's folder under ``root``, made; none where one cannot be
    made (an unwritable cache costs time, not the start)."""
    try:
        folders = {name: root / folder for name, folder in CACHE_DIR_VARIABLES.items()}
        for path in folders.values():
            path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        logger.warning("no compile cache of the plugin's own at %s (%s): vLLM's is used", root, e)
        return {}
    return {name: str(path) for name, path in folders.items()}


# torch.compile's phases worth a line of a start-up log: Dynamo's tracing, AOTAutograd's
# (its tracing and Inductor's compile inside), Inductor's, loading compiled code, waiting
# for the compile workers.
COMPILE_PHASES = {
    "dynamo": "bytecode_tracing",
    "aot": "create_aot_dispatcher_function",
    "inductor": "compile_fx_inner",
    "load": "PyCodeCache.load_by_key_path",
    "workers": "async_compile.wait",
}


def compile_phase_seconds() -> dict[str, float]:
    """torch.compile's running totals of :data:`COMPILE_PHASES` in this process (zeros
    where a phase has not run or this torch names it otherwise): take two readings
    around a warm-up and subtract. Never raises: the counters are torch's own."""
    totals: dict[str, float] = {}
    try:
        from torch._dynamo.utils import compile_times

        table = compile_times(repr="csv", aggregate=True)
        if isinstance(table, tuple):
            names, values = table
            totals = {
                str(name): float(str(value)) for name, value in zip(names, values, strict=True)
            }
    except Exception:  # a torch without these counters: the log goes without them
        pass
    return {phase: totals.get(name, 0.0) for phase, name in COMPILE_PHASES.items()}


def describe_compile_phases(before: dict[str, float], after: dict[str, float]) -> str:
    """``"dynamo 4.4 s, aot 10.1 s, …"``: where a warm-up's compile went."""
    return ", ".join(f"{phase} {after[phase] - before[phase]:.1f} s" for phase in after)
