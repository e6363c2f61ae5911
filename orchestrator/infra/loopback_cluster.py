"""A machine that Ray's cluster launcher reaches over SSH on 127.0.0.1: ``cluster-local.yaml`` runs on it.

Ray's launcher (``ray up``, ``ray submit``, ``ray attach``, ``ray down``) needs a node provider and SSH. Of the
providers Ray ships, two need no cloud. The fake multi-node provider (``fake_multinode``) cannot be brought up
with ``ray up``: it is an autoscaler that runs inside an existing ``RAY_FAKE_CLUSTER=1 ray start --head`` and
starts its "nodes" in-process, with no SSH, no file mounts and no setup commands; its ``ray up`` variant
(``fake_multinode_docker``) needs Docker. The on-premise provider (``type: local``) runs the launcher's whole
path: SSH to the head's address, rsync of the file mounts and the bootstrap config and key, the setup and
start commands, ``ray submit``'s rsync and remote command, ``ray down``'s ``ray stop`` over SSH. That is the
path a GPU cluster takes, so ``cluster-local.yaml`` uses it, with ``head_ip: 127.0.0.1``.

``up`` makes that machine in a folder of its own and ``down`` removes it:

- an ``sshd`` of its own on a free port of 127.0.0.1 (its own config and host key; only a throwaway key
  of the folder may log in, as the current user). The launcher has no SSH port setting: its
  ``auth.ssh_proxy_command`` is this module's ``relay``, which joins ssh's stdin/stdout to that port;
- the node's home: ``sshd`` sets ``HOME`` (and ``TMPDIR``) of every session to folders inside the folder
  (``SetEnv``), so ``~/.bashrc``, ``~/ray_bootstrap_key.pem`` and the synced project land there, never
  in the user's real home;
- ``folder/cluster-local.yaml``: the repository's ``cluster-local.yaml`` with this machine's SSH user, key,
  proxy command and a cluster name of its own filled in; everything else as written.

Why the node has its own ``ray stop``. ``ray down`` runs ``ray stop`` on every node, and ``ray stop`` ends
every Ray process it can see on the machine, found by name: other users' clusters too, where the "node" is
a shared machine. Ray offers no narrower stop (``ray stop`` takes no address). So every process of the
node carries a marker in its environment (``ORCH_LOOPBACK_NODE=<folder>``, set by ``sshd`` for each
session and inherited by Ray, MLflow, vLLM and the sweep's driver), and the node's ``~/bin/ray`` (first
on the sessions' PATH) turns ``ray stop`` into ``stop-node``: SIGTERM to the marker's holders, SIGKILL
to what is left after a grace period. Any other ``ray`` command goes to the real one. What a real
cloud does on ``ray down`` (the instance ends, and every process on it) is what ``stop-node`` does to the
node's processes, MLflow included.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import hashlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from orchestrator.infra.net import free_port

MARKER = "ORCH_LOOPBACK_NODE"
SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")  # Debian's sshd refuses to start without it (its systemd unit makes it)
STATE = "state.json"
# The ports the head's services listen on (127.0.0.1 only), picked free at `up` and exported in the node's
# ~/.bashrc: cluster-local.yaml's start commands read them. Another Ray on this machine may hold the defaults.
PORTS = ("LOCAL_GCS_PORT", "LOCAL_DASHBOARD_PORT", "LOCAL_CLIENT_PORT", "LOCAL_AGENT_HTTP_PORT",
         "LOCAL_AGENT_GRPC_PORT", "LOCAL_RUNTIME_ENV_PORT", "LOCAL_METRICS_PORT", "LOCAL_MLFLOW_PORT")
# What `up` fills in; the rest of cluster-local.yaml is used as written.
FILLED = ("cluster_name", "auth")


class LoopbackError(RuntimeError):
    pass


@dataclass(frozen=True)
class Node:
    """The machine made by :func:`up`, as recorded in ``folder/state.json``."""

    folder: Path
    cluster_name: str
    ssh_port: int
    ports: dict[str, int]
    created_privsep_dir: bool

    @property
    def home(self) -> Path:
        return self.folder / "home"

    @property
    def config(self) -> Path:
        return self.folder / "cluster-local.yaml"

    @property
    def key(self) -> Path:
        return self.folder / "key"

    @property
    def mlflow_uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['LOCAL_MLFLOW_PORT']}"

    @classmethod
    def load(cls, folder: Path) -> Node:
        try:
            raw = json.loads((folder / STATE).read_text())
        except (OSError, ValueError) as exc:
            raise LoopbackError(f"{folder / STATE}: not a loopback node's folder ({exc})") from exc
        return cls(folder=folder, cluster_name=raw["cluster_name"], ssh_port=raw["ssh_port"], ports=raw["ports"],
                   created_privsep_dir=raw["created_privsep_dir"])


def render(template: dict[str, Any], *, cluster_name: str, user: str, key: Path, proxy_command: str) -> dict[str, Any]:
    """``template`` (cluster-local.yaml) with this machine's cluster name and SSH settings (pure)."""
    out = dict(template)
    out["cluster_name"] = cluster_name
    out["auth"] = {"ssh_user": user, "ssh_private_key": str(key), "ssh_proxy_command": proxy_command}
    return out


def sshd_config(folder: Path, port: int, user: str) -> str:
    """The node's sshd: loopback only, the folder's key only, and each session's HOME, TMPDIR and marker."""
    return "\n".join([
        f"Port {port}",
        "ListenAddress 127.0.0.1",
        f"HostKey {folder / 'host_key'}",
        f"PidFile {folder / 'sshd.pid'}",
        f"AuthorizedKeysFile {folder / 'authorized_keys'}",
        f"AllowUsers {user}",
        "PermitRootLogin prohibit-password",  # key only, for CI, which runs as root
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",  # the folder is a mktemp folder, not a home with ssh's expected modes
        "PermitUserEnvironment no",
        "X11Forwarding no",
        "AllowTcpForwarding local",  # `ray attach -p`, `ray dashboard`
        "PrintMotd no",
        "PrintLastLog no",
        "MaxSessions 32",
        f"SetEnv HOME={folder / 'home'} TMPDIR={folder / 't'} {MARKER}={folder}",
        "",
    ])


def node_bashrc(node_bin: Path, python_bin: Path, ports: dict[str, int]) -> str:
    exports = " ".join(f"{k}={v}" for k, v in ports.items())
    return (f"# The loopback node's own settings (orchestrator.infra.loopback_cluster up): its `ray` first on PATH,\n"
            f"# then the Python environment that made it; the free ports its services listen on. sshd starts a\n"
            f"# session in the user's real home: start it in the node's, as on a machine of its own.\n"
            f'export PATH="{node_bin}:{python_bin}:$PATH"\n'
            f"export {exports}\n"
            f'cd "$HOME"\n')


def ray_shim(python: Path, ray: Path, package_root: Path) -> str:
    return (f"#!/bin/sh\n"
            f"# The loopback node's `ray`: `ray stop` ends this node's processes only (the real one ends every Ray\n"
            f"# process on the machine, by name); every other command is the real ray.\n"
            f'if [ "$1" = stop ]; then\n'
            f'  PYTHONPATH="{package_root}" exec "{python}" -m orchestrator.infra.loopback_cluster stop-node\n'
            f"fi\n"
            f'exec "{ray}" "$@"\n')


def up(folder: Path, template: Path, start_timeout_s: float = 20.0) -> Node:
    """Make the node in ``folder`` (created; must be empty or absent) and start its sshd."""
    if not Path(SSHD).exists():
        raise LoopbackError(f"{SSHD} not found: install openssh-server (Debian: apt-get install openssh-server)")
    if shutil.which("rsync") is None:
        raise LoopbackError("rsync not found: Ray's launcher copies files with it (Debian: apt-get install rsync)")
    try:
        spec = yaml.safe_load(template.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise LoopbackError(f"{template}: cannot read the cluster config ({exc})") from exc
    if not isinstance(spec, dict) or (spec.get("provider") or {}).get("type") != "local":
        raise LoopbackError(f"{template}: provider.type must be 'local' (Ray's on-premise provider)")
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        raise LoopbackError(f"{folder}: not empty; a loopback node needs a folder of its own")
    for sub in ("home", "home/bin", "t"):
        (folder / sub).mkdir()
    user = getpass.getuser()
    for name in ("host_key", "key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"loopback-node {name}",
                        "-f", str(folder / name)], check=True)
    shutil.copy(folder / "key.pub", folder / "authorized_keys")
    ssh_port = free_port()
    ports: dict[str, int] = {}
    while len(ports) < len(PORTS):
        if (p := free_port()) not in ports.values() and p != ssh_port:
            ports[PORTS[len(ports)]] = p
    cluster_name = f"cpu-starvation-local-{hashlib.sha256(str(folder).encode()).hexdigest()[:8]}"
    created = False
    if not PRIVSEP_DIR.exists() and os.geteuid() == 0:
        PRIVSEP_DIR.mkdir(mode=0o755)
        created = True
    node = Node(folder=folder, cluster_name=cluster_name, ssh_port=ssh_port, ports=ports, created_privsep_dir=created)
    (folder / STATE).write_text(json.dumps({"cluster_name": cluster_name, "ssh_port": ssh_port, "ports": ports,
                                            "created_privsep_dir": created}, indent=1))
    python = Path(sys.executable)
    shim = node.home / "bin" / "ray"
    shim.write_text(ray_shim(python, python.parent / "ray", Path(__file__).resolve().parents[2]))
    shim.chmod(0o755)
    (node.home / ".bashrc").write_text(node_bashrc(node.home / "bin", python.parent, ports))
    (folder / "sshd_config").write_text(sshd_config(folder, ssh_port, user))
    proxy = f"{python} -m orchestrator.infra.loopback_cluster relay {folder}"
    rendered = render(spec, cluster_name=cluster_name, user=user, key=node.key, proxy_command=proxy)
    node.config.write_text(f"# {template.name} for the loopback node in this folder "
                           f"(orchestrator.infra.loopback_cluster up)\n" + yaml.safe_dump(rendered, sort_keys=False))
    # sshd detaches by itself (no -D) and writes its PidFile: it outlives this command, as a machine's sshd does
    run = subprocess.run([SSHD, "-f", str(folder / "sshd_config"), "-E", str(folder / "sshd.log")],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise LoopbackError(f"sshd did not start ({run.returncode}): {run.stderr.strip() or _tail(folder / 'sshd.log')}")
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", ssh_port), timeout=1):
            return node
        time.sleep(0.1)
    raise LoopbackError(f"sshd is not listening on 127.0.0.1:{ssh_port} after {start_timeout_s:.0f} s: "
                        f"{_tail(folder / 'sshd.log')}")


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def relay(folder: Path) -> None:
    """ssh's ProxyCommand: this process's stdin/stdout joined to the node's sshd, until either side ends."""
    port = Node.load(folder).ssh_port
    sock = socket.create_connection(("127.0.0.1", port))
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "in")
    sel.register(sock, selectors.EVENT_READ, "sock")
    out = sys.stdout.fileno()
    while True:
        for key, _ in sel.select():
            if key.data == "in":
                data = os.read(sys.stdin.fileno(), 65536)
                if not data:
                    sel.unregister(sys.stdin.fileno())
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_WR)
                    continue
                sock.sendall(data)
            else:
                data = sock.recv(65536)
                if not data:
                    return
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]


def _environ(p: psutil.Process) -> dict[str, str]:
    try:
        return p.environ()
    except psutil.Error:
        return {}


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def node_processes(folder: Path, exclude: Iterable[int] = (), marked_only: bool = False) -> list[psutil.Process]:
    """The node's processes: those whose environment carries its marker (every process of its SSH sessions,
    Ray, MLflow, vLLM, the driver) and, unless ``marked_only``, those whose command line names its folder
    (its sshd, the launcher's ssh connections and their relays)."""
    skip = {os.getpid(), *exclude}
    mark = str(folder)
    found = []
    for p in psutil.process_iter():
        if p.pid in skip or not _alive(p):
            continue
        if _environ(p).get(MARKER) == mark or (not marked_only and mark in _cmdline(p)):
            found.append(p)
    return found


def describe(procs: Iterable[psutil.Process]) -> list[str]:
    """'pid command line' of each process (for messages)."""
    return [f"{p.pid} {_cmdline(p)[:160]}" for p in procs]


def _ancestors() -> set[int]:
    out = set()
    with contextlib.suppress(psutil.Error):
        out = {p.pid for p in psutil.Process().parents()}
    return out


def _alive(p: psutil.Process) -> bool:
    """Running and not a zombie: a process that has exited but whose parent (not us) has not reaped it yet
    holds nothing; psutil counts it as running."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until each of ``procs`` has ended or ``timeout_s`` passed; the ones still alive."""
    deadline = time.monotonic() + timeout_s
    alive = procs
    while True:
        with contextlib.suppress(psutil.Error):
            psutil.wait_procs([p for p in alive if p.ppid() == os.getpid()], timeout=0)  # reap our own children
        alive = [p for p in alive if _alive(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


def _end(procs: list[psutil.Process], grace_s: float) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """SIGTERM ``procs``, wait ``grace_s``, SIGKILL the rest; (ended by SIGTERM, needed SIGKILL)."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    alive = _wait(procs, grace_s)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    _wait(alive, 5)
    return [p for p in procs if p not in alive], alive


def stop_node(grace_s: float = 10.0) -> int:
    """``ray stop`` on the node: end every process that carries this node's marker but this command's own
    ancestry (the SSH session that runs it). New processes forked meanwhile are caught by further rounds."""
    folder = os.environ.get(MARKER)
    if not folder:
        print(f"stop-node: {MARKER} is not set: not on a loopback node; nothing is stopped by name", file=sys.stderr)
        return 2
    mine = _ancestors()
    stopped, killed = 0, []
    for _ in range(5):
        procs = [p for p in psutil.process_iter() if p.pid not in mine and p.pid != os.getpid()
                 and _alive(p) and _environ(p).get(MARKER) == folder]
        if not procs:
            break
        names = {p.pid: _cmdline(p)[:80] for p in procs}
        gone, alive = _end(procs, grace_s)
        stopped += len(gone)
        killed += [f"{p.pid} {names[p.pid]}" for p in alive]
    print(f"Stopped {stopped + len(killed)} processes of the loopback node {folder}"
          + (f"; SIGKILL after {grace_s:.0f} s: {'; '.join(killed)}" if killed else "") + ".")
    return 0


def control_dir(cluster_name: str, user: str | None = None) -> Path:
    """Where Ray's launcher keeps its ssh ControlMaster sockets for this cluster (ray's command_runner)."""
    user_hash = hashlib.sha256((user or getpass.getuser()).encode()).hexdigest()[:10]
    return Path("/tmp") / f"ray_ssh_{user_hash}" / hashlib.sha256(cluster_name.encode()).hexdigest()[:10]


def launcher_files(node: Node) -> list[Path]:
    """What the launcher (``ray up``/``submit``/``down``) left on this side for the node's cluster: the local
    provider's state and lock, the cached resolved configs that name the folder, the ssh control folder."""
    # the provider state under Ray's temp dir, the config cache under Python's: they may differ
    tmp = Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp")
    out = [p for p in (tmp / "ray" / f"cluster-{node.cluster_name}.state",
                       tmp / "ray" / f"cluster-{node.cluster_name}.lock") if p.exists()]
    for p in Path(tempfile.gettempdir()).glob("ray-config-*"):
        with contextlib.suppress(OSError):
            if str(node.folder) in p.read_text(errors="replace"):
                out.append(p)
    if control_dir(node.cluster_name).exists():
        out.append(control_dir(node.cluster_name))
    return out


def down(folder: Path, grace_s: float = 15.0) -> list[str]:
    """Remove the node: its processes (what ``ray down`` left), its sshd, the launcher's ssh connections and
    files for it, the folder. Returns what was still running before this ('pid command')."""
    folder = folder.resolve()
    node = Node.load(folder)
    left = describe(p for p in node_processes(folder) if "sshd" not in p.name())  # its sshd runs until here
    cdir = control_dir(node.cluster_name)
    for sock in cdir.glob("*") if cdir.exists() else []:
        subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "loopback-node"], capture_output=True,
                       timeout=10, check=False)
    for _ in range(3):
        procs = node_processes(folder, exclude=_ancestors())
        if not procs:
            break
        _end(procs, grace_s)
    for path in launcher_files(node):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            with contextlib.suppress(OSError):
                path.parent.rmdir()  # /tmp/ray_ssh_<user>, when no other cluster's connections are in it
        else:
            path.unlink(missing_ok=True)
    if node.created_privsep_dir:
        with contextlib.suppress(OSError):
            PRIVSEP_DIR.rmdir()
    shutil.rmtree(folder, ignore_errors=True)
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.infra.loopback_cluster",
                                     description="A Ray launcher node on 127.0.0.1 over SSH (cluster-local.yaml).")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="make the node in FOLDER, start its sshd, write FOLDER/cluster-local.yaml")
    p_up.add_argument("folder", type=Path)
    p_up.add_argument("--config", type=Path, default=Path("cluster-local.yaml"), help="the template (default: %(default)s)")
    p_down = sub.add_parser("down", help="end what is left of the node in FOLDER and remove it")
    p_down.add_argument("folder", type=Path)
    p_relay = sub.add_parser("relay", help="ssh ProxyCommand: stdin/stdout to the node's sshd")
    p_relay.add_argument("folder", type=Path)
    sub.add_parser("stop-node", help="the node's `ray stop`: end this node's processes only")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            node = up(args.folder, args.config)
            print(f"loopback node: sshd on 127.0.0.1:{node.ssh_port}, config {node.config}, "
                  f"MLflow will be {node.mlflow_uri}")
        elif args.cmd == "down":
            left = down(args.folder)
            print("loopback node removed" + (f"; it still ran: {'; '.join(left)}" if left else ""))
        elif args.cmd == "relay":
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            relay(args.folder)
        else:
            return stop_node()
    except LoopbackError as exc:
        print(f"loopback_cluster: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
