"""A throwaway PostgreSQL server for the database sink's tests: Debian's ``postgresql`` binaries (``apt-get install
postgresql``), a cluster initialized in a temporary directory, on a free loopback port, removed afterwards."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

from onceflow.integration.brokers import free_port


def binaries() -> str | None:
    """The directory of initdb and pg_ctl, or None where PostgreSQL is not installed."""
    found = shutil.which("pg_ctl")
    if found:
        return os.path.dirname(os.path.realpath(found))
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return os.path.dirname(versions[-1]) if versions else None


def _as_server_user(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A running server's connection URL; raises RuntimeError saying why none could be started."""
    directory = binaries()
    if directory is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    workdir = tempfile.mkdtemp(prefix="onceflow-pg-")
    if os.geteuid() == 0:
        shutil.chown(workdir, "postgres", "postgres")
    data, port = os.path.join(workdir, "data"), free_port()
    run = lambda *args: subprocess.run(_as_server_user(list(args)), capture_output=True, text=True,  # noqa: E731
                                       timeout=120)
    try:
        done = run(f"{directory}/initdb", "-D", data, "-A", "trust", "-U", "postgres")
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr}")
        done = run(f"{directory}/pg_ctl", "-D", data, "-w", "-l", os.path.join(workdir, "log"), "-o",
                   f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {done.stderr}{done.stdout}")
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        run(f"{directory}/pg_ctl", "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(workdir, ignore_errors=True)
