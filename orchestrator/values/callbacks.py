"""The observer protocol of a sweep, and the fan-out that keeps one observer's bug from killing it.

Tracking (MLflow) and reporting implement :class:`Callback`; the controller calls them through a
:class:`CallbackList`. Nothing here does I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol

from orchestrator.values.results import TrialResult
from orchestrator.values.trial import SweepPlan, TrialSpec

log = logging.getLogger(__name__)


class Callback(Protocol):
    """An observer of a sweep. Called by the controller, never on a request's hot path.

    Every hook is optional (the :class:`CallbackList` skips one a callback lacks). ``persist_result`` is
    called in the lane's own thread as soon as a trial's attempt has its result, before ``on_trial_result``
    is queued to the controller's writer thread: an observer that keeps results durably (the tracker's
    outbox) stores the result there, so a driver that dies with results still queued for the writer loses
    none. It must be quick and safe to call from many lanes at once, and must never wait for a remote
    service; ``on_trial_result`` follows for the same result, in the writer thread.
    """

    def on_sweep_start(self, plan: SweepPlan) -> None: ...
    def on_trial_start(self, trial: TrialSpec) -> None: ...
    def persist_result(self, trial: TrialSpec, result: TrialResult) -> None: ...
    def on_trial_result(self, trial: TrialSpec, result: TrialResult) -> None: ...
    def on_sweep_end(self, plan: SweepPlan, results: list[TrialResult]) -> None: ...


class CallbackList:
    """Fans every event out to several callbacks; one callback's exception is logged, never raised."""

    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self.callbacks = list(callbacks)

    def _fan(self, method: str, *args: Any) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, method, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 (an observer must never kill the sweep)
                log.exception("callback %s.%s failed", type(cb).__name__, method)

    def on_sweep_start(self, plan: SweepPlan) -> None:
        self._fan("on_sweep_start", plan)

    def on_trial_start(self, trial: TrialSpec) -> None:
        self._fan("on_trial_start", trial)

    def persist_result(self, trial: TrialSpec, result: TrialResult) -> None:
        """In the calling lane's thread: each callback that keeps results durably stores this one."""
        self._fan("persist_result", trial, result)

    def on_trial_result(self, trial: TrialSpec, result: TrialResult) -> None:
        self._fan("on_trial_result", trial, result)

    def on_sweep_end(self, plan: SweepPlan, results: list[TrialResult]) -> None:
        self._fan("on_sweep_end", plan, results)


__all__ = ["Callback", "CallbackList"]
