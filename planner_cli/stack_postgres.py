"""PostgreSQL under the local stack's Prefect server: Debian's postgresql binaries, a cluster in the state folder.

`sla-planner stack up --prefect-db postgres` creates a cluster in `<state>/postgres-data` (initdb, a
generated password, scram-sha-256), starts `postgres` on 127.0.0.1 at a free port, with its socket in
the state folder, creates the `prefect` database and points the Prefect server at it
(PREFECT_API_DATABASE_CONNECTION_URL, driver asyncpg). PostgreSQL refuses to run as root, so as root
the stack runs it as the `postgres` system user Debian's package creates (setpriv, which execs it in
place, so the stack's process-group stop reaches it).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

from planner_cli.stack_processes import StackError

POSTGRES_ROOT = Path("/usr/lib/postgresql")
DB_USER = "prefect"
DB_NAME = "prefect"
# The OS user PostgreSQL runs as when the stack runs as root (Debian's postgresql package creates it).
SYSTEM_USER = "postgres"


def bin_dir() -> Path:
    """The newest installed major version's bin folder; StackError naming what is missing."""
    versions = sorted((p for p in POSTGRES_ROOT.glob("*/bin") if (p / "postgres").is_file()),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if not versions:
        raise StackError(f"--prefect-db postgres: PostgreSQL is not installed ({POSTGRES_ROOT}/<version>/bin/postgres "
                         "not found): apt-get install postgresql")
    return versions[-1]


def check_driver() -> None:
    """Prefect reaches PostgreSQL through asyncpg; StackError when the environment lacks it."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        raise StackError("--prefect-db postgres: the Python package asyncpg is not installed in this environment "
                         "(Prefect's PostgreSQL driver): uv pip install asyncpg") from None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_postgres_user(argv: list[str]) -> list[str]:
    """argv run as the postgres system user when we are root (PostgreSQL refuses root), else as is."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", f"--reuid={SYSTEM_USER}", f"--regid={SYSTEM_USER}", "--init-groups", "--", *argv]


def init_cluster(base: Path) -> str:
    """A new cluster in base/postgres-data with user `prefect` and a generated password; returns the password.

    The password file is kept (mode 0600) beside the cluster: the stack reads it when it starts the server.
    """
    data = base / "postgres-data"
    password = secrets.token_urlsafe(24)
    pwfile = base / "postgres-password"
    pwfile.write_text(password)
    pwfile.chmod(0o600)
    if os.geteuid() == 0:
        closed = [str(p) for p in base.resolve().parents if not os.stat(p).st_mode & 0o001]
        if closed:
            raise StackError(f"--prefect-db postgres: the {SYSTEM_USER} user cannot reach {base}: {closed[0]} is not "
                             "searchable by others (chmod o+x it, or use a state folder elsewhere)")
        data.mkdir(mode=0o700)
        shutil.chown(data, SYSTEM_USER, SYSTEM_USER)
        # initdb, run as postgres, reads the password file: hand it a copy it can read, removed after.
        init_pw = base / "postgres-initdb-password"
        init_pw.write_text(password)
        shutil.chown(init_pw, SYSTEM_USER, SYSTEM_USER)
    else:
        init_pw = pwfile
    argv = [str(bin_dir() / "initdb"), "-D", str(data), "-U", DB_USER, f"--pwfile={init_pw}",
            "--auth=scram-sha-256", "-E", "UTF8", "--no-locale"]
    done = subprocess.run(_as_postgres_user(argv), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=120)
    if init_pw != pwfile:
        init_pw.unlink(missing_ok=True)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        raise StackError(f"--prefect-db postgres: initdb {data} failed (exit {done.returncode}): {last[0]}")
    return password


def server_argv(base: Path, *, port: int) -> list[str]:
    """`postgres` on 127.0.0.1:port, its Unix socket in the cluster's folder (no system-wide /run dir needed)."""
    data = base / "postgres-data"
    return _as_postgres_user([str(bin_dir() / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port),
                              "-k", str(data), "-c", "max_connections=200"])


def database_url(base: Path, *, port: int) -> str:
    """Prefect's connection URL (asyncpg) with the cluster's password."""
    password = (base / "postgres-password").read_text().strip()
    return f"postgresql+asyncpg://{DB_USER}:{password}@127.0.0.1:{port}/{DB_NAME}"


def wait_ready_and_create_db(base: Path, *, port: int, timeout_s: float, alive) -> None:
    """Wait until the server accepts connections, then create the prefect database (once).

    alive: raises StackError when the server process exited (the caller knows its pid).
    """
    env = {**os.environ, "PGPASSWORD": (base / "postgres-password").read_text().strip()}
    common = ["-h", "127.0.0.1", "-p", str(port), "-U", DB_USER]
    deadline = time.monotonic() + timeout_s
    while True:
        alive()
        ready = subprocess.run([str(bin_dir() / "pg_isready"), *common, "-d", "postgres"], capture_output=True,
                               env=env, stdin=subprocess.DEVNULL, timeout=30)
        if ready.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise StackError(f"postgres did not accept connections on 127.0.0.1:{port} within {timeout_s:g} s")
        time.sleep(0.2)
    done = subprocess.run([str(bin_dir() / "createdb"), *common, DB_NAME], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=60)
    if done.returncode != 0 and "already exists" not in done.stderr:
        raise StackError(f"postgres: createdb {DB_NAME} failed (exit {done.returncode}): {done.stderr.strip()}")


class PostgresServer:
    """A throwaway cluster outside the stack (benchmarks): init, start, URL, stop."""

    def __init__(self, base: Path):
        self.base = base
        self.base.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, SYSTEM_USER, SYSTEM_USER)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def database_url(self) -> str:
        return database_url(self.base, port=self.port)

    def start(self, *, timeout_s: float = 60.0) -> None:
        check_driver()
        init_cluster(self.base)
        log = (self.base / "postgres.log").open("ab")
        self.proc = subprocess.Popen(server_argv(self.base, port=self.port), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

        def alive() -> None:
            if self.proc.poll() is not None:
                raise StackError(f"postgres exited with code {self.proc.returncode}; log {self.base / 'postgres.log'}")

        wait_ready_and_create_db(self.base, port=self.port, timeout_s=timeout_s, alive=alive)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: PostgreSQL's smart shutdown
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
