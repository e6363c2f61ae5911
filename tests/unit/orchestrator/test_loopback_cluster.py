"""cluster-local.yaml and the loopback node it runs on: the configs Ray's launcher reads, and the node's `ray stop`.

Offline: Ray's own schema, bash's parser, and small real processes (``sleep``) standing in for a node's Ray and
for a process that is not the node's. The launcher itself runs in tests/integration/test_cluster_launcher.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from orchestrator.infra import loopback_cluster as lc

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
            "head_start_ray_commands", "worker_start_ray_commands")
pytestmark = pytest.mark.timeout(60)


def _rendered(folder: Path) -> dict:
    template = yaml.safe_load((ROOT / "cluster-local.yaml").read_text())
    return lc.render(template, cluster_name="cpu-starvation-local-test", user="someone", key=folder / "key",
                     proxy_command=f"{sys.executable} -m orchestrator.infra.loopback_cluster relay {folder}")


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-local.yaml"])
def test_every_command_of_the_launcher_configs_is_one_complete_shell_command(name: str):
    """YAML ends a plain scalar at ' #': a command that writes '... # marker' into ~/.bashrc must be quoted, or the
    launcher runs it cut short, mid-quote (cluster.yaml's did, and `ray up` failed in its setup)."""
    config = yaml.safe_load((ROOT / name).read_text())
    commands = [c for key in COMMANDS for c in config.get(key) or []]
    assert commands
    for command in commands:
        parsed = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        assert parsed.returncode == 0, f"{name}: {command!r}: {parsed.stderr}"
    markers = [c for c in commands if c.startswith("grep -q '# orchestrator")]
    assert markers and all(c.endswith(">> ~/.bashrc") for c in markers), markers


def test_the_rendered_local_config_passes_rays_own_checks(tmp_path: Path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = _rendered(tmp_path)
    prepared = prepare_config(config)  # what `ray up` does first: defaults, the local provider's one node type
    validate_config(prepared)
    assert prepared["provider"] == {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}
    assert config["auth"]["ssh_private_key"] == str(tmp_path / "key")


def test_render_fills_in_only_the_cluster_name_and_auth(tmp_path: Path):
    template = yaml.safe_load((ROOT / "cluster-local.yaml").read_text())
    config = _rendered(tmp_path)
    assert set(lc.FILLED) == {k for k in config if config[k] != template.get(k)}
    assert template["auth"] != config["auth"] and config["auth"]["ssh_user"] == "someone"


def test_the_start_commands_read_every_port_up_picks():
    """Each LOCAL_*_PORT that `up` exports is used by cluster-local.yaml, and no other one is read."""
    text = (ROOT / "cluster-local.yaml").read_text()
    config = yaml.safe_load(text)
    used = {word for c in config["head_start_ray_commands"] + config["head_setup_commands"]
            for word in __import__("re").findall(r"\$(LOCAL_[A-Z_]+_PORT)", c)}
    assert used == set(lc.PORTS)


def test_sshd_config_keeps_the_node_on_loopback_and_in_its_folder(tmp_path: Path):
    text = lc.sshd_config(tmp_path, 2222, "someone")
    lines = set(text.splitlines())
    assert {"Port 2222", "ListenAddress 127.0.0.1", "PasswordAuthentication no", "AllowUsers someone",
            f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}"} <= lines
    assert f"SetEnv HOME={tmp_path / 'home'} TMPDIR={tmp_path / 't'} {lc.MARKER}={tmp_path}" in lines


def test_the_node_ray_sends_stop_to_stop_node_and_the_rest_to_ray(tmp_path: Path):
    fake_ray = tmp_path / "real-ray"
    fake_ray.write_text("#!/bin/sh\necho real ray: \"$@\"\n")
    fake_ray.chmod(0o755)
    shim = tmp_path / "ray"
    shim.write_text(lc.ray_shim(Path(sys.executable), fake_ray, ROOT))
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != lc.MARKER}
    assert subprocess.run([shim, "status", "-v"], capture_output=True, text=True, env=env).stdout == "real ray: status -v\n"
    stop = subprocess.run([shim, "stop"], capture_output=True, text=True, env=env)
    assert stop.returncode == 2 and "not on a loopback node" in stop.stderr, stop  # no marker: stops nothing


def test_stop_node_ends_the_marked_processes_only(tmp_path: Path):
    marked = subprocess.Popen(["sleep", "60"], env={**os.environ, lc.MARKER: str(tmp_path)}, start_new_session=True)
    other_node = subprocess.Popen(["sleep", "60"], env={**os.environ, lc.MARKER: str(tmp_path / "other")},
                                  start_new_session=True)
    unmarked = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        # the caller carries the marker too (a node's SSH session): its own ancestry is spared
        stop = subprocess.run([sys.executable, "-m", "orchestrator.infra.loopback_cluster", "stop-node"],
                              env={**os.environ, "PYTHONPATH": str(ROOT), lc.MARKER: str(tmp_path)},
                              capture_output=True, text=True, timeout=30)
        assert stop.returncode == 0, stop.stderr
        assert marked.wait(timeout=10) == -15
        assert other_node.poll() is None and unmarked.poll() is None
        assert f"Stopped 1 processes of the loopback node {tmp_path}." in stop.stdout, stop.stdout
        assert psutil.Process().is_running()
    finally:
        for p in (marked, other_node, unmarked):
            p.kill()
            p.wait()


def test_relay_joins_stdin_and_stdout_to_the_nodes_port(tmp_path: Path):
    server = socket.create_server(("127.0.0.1", 0))
    (tmp_path / lc.STATE).write_text(f'{{"cluster_name": "c", "ssh_port": {server.getsockname()[1]}, '
                                     f'"ports": {{}}, "created_privsep_dir": false}}')
    relay = subprocess.Popen([sys.executable, "-m", "orchestrator.infra.loopback_cluster", "relay", str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        conn, _ = server.accept()
        assert relay.stdin is not None and relay.stdout is not None
        relay.stdin.write(b"SSH-2.0-client\r\n")
        relay.stdin.close()  # ssh done sending: the relay half-closes, the server still answers
        assert conn.recv(100) == b"SSH-2.0-client\r\n" and conn.recv(100) == b""
        conn.sendall(b"SSH-2.0-server\r\n")
        conn.close()
        assert relay.stdout.read() == b"SSH-2.0-server\r\n"
        assert relay.wait(timeout=10) == 0
    finally:
        relay.kill()
        server.close()


def test_up_refuses_a_folder_in_use_and_a_template_of_another_provider(tmp_path: Path):
    if not Path(lc.SSHD).exists() or not __import__("shutil").which("rsync"):
        pytest.skip("up checks for sshd and rsync first")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(lc.LoopbackError, match="not empty"):
        lc.up(tmp_path / "busy", ROOT / "cluster-local.yaml")
    with pytest.raises(lc.LoopbackError, match=r"cluster.yaml: provider.type must be 'local'"):
        lc.up(tmp_path / "new", ROOT / "cluster.yaml")
