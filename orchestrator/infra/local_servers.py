"""Local services for the embedded default: a Ray head and an MLflow tracking server.

Infrastructure settings come from the environment, never from a sweep spec:
``RAY_ADDRESS`` (connect instead of starting Ray) and ``MLFLOW_TRACKING_URI``
(use that server instead of starting one). Whatever this module starts, it
stops: every server runs in its own process group and is killed as a group.

Two guards for runs that end badly or overlap:

* **The server we talk to is the one we started.** A ``/health`` answer alone proves nothing: an
  orphan of an earlier run, or another run's server, may answer on the port while ours failed to
  bind. So the server counts as up only when ``/health`` answers *and* the kernel says the
  listening socket on that port belongs to our Popen's process tree (psutil
  ``net_connections``); no token has to travel through MLflow. If ours exits because someone
  else took the port, it is started again on a free port.
* **Nothing outlives the run.** The server is started under the watchdog of
  :mod:`orchestrator.infra.lifeline`: when the driver dies (even by SIGKILL, which runs no ``finally``)
  the watchdog ends the server's group. With ``record_in`` every process of the group is also
  written to ``services.json`` (:mod:`orchestrator.infra.survivors`), for the next run to reap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from orchestrator.infra import survivors
from orchestrator.infra.lifeline import Guardian, Lifeline
from orchestrator.infra.net import free_port, http_ok, port_is_free


class ServiceError(RuntimeError):
    pass


def kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group, wait, then SIGKILL it. Idempotent."""
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # reap stragglers of an exited leader
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=grace_s)


@dataclass
class MlflowServer:
    uri: str
    proc: subprocess.Popen | None  # None: an external server we did not start
    log_path: Path | None = None


def _mlflow_cmd(home: Path, host: str, port: int, *, sqlite: bool = True, workers: int = 1) -> list[str]:
    """The server's command. ``sqlite``: the backend is ``home``'s sqlite file; else it comes from the
    environment (``MLFLOW_BACKEND_STORE_URI``, which ``mlflow server`` reads): a database URI holds a
    password, and a command line is visible to every user of the machine."""
    backend = ["--backend-store-uri", f"sqlite:///{(home / 'mlflow.db').resolve()}"] if sqlite else []
    return [
        sys.executable, "-m", "mlflow", "server", *backend,
        "--artifacts-destination", str((home / "artifacts").resolve()),
        "--serve-artifacts", "--host", host, "--port", str(port), "--workers", str(workers),
    ]


def tree(pid: int) -> list[psutil.Process]:
    """The process ``pid`` and all its descendants ([] when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def still_running(procs: Iterable[psutil.Process]) -> list[str]:
    """``"<pid>: <command>"`` for each of ``procs`` still alive (a zombie is not; a recycled pid is not:
    psutil checks the start time)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid}: {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            continue
    return out


def listens_in_tree(pid: int, port: int) -> bool:
    """True when a process of ``pid``'s tree holds the listening TCP socket on ``port``."""
    for p in tree(pid):
        try:
            conns = p.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns):
            return True
    return False


def _wait_ours(proc: subprocess.Popen, uri: str, port: int, deadline: float, timeout_s: float,
               log_path: Path) -> bool:
    """Wait until OUR server answers on ``port``: True. False when ours exited and someone else holds the port."""
    while True:
        if proc.poll() is not None:
            if not port_is_free(port):
                return False
            raise ServiceError(f"MLflow server exited with {proc.returncode}; see {log_path}")
        if http_ok(f"{uri}/health") and listens_in_tree(proc.pid, port):
            return True
        if time.monotonic() > deadline:
            raise ServiceError(f"MLflow server not healthy after {timeout_s:.0f} s; see {log_path}")
        time.sleep(0.3)


@contextmanager
def mlflow_server(home: Path, *, port: int = 5000, timeout_s: float = 90.0, record_in: Path | None = None,
                  backend_uri: str | None = None, workers: int = 1) -> Iterator[MlflowServer]:
    """Use ``MLFLOW_TRACKING_URI`` if set; else start a server on 127.0.0.1 and stop it after.

    ``port`` is a preference: when something else holds it, a free port is used, and the yielded
    ``uri`` is always that of the server started here (see the module docstring). ``record_in``:
    the folder whose ``services.json`` records the server's processes while it runs.
    ``backend_uri``: the backend store (default: sqlite in ``home``; a cluster's is PostgreSQL, see
    ``mlflow/postgres.sh``); artifacts stay in ``home``. ``workers``: the server's worker processes.
    """
    external = os.environ.get("MLFLOW_TRACKING_URI")
    if external:
        yield MlflowServer(uri=external, proc=None)
        return
    home.mkdir(parents=True, exist_ok=True)
    log_path = home / "mlflow-server.log"
    # Job execution starts worker processes a sweep never uses; without them the server starts faster.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    if backend_uri:
        env["MLFLOW_BACKEND_STORE_URI"] = backend_uri
    deadline = time.monotonic() + timeout_s
    proc: subprocess.Popen | None = None
    line: Lifeline | None = None
    recorded: set[int] = set()
    try:
        for _ in range(3):  # a port taken between our check and the server's bind: try another
            if not port_is_free(port):
                port = free_port()
            line = Lifeline()
            cmd = _mlflow_cmd(home, "127.0.0.1", port, sqlite=not backend_uri, workers=workers)
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(line.wrap(cmd), stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, pass_fds=line.pass_fds,
                                        start_new_session=True, cwd=home, env=env)
            line.started()
            if record_in is not None and survivors.record(record_in, "mlflow", proc.pid):
                recorded.add(proc.pid)
            uri = f"http://127.0.0.1:{port}"
            if _wait_ours(proc, uri, port, deadline, timeout_s, log_path):
                break
            kill_group(proc)
            line.cut()
            port = free_port()
        else:
            raise ServiceError(f"MLflow server could not bind a port (3 tries); see {log_path}")
        if record_in is not None:  # the server and its workers, so a reap finds them if the leader is gone
            for p in tree(proc.pid)[1:]:
                if survivors.record(record_in, "mlflow", p.pid):
                    recorded.add(p.pid)
        yield MlflowServer(uri=uri, proc=proc, log_path=log_path)
    finally:
        if proc is not None:
            kill_group(proc)
        if line is not None:
            line.cut()
        if record_in is not None:  # nothing is recorded without it
            for pid in recorded:
                survivors.forget(record_in, pid)


def ui_command(home: Path, port: int = 5000) -> str:
    """The command a user runs to browse a local sweep's results afterwards."""
    exe = Path(sys.executable).parent / "orchestrator"  # the venv's script, even when it is not on PATH
    cmd = "orchestrator"
    if exe.exists():
        rel = os.path.relpath(exe)
        cmd = str(exe) if rel.startswith("..") else rel
    return f"{cmd} ui --home {home}  (then open http://127.0.0.1:{port})"


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _handlers() -> dict[int, Any]:
    return {sig: signal.getsignal(sig) for sig in _SIGNALS}


def _restore(saved: dict[int, Any]) -> None:
    """Put back the signal handlers ``ray.init`` replaced.

    ``ray.init`` makes SIGTERM call ``sys.exit(15)``, and its core worker adds a C++ failure
    handler (it prints ``*** SIGTERM received``) that ends the process with SIGABRT after our
    unwinding; ``signal.signal`` re-installs the caller's handler at the C level, over both.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, handler in saved.items():
        if handler is not None:
            signal.signal(sig, handler)


# Ray's own switch for a single-machine "cluster": the node's address is the loopback one, and every
# server Ray starts (GCS, raylet, object manager, core workers, dashboard and runtime-env agents)
# binds to it. Without it ``ray.init`` turns even ``_node_ip_address="127.0.0.1"`` into the host's
# external address, and its gRPC servers listen on every interface.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def ray_on_loopback() -> Iterator[None]:
    """While inside, a local Ray started here listens on 127.0.0.1 only (its processes inherit the
    setting). Put back afterwards: a later ``ray start --address`` from this process must still be
    able to join a multi-node cluster."""
    from ray._private import ray_constants  # heavy: Ray stays off the paths that use only the MLflow server

    saved_env, saved_flag = os.environ.get(LOOPBACK_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import time; ray may already be imported
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(LOOPBACK_ENV, None)
        else:
            os.environ[LOOPBACK_ENV] = saved_env


class _DropBanner(logging.Filter):
    """Drops Ray's notice that a new local cluster uses token authentication (Ray's default for a head it
    starts; ours listens on loopback only): a line on every run that asks nothing of the user. Ray's other
    auth messages (a missing or wrong token, auth disabled) still show."""

    LOGGER = "ray._private.authentication.authentication_token_setup"

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def _ray_processes() -> list[psutil.Process]:
    """The local Ray head ``ray.init`` started: our descendants in our own session (the servers we start
    ourselves, MLflow and the guardian, each have their own session)."""
    sid = os.getsid(0)
    out = []
    for p in tree(os.getpid())[1:]:
        try:
            if os.getsid(p.pid) == sid:
                out.append(p)
        except (ProcessLookupError, PermissionError):
            continue
    return out


def _hand_over(guardian: Guardian, handed: set[int], record_in: Path | None, recorded: list[int]) -> set[int]:
    """Hand the local Ray's processes not handed yet to ``guardian`` (and record them); the pids handed."""
    entries = [e for p in _ray_processes() if p.pid not in handed
               and (e := survivors.entry_of("ray", p.pid, group=False))]
    if entries:
        guardian.watch(entries)
    for e in entries:
        handed.add(e["pid"])
        if record_in is not None and survivors.record(record_in, "ray", e["pid"], group=False):
            recorded.append(e["pid"])
    return handed


def _hand_over_late(guardian: Guardian, handed: set[int], record_in: Path | None, recorded: list[int],
                    stop: threading.Event, every_s: float = 1.0, for_s: float = 60.0) -> None:
    """Hand over the Ray processes that appear in the first ``for_s`` seconds (its agents), every ``every_s``."""
    deadline = time.monotonic() + for_s
    while not stop.wait(every_s) and time.monotonic() < deadline:
        try:
            _hand_over(guardian, handed, record_in, recorded)
        except (OSError, ValueError):  # the guardian's pipe closed: the context is ending
            return


@contextmanager
def ray_cluster(num_cpus: int | None = None, *, record_in: Path | None = None) -> Iterator[dict]:
    """Connect to ``RAY_ADDRESS`` if set, else start a local Ray on loopback only; shut it down after.

    A local Ray's processes are handed to a :class:`~orchestrator.infra.lifeline.Guardian`, which ends what
    is left of them when this process dies (or after ``ray.shutdown()``, which leaves its agents
    behind for a while); with ``record_in`` they are also in ``services.json`` for the next run."""
    import ray  # heavy: Ray stays off the paths that use only the MLflow server (report, ui, provisioning)

    address = os.environ.get("RAY_ADDRESS")
    saved = _handlers()
    guardian: Guardian | None = None
    recorded: list[int] = []
    stop, watcher = threading.Event(), None
    loopback = ExitStack()
    try:
        if address:
            ctx = ray.init(address=address, log_to_driver=False)
        else:
            loopback.enter_context(ray_on_loopback())
            guardian = Guardian()
            # address="local": always a Ray of our own, never a cluster someone else's `ray start` left on
            # this machine (which a bare ray.init() would join).
            banner, drop = logging.getLogger(_DropBanner.LOGGER), _DropBanner()
            banner.addFilter(drop)
            try:
                ctx = ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
                               log_to_driver=False, configure_logging=False)
            finally:
                banner.removeFilter(drop)
            handed = _hand_over(guardian, set(), record_in, recorded)
            # The raylet starts its agents (dashboard, runtime env) on its own time, after ray.init returns on a
            # quick machine: what appears later is handed over too, else it outlives a SIGKILLed run.
            watcher = threading.Thread(target=_hand_over_late, args=(guardian, handed, record_in, recorded, stop),
                                       name="ray-guardian-feed", daemon=True)
            watcher.start()
    except BaseException:  # interrupted half-way: stop what it started
        _restore(saved)
        stop.set()
        ray.shutdown()
        if guardian is not None:
            guardian.close()
        loopback.close()
        raise
    _restore(saved)
    try:
        yield {"address": getattr(ctx, "address_info", {}).get("address", address or "local")}
    finally:
        stop.set()
        if watcher is not None:
            watcher.join(timeout=5)
        ray.shutdown()
        if guardian is not None:
            guardian.close()
        loopback.close()
        if record_in is not None:  # nothing is recorded without it
            for pid in recorded:
                survivors.forget(record_in, pid)


__all__ = ["MlflowServer", "ServiceError", "free_port", "kill_group", "listens_in_tree", "mlflow_server", "ray_cluster",
           "still_running", "tree", "ui_command"]
