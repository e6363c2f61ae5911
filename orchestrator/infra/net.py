"""Small loopback helpers shared by the services we start (MLflow) and the replicas (vLLM)."""

from __future__ import annotations

import ipaddress
import socket
import urllib.error
import urllib.request
from collections.abc import Iterable

import psutil


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now (the OS picks it; a tiny race with other binders remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if ``port`` can be bound now (nothing listens on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``url`` answers 200; any failure (refused, timeout, bad URL) means not healthy."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (loopback URL we built)
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


__all__ = ["free_port", "http_ok", "port_is_free"]


def non_loopback_listeners(procs: Iterable[psutil.Process]) -> list[str]:
    """``"<pid> <name> <address>:<port>"`` for every listening socket of ``procs`` that is not on loopback
    (IPv4-mapped ``::ffff:127.0.0.1`` counts as loopback). What a run must never open by default."""
    out = []
    for p in procs:
        try:
            conns, name = p.net_connections(kind="inet"), p.name()
        except psutil.Error:
            continue
        for c in conns:
            if c.status != psutil.CONN_LISTEN or not c.laddr:
                continue
            ip = ipaddress.ip_address(c.laddr.ip.split("%")[0])
            if not (getattr(ip, "ipv4_mapped", None) or ip).is_loopback:
                out.append(f"{p.pid} {name} {c.laddr.ip}:{c.laddr.port}")
    return sorted(set(out))
