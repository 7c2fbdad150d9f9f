"""``serve --workers N``: several gateway processes on one listening socket.

One event loop carries a few hundred streams' worth of Opus encoding and
WebSocket sends (docs/bench/RESULTS.md). With ``--workers N`` this process
binds the listening socket and starts N worker processes that all accept on
it: the kernel hands each new connection to one of them, and that worker
owns the connection, its sessions and its encoding from then on.

The engine:

- the vLLM talker is one engine for every worker. This process starts the
  ``AsyncLLM`` and serves it as a
  :class:`~realtime_engine.talker.talker_host.TalkerHost`; each worker's
  runner submits its requests there, and the engine core pushes each
  request's audio straight to the worker that asked for it;
- every other engine (the CPU voice, the in-process reference talker, the
  fake) runs in each worker, one copy per worker.

This process also passes SIGINT and SIGTERM on to the workers, as
``SUPERVISOR_STOP_SIGNAL`` (each drains its own sessions; a second stop exits
at once; a worker signalled directly as well counts each kind apart, so one
stop sent to the whole process group is one stop) and the device-trace signal
to the first live worker, says ``ready`` once every
worker is, and stops them all when one exits unexpectedly (its status
becomes the server's). Workers die with it (``PR_SET_PDEATHSIG`` on Linux).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.device_trace import TRACE_SIGNAL
from gateway.drain import SUPERVISOR_STOP_SIGNAL
from gateway.settings import GatewaySettings
from gateway.shared_admission import admission_capacity, create_admission_file
from gateway.voice_backends import shared_voice_dir_for_workers
from realtime_engine.talker.backends import TalkerOptions, VllmOptions

log = logging.getLogger(__name__)

# Workers by default with the vLLM talker. On one H200 at 256 streams (docs/bench/
# RESULTS.md, section 18) one process sent 509 audio-s/s with 24 streams
# underrunning, two sent 631 with none, and four no more than two (629) while
# one stream's time to first audio grew by 3 ms.
DEFAULT_TALKER_HOST_WORKERS = 2
# Pending connections the shared socket queues while every worker is busy.
LISTEN_BACKLOG = 2048
# In the run directory: the counters of the server's session limits.
ADMISSION_FILE = "admission"
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker process needs to build its engine and serve (picklable)."""

    index: int
    settings: GatewaySettings
    args: argparse.Namespace
    kind: str
    talker: TalkerOptions | None
    talker_host: str | None  # the vLLM talker host's endpoint, when there is one


def listening_socket(host: str, port: int) -> socket.socket:
    """The socket every worker accepts on (``port`` 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


def worker_settings(
    settings: GatewaySettings, index: int, run_dir: str, voice_dir: str, shared_engine: bool
) -> GatewaySettings:
    """Worker ``index``'s settings: its private socket among all workers', the shared voices."""
    update: dict[str, Any] = {
        "worker_index": index,
        "workers_share_engine": shared_engine,
        "worker_sockets": tuple(
            os.path.join(run_dir, f"worker-{i}.sock") for i in range(settings.workers)
        ),
        "admission_file": os.path.join(run_dir, ADMISSION_FILE),
    }
    if voice_dir:
        update["voice_dir"] = voice_dir
    return settings.model_copy(update=update)


def uses_talker_host(kind: str, talker: TalkerOptions | None) -> bool:
    return kind == "higgs" and isinstance(talker, VllmOptions)


def resolve_workers(requested: int | None, kind: str, talker: TalkerOptions | None) -> int:
    """``--workers`` as given, else the default for this engine and talker."""
    if requested is not None:
        return requested
    return DEFAULT_TALKER_HOST_WORKERS if uses_talker_host(kind, talker) else 1


def run_workers(
    args: argparse.Namespace,
    settings: GatewaySettings,
    kind: str,
    talker: TalkerOptions | None,
    say: Callable[[str], None],
) -> int:
    """Serve with ``settings.workers`` processes until interrupted; the exit status."""
    run_dir = tempfile.mkdtemp(prefix="speech-gateway-")  # 0700: sockets, shared voices
    try:
        return _run(args, settings, kind, talker, say, run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _run(
    args: argparse.Namespace,
    settings: GatewaySettings,
    kind: str,
    talker: TalkerOptions | None,
    say: Callable[[str], None],
    run_dir: str,
) -> int:
    started = time.perf_counter()
    sock = listening_socket(settings.host, settings.port)
    port = sock.getsockname()[1]
    # Voices must be the same on every worker: without a directory or a store
    # of the operator's, a private directory stands in for memory.
    voice_dir, remove_voices = shared_voice_dir_for_workers(settings, parent=run_dir)
    host_endpoint = (
        f"ipc://{os.path.join(run_dir, 'talker')}" if uses_talker_host(kind, talker) else None
    )
    # The server's session limits, counted by every worker in one file.
    create_admission_file(
        os.path.join(run_dir, ADMISSION_FILE), admission_capacity(settings.limits.max_sessions)
    )
    context = multiprocessing.get_context("spawn")
    events, worker_end = context.Pipe(duplex=False)
    procs = []
    for index in range(settings.workers):
        plan = WorkerPlan(
            index,
            worker_settings(settings, index, run_dir, voice_dir, host_endpoint is not None),
            args,
            kind,
            talker,
            host_endpoint,
        )
        proc = context.Process(
            target=worker_main, args=(plan, sock, worker_end), name=f"speech-gateway-worker-{index}"
        )
        proc.start()
        procs.append(proc)
    worker_end.close()
    say(f"{settings.workers} workers accepting on port {port} (pids {[p.pid for p in procs]})")
    supervisor = Supervisor(procs, events, say)
    signal.signal(signal.SIGINT, supervisor.on_signal)
    signal.signal(signal.SIGTERM, supervisor.on_signal)
    signal.signal(TRACE_SIGNAL, supervisor.on_trace_signal)
    host = None
    if host_endpoint is not None:
        host = _start_talker_host(args, talker, host_endpoint, say, supervisor)
    if host is None and host_endpoint is not None:
        supervisor.stop_all()
    try:
        status = asyncio.run(supervisor.supervise(host, settings, port, started))
    finally:
        sock.close()
        supervisor.reap(settings.drain_timeout_s + 10)
        if host is not None:
            host[1].shutdown()
        remove_voices()
    return status


def _start_talker_host(
    args: argparse.Namespace,
    talker: TalkerOptions | None,
    endpoint: str,
    say: Callable[[str], None],
    supervisor: Supervisor,
) -> tuple[Any, Any] | None:
    """Start the vLLM engine here; ``(TalkerHost, link)``, or None when it failed."""
    from realtime_engine.engines.higgs import vllm_talker_kwargs
    from realtime_engine.model.hub import resolve_model
    from realtime_engine.talker.talker_host import TalkerHost
    from realtime_engine.talker.vllm_link import LocalEngineLink
    from realtime_engine.talker.vllm_runner import start_vllm_engine

    say(f"starting the vLLM talker for every worker from {args.model}")
    loading = time.perf_counter()
    try:
        path = resolve_model(args.model or "tiny")
        kwargs = vllm_talker_kwargs(
            talker, args.codec_precision, args.codec_batch, args.codec_kernels
        )
        link = LocalEngineLink(start_vllm_engine(path, **kwargs))
    except Exception as e:  # any start-up failure is reported, then every worker stops
        say(f"error: the talker failed to start: {e}")
        supervisor.failed = True
        return None
    say(f"talker started in {time.perf_counter() - loading:.1f}s")
    return TalkerHost(link, endpoint), link


class Supervisor:
    """Watches the worker processes: ready, exits, signals."""

    def __init__(
        self,
        procs: list[Any],
        events: multiprocessing.connection.Connection,
        say: Callable[[str], None],
    ) -> None:
        self.procs = procs
        self.events = events
        self.say = say
        self.stopping = False
        self.failed = False
        self.status = 0
        self.ready: set[int] = set()

    def on_signal(self, signum: int, frame: object) -> None:
        """Pass the stop on to every worker as :data:`SUPERVISOR_STOP_SIGNAL`: the
        first drains, a second exits at once. Its own signal, not ``signum``: a
        worker also signalled directly (its process group was) must not count
        the two copies of one stop as two stops, however far apart they land."""
        self.stopping = True
        for proc in self.procs:
            if proc.exitcode is None and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, SUPERVISOR_STOP_SIGNAL)

    def on_trace_signal(self, signum: int, frame: object) -> None:
        """The device-trace toggle (gateway.device_trace): one engine, so one worker asks it."""
        for proc in self.procs:
            if proc.exitcode is None and proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signum)
                return

    def stop_all(self) -> None:
        self.on_signal(signal.SIGTERM, None)

    def reap(self, grace_s: float) -> None:
        """Make sure no worker outlives the server: stopped, then killed after ``grace_s``."""
        if any(proc.exitcode is None for proc in self.procs):
            self.stop_all()
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
                proc.join(5)

    async def supervise(
        self, host: tuple[Any, Any] | None, settings: GatewaySettings, port: int, started: float
    ) -> int:
        host_task = asyncio.create_task(host[0].serve()) if host is not None else None
        if host_task is not None:
            host_task.add_done_callback(self._host_ended)
        try:
            await asyncio.to_thread(self._watch, settings, port, started)
        finally:
            if host_task is not None:
                host_task.cancel()
                await asyncio.gather(host_task, return_exceptions=True)
                host[0].close()  # type: ignore[index]
        if self.failed and self.status == 0:
            return 1
        return self.status

    def _host_ended(self, task: asyncio.Task[None]) -> None:
        """The talker host stops only when cancelled; anything else strands every worker."""
        if task.cancelled() or self.stopping:
            return
        self.say(f"error: the talker host stopped: {task.exception()!r}; stopping the workers")
        self.failed = True
        self.stop_all()

    def _watch(self, settings: GatewaySettings, port: int, started: float) -> None:
        """Until every worker has exited (a thread: waits on pipes and process sentinels)."""
        alive = {proc.sentinel: proc for proc in self.procs}
        while alive:
            ready = multiprocessing.connection.wait([self.events, *alive], timeout=1.0)
            for item in ready:
                if item is self.events:
                    self._event(settings, port, started)
                elif isinstance(item, int) and item in alive:
                    self._exited(alive.pop(item))

    def _event(self, settings: GatewaySettings, port: int, started: float) -> None:
        try:
            kind, index = self.events.recv()
        except EOFError:
            return
        if kind == "ready":
            self.ready.add(index)
            if len(self.ready) == len(self.procs):
                host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
                self.say(f"ready in {time.perf_counter() - started:.1f}s")
                self.say(f"open http://{host}:{port}/  (WebSocket ws://{host}:{port}/v1/realtime)")

    def _exited(self, proc: Any) -> None:
        proc.join(5)  # its sentinel may fire a moment before it can be reaped
        code = proc.exitcode if proc.exitcode is not None else 1
        if self.stopping:
            if code not in (0, None) and self.status == 0 and code > 0:
                self.status = code
            return
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited ({code})"
        self.say(f"{proc.name} {how}: stopping the others")
        self.status = code if code > 0 else 1
        self.stop_all()


def _die_with_parent() -> None:
    """SIGTERM this process when the supervisor dies, however it dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _exit_before_serving(signum: int, frame: object) -> None:
    raise SystemExit(0)


def worker_main(
    plan: WorkerPlan, sock: socket.socket, events: multiprocessing.connection.Connection
) -> None:
    """A worker process: build the engine, serve on the shared and the private socket."""
    _die_with_parent()
    # A stop before serving begins (the engine still loading) ends the worker now;
    # once serving, the server's own handler takes over (gateway.serving.serve).
    signal.signal(SUPERVISOR_STOP_SIGNAL, _exit_before_serving)
    from gateway.logs import configure_server_logs
    from gateway.serving import build_engine, serve
    from realtime_engine.engines.base import EngineError

    args = plan.args
    configure_server_logs(args.log_level)
    settings = plan.settings
    prefix = f"worker {plan.index}: "

    def say(message: str) -> None:
        print(f"speech-gateway: {prefix}{message}", flush=True)

    try:
        engine = build_engine(
            plan.kind,
            args.model,
            args.device,
            plan.talker,
            args.codec_precision,
            args.codec_batch,
            args.codec_kernels,
            args.fake_options,
            talker_host=plan.talker_host,
        )
    except EngineError as e:
        say(f"error: {e}")
        sys.exit(2)
    private = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    private.bind(settings.worker_sockets[plan.index])
    private.listen(128)
    private.setblocking(False)

    def ready() -> None:
        events.send(("ready", plan.index))

    try:
        started = asyncio.run(
            serve(
                settings,
                engine,
                args.log_level,
                say=say,
                sockets=[sock, private],
                on_ready=ready,
            )
        )
    except KeyboardInterrupt:
        started = True
    sys.exit(0 if started else 1)
