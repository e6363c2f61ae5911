"""Small loopback helpers shared by the services we start (MLflow) and the replicas (vLLM)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


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
