"""A real PostgreSQL server for tests, from the distribution's binaries (Debian/Ubuntu:
/usr/lib/postgresql/<version>/bin, installed by scripts/install-system-deps.sh; elsewhere
`initdb` and `postgres` on PATH).

One throwaway cluster: `initdb` into a directory of its own, `postgres` listening on
127.0.0.1 and on a unix socket inside that directory, trust authentication (nothing else
can reach it), durability switched off (fsync, full-page writes: test data). PostgreSQL
refuses to run as root, so under root (CI containers) both run as the `postgres` account
the Debian package creates (or `nobody`), which must be able to reach the directory all the
time (the checkpointer opens global/pg_control by its absolute path): so not under pytest's
temp root, which is 0700 and which every pytest run of the same user resets to 0700 (seen: a
second session made a running server PANIC). `make_root()` makes it in the system temp dir.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

SUPERUSER = "automq"


class PostgresUnavailable(Exception):
    """No PostgreSQL binaries here, or no account to run them as."""


def find_binaries() -> Path:
    """The bin directory holding initdb and postgres (the newest Debian version first)."""
    versions = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if versions:
        return Path(versions[-1]).parent
    initdb = shutil.which("initdb")
    if initdb and shutil.which("postgres"):
        return Path(initdb).parent
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, postgres) not found in /usr/lib/postgresql/*/bin or on PATH: "
        "run scripts/install-system-deps.sh (Debian/Ubuntu: apt-get install postgresql)"
    )


def _run_as() -> pwd.struct_passwd | None:
    """The account the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresUnavailable("running as root and there is no 'postgres' or 'nobody' account to run PostgreSQL as")


def make_root(prefix: str) -> Path:
    """A fresh directory for one server, in the system temp dir; the caller removes it."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    account = _run_as()
    if account is not None:
        for parent in root.parents:
            if not parent.stat().st_mode & stat.S_IXOTH:
                shutil.rmtree(root)
                raise PostgresUnavailable(f"{parent} is not searchable by {account.pw_name!r}, who runs PostgreSQL")
    return root


class PostgresServer:
    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.bin = find_binaries()
        self.account = _run_as()
        self.data = root / "data"
        self.socket_dir = root / "socket"
        self.log = root / "postgres.log"
        self.process: subprocess.Popen | None = None

    def url(self, database: str = "postgres", driver: str = "psycopg", password: str = "") -> str:
        """A SQLAlchemy URL; driver "" gives the plain libpq form (postgresql://...). A
        password is accepted and ignored (trust authentication)."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        user = f"{SUPERUSER}:{password}" if password else SUPERUSER
        return f"{scheme}://{user}@127.0.0.1:{self.port}/{database}"

    def _popen_user(self) -> dict:
        if self.account is None:
            return {}
        return {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}

    def start(self, timeout: float = 60.0) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if self.account is not None:
            for p in (self.root, self.socket_dir):
                os.chown(p, self.account.pw_uid, self.account.pw_gid)
        initdb = subprocess.run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            **self._popen_user(),
        )
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed ({initdb.returncode}):\n{initdb.stdout}\n{initdb.stderr}")
        log = open(self.log, "ab")
        if self.account is not None:
            os.chown(self.log, self.account.pw_uid, self.account.pw_gid)
        self.process = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.socket_dir),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "shared_buffers=16MB",
                "-c",
                "max_connections=60",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of the test run is not its fast shutdown too
            **self._popen_user(),
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                self.execute("select 1")
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"postgres did not accept connections in {timeout}s ({exc}):\n{self.log_tail()}"
                    ) from exc
                time.sleep(0.2)

    def execute(self, sql: str, database: str = "postgres") -> list[tuple]:
        import psycopg

        with psycopg.connect(
            host=str(self.socket_dir), port=self.port, user=SUPERUSER, dbname=database, autocommit=True
        ) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    def create_database(self, prefix: str = "t") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self.execute(f'create database "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        try:
            self.execute(f'drop database if exists "{name}" with (force)')
        except Exception as exc:
            raise RuntimeError(f"drop database {name}: {exc}\nserver log:\n{self.log_tail()}") from exc

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)  # fast shutdown: ends sessions, checkpoints, exits
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()  # immediate; the cluster is thrown away anyway
            proc.wait(10)
