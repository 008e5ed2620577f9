"""Prefect's API for the flow runs a command makes in this process.

With PREFECT_API_URL set, flow runs go to that server. Otherwise the command starts
Prefect's local (ephemeral) API server itself, the very instance Prefect would start
on the first flow run, so that it can

- say so at once: the server takes 10 s or more to start (45 s measured for a first run
  on a busy 2-core machine), and a silent terminal looks hung;
- stop it in a clean order: the events and logs this process still holds reach the
  server first, and the server gets the time it needs to shut down (Prefect's exit
  hook sends SIGTERM while those are still arriving and SIGKILLs after 5 s);
- stop everything at once on Ctrl-C. Prefect 3.9's flow engine swallows a
  KeyboardInterrupt raised after the flow function returned (the run is final by then:
  it is logged at debug level and the next flow run starts), and that window, the
  heartbeat thread's join and the final state's API calls, is most of a short run's
  wall time; one raised inside the flow function becomes a crash report of ~100
  lines. So SIGINT stops the server and exits with 130 from the signal handler;
- keep the server's own console out of the command's output: it writes to
  `$PREFECT_HOME/local-api.log` (its shutdown, cut short by Ctrl-C or not, can log a
  cancelled database flush with a traceback). `--verbose`/`--debug` keep it on the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import traceback
from collections.abc import Iterator

# Time the server gets to finish its shutdown (services, in-flight DB work) before SIGKILL, s.
SERVER_STOP_GRACE_S = 30.0
# On Ctrl-C the user waits for this, s.
INTERRUPT_STOP_GRACE_S = 3.0


def prefect_env(*, verbose: bool) -> None:
    """Settings for a command's local flow runs; call before anything imports Prefect."""
    # On a busy machine the server needs longer than the 20 s default to start.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # The server's telemetry would phone home (offline: log an error and contend for SQLite).
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if not verbose:
        # The command prints what matters; the runs' INFO lines stay in the Prefect UI.
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@contextlib.contextmanager
def prefect_api(command: str, *, verbose: bool = False, debug: bool = False) -> Iterator[None]:
    """Prefect's API for the flow runs made inside the block (see the module docstring).

    command: named in the progress and interrupt lines (`sla-planner <command>`).
    verbose/debug: keep Prefect's console log; otherwise a failed run is the one line the
        command prints (its logs and traceback still reach the API), not Prefect's report.
    """
    from prefect.settings import PREFECT_API_URL

    server = None

    def interrupt(signum, frame) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
        if debug:
            traceback.print_stack(frame, file=sys.stderr)
        if server is not None:
            _stop(server, grace_s=INTERRUPT_STOP_GRACE_S)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os.write(2, f"sla-planner {command}: interrupted\n".encode())
        os._exit(130)

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        if not (verbose or debug):
            _quiet_console()
        if not PREFECT_API_URL.value():
            from prefect.server.api.server import SubprocessASGIServer

            print(f"sla-planner {command}: starting Prefect's local API (10 s or more; a first run also creates its database) ...", file=sys.stderr, flush=True)
            server = SubprocessASGIServer()  # the instance Prefect's own clients use
            if verbose or debug:
                server.start()
            else:
                _start_logged(server, command=command)
        yield
    finally:
        try:
            _drain_client()
            if server is not None:
                _stop(server, grace_s=SERVER_STOP_GRACE_S)
        finally:
            signal.signal(signal.SIGINT, previous)


def _start_logged(server, *, command: str) -> None:
    """Start the server with its stderr on a log file under PREFECT_HOME (the child inherits fd 2 when spawned)."""
    from prefect.settings import PREFECT_HOME

    log_path = PREFECT_HOME.value() / "local-api.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(log_path, "ab") as log:
            os.dup2(log.fileno(), 2)
            try:
                server.start()
            finally:
                os.dup2(saved, 2)
    except Exception as exc:
        raise RuntimeError(f"sla-planner {command}: Prefect's local API did not start ({exc}); its log: {log_path}") from exc
    finally:
        os.close(saved)


def _quiet_console() -> None:
    """Prefect's console handler in this process only; the server keeps its own."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler):
            handler.setLevel(logging.CRITICAL + 1)


def _drain_client() -> None:
    """Send the events and logs this process still queues, and close their connections."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=SERVER_STOP_GRACE_S, at_exit=False)


def _stop(server, *, grace_s: float) -> None:
    """SIGTERM the server, wait up to grace_s for its shutdown, then SIGKILL; forget the instance."""
    import subprocess

    proc = server.server_process
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    server.stop()  # unregisters the instance (and would stop a process still running)
