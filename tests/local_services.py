"""Throwaway services for a shared store on one machine, for the tests and ``bench/soak.py --servers 2``
(and to try several servers out): a PostgreSQL cluster in a temporary folder (Debian's ``postgresql``
binaries, run as the ``postgres`` user when started as root) and moto's S3 server (an S3-compatible
endpoint on loopback, reached through ``AWS_ENDPOINT_URL`` as by any AWS SDK; moto is a dev dependency).
Nothing here is used by a server itself, so it lives beside the tests and out of the package that ships
(bench scripts add this folder to their path)."""

from __future__ import annotations

import glob
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "chorus-test",
    "AWS_SECRET_ACCESS_KEY": "chorus-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    """A TCP port nobody listens on now on loopback: the kernel picks it for a socket bound to port 0."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's binaries (Debian keeps them out of PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[-3]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: bash scripts/system-packages.sh installs Debian's postgresql")
    return Path(found[-1]).parent


@contextmanager
def postgres_cluster() -> Iterator[str]:
    """A new PostgreSQL cluster in a temporary folder on a free loopback port; yields its server URL
    (user ``chorus``, trusted on loopback; ``/postgres`` is its maintenance database). Durability is off:
    the cluster lives for one test session."""
    binaries, port = postgres_bin(), free_port()
    folder = Path(tempfile.mkdtemp(prefix="chorus-pg-"))
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root
        os.chmod(folder, 0o755)
        shutil.chown(folder, "postgres", "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    data, log = folder / "data", folder / "server.log"

    def run(*command: str) -> None:
        subprocess.run([*as_postgres, *command], check=True, capture_output=True, timeout=120)

    try:
        run(str(binaries / "initdb"), "-D", str(data), "-U", "chorus", "-A", "trust", "--no-sync", "-E", "UTF8")
        options = (
            f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=200"
        )
        run(str(binaries / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start")
        try:
            yield f"postgresql://chorus@127.0.0.1:{port}"
        finally:
            run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def new_database(server_url: str) -> str:
    """A new empty database on ``server_url``; returns its URL."""
    import psycopg

    name = f"chorus_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{server_url}/postgres", autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return f"{server_url}/{name}"


@contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """moto's S3 server on a free loopback port, in a thread of this process; yields the environment that
    points any AWS SDK (s3fs's botocore included) at it. The caller sets it where it is needed."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", **S3_CREDENTIALS}
    finally:
        server.stop()


def new_bucket(environment: dict[str, str]) -> str:
    """A new bucket on the S3 server of ``environment``; returns its name."""
    import boto3

    name = f"chorus-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=environment["AWS_ENDPOINT_URL"],
        aws_access_key_id=environment["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
        region_name=environment["AWS_DEFAULT_REGION"],
    ).create_bucket(Bucket=name)
    return name
