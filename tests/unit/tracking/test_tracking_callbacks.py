"""Unit tests of orchestrator.observe.tracking's callback fan-out and health check (no MLflow server)."""

from __future__ import annotations

import logging
import socket

import pytest

from orchestrator.observe.tracking import CallbackList, mlflow_server_ok


class _Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_sweep_start(self, plan): self.events.append("sweep_start")
    def on_trial_start(self, trial): self.events.append("trial_start")
    def persist_result(self, trial, result): self.events.append("persist")
    def on_trial_result(self, trial, result): self.events.append("trial_result")
    def on_sweep_end(self, plan, results): self.events.append("sweep_end")


class _Broken(_Recorder):
    def persist_result(self, trial, result):
        raise OSError("disk full")

    def on_trial_result(self, trial, result):
        raise RuntimeError("tracking exploded")


class _Partial:
    """Implements only one hook: the others are skipped."""

    def __init__(self) -> None:
        self.ended = False

    def on_sweep_end(self, plan, results): self.ended = True


def test_callback_list_isolates_failures(caplog: pytest.LogCaptureFixture):
    first, broken, last, partial = _Recorder(), _Broken(), _Recorder(), _Partial()
    cbs = CallbackList([first, broken, last, partial])
    with caplog.at_level(logging.ERROR, logger="orchestrator.observe.tracking"):
        cbs.on_sweep_start(None)
        cbs.on_trial_start(None)
        cbs.persist_result(None, None)
        cbs.on_trial_result(None, None)
        cbs.on_sweep_end(None, [])
    assert first.events == last.events == ["sweep_start", "trial_start", "persist", "trial_result", "sweep_end"]
    assert broken.events == ["sweep_start", "trial_start", "sweep_end"]
    assert partial.ended  # a callback without persist_result (or the others) is skipped for them
    assert "_Broken.on_trial_result failed" in caplog.text and "tracking exploded" in caplog.text
    assert "_Broken.persist_result failed" in caplog.text and "disk full" in caplog.text


def test_mlflow_server_ok_false_on_closed_port_and_true_for_local_stores():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert mlflow_server_ok(f"http://127.0.0.1:{port}", timeout_s=1) is False
    assert mlflow_server_ok("sqlite:///tmp/x.db") is True
