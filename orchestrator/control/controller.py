"""SweepController: runs a plan through an executor, applying retries and resume, several trials at once.

It imports no Ray: the executor is injected (anything with ``execute(trial) -> TrialResult``),
and so are the observers. Retry policy lives here and only here: a retryable failure (node
lost, server died, startup timeout) is run again up to ``max_failures`` times; a config error
never is.

**Concurrency.** The plan is cut into *chains* (:func:`orchestrator.plan.expand.chains`): trials that
must run one after another on one replica (a repin group, the windows of a shared start) form
one chain, every other trial is a chain of its own. Up to ``max_concurrent`` lanes run chains
side by side, each on its own thread with its own executor lane (``executor.lane()``: its own
warm replica, its own node). How many trials the cluster can hold at once is the executor's to
say (``executor.capacity(trials)``); the controller takes the smaller of that and the cap. An
executor without lanes (a test's fake) runs one trial at a time, as before; trials finish in
any order.

**The writer.** Writing a result (the tracker's outbox parquet, an MLflow child run with its
params, metrics and artifacts) takes 0.3-0.6 s, seconds with big artifacts. So a lane does not
call the observers itself: ``on_trial_start``, ``on_trial_result`` and the progress callback are
queued to one writer thread (``sweep-writer``), and the lane goes on at once to its next trial;
the next trial's replica starts while the last one's results are written. One thread, fed in
FIFO order, so observers never run concurrently and each trial's start comes before its result.
The progress callback gets a snapshot of the :class:`Trial` as it was when the event was queued.
``on_sweep_start`` is called before the writer starts; ``on_sweep_end`` is queued last, so it
runs once every queued result is written, and ``run()`` returns (or raises) only after the
writer has ended. An observer that raises is logged by the :class:`CallbackList` and the writer
goes on. Retry decisions are the lane's, from the :class:`TrialResult` alone; they never wait for
the writer. ``write_s`` (seconds per ``on_trial_result``) and ``write_wait_s`` (how long
``on_sweep_end`` waited for the queue to drain) say what the writing cost.

**Phases.** What a running trial is doing (:data:`Phase`: placing, starting, warm-up, window, ...)
is told to ``on_phase(trial_id, phase)``, for a live display: the executor tells it from its lanes
(``executor.on_phase``), the writer tells ``writing``. :func:`notify_phase` makes every such call:
a display that raises is logged and never fails a trial.

An interrupt (Ctrl-C, or SIGTERM turned into one by the cli) still ends the sweep for the
observers: the lanes are told to stop (``executor.cancel()`` ends what is in flight), the
writer writes what is queued (nothing measured is lost), then ``on_sweep_end`` gets the results
so far, then the interrupt goes on unwinding. A second interrupt while the writer drains leaves
``run()`` at once; the writer (not a daemon) still finishes its queue, ``on_sweep_end`` included,
before the process exits. A tracker tells an interrupted sweep from a complete one by the
trials that have no result.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from queue import SimpleQueue
from typing import Any, Callable, Iterable, Literal, Protocol

from orchestrator.values.callbacks import Callback, CallbackList
from orchestrator.values.trial import SweepPlan, TrialSpec
from orchestrator.plan.expand import chains
from orchestrator.values.results import ErrorKind, TrialResult
from orchestrator.control.trial import Trial, TrialState

log = logging.getLogger(__name__)


# What a running trial is doing, in order (a shared start has no placing or starting of its own; repin
# re-pins instead of starting). The executor's lease events map to them (ray_executor); ``writing`` is the writer's.
Phase = Literal["placing", "starting", "repinning", "warmup", "window", "crosscheck", "stopping", "writing"]
PhaseHook = Callable[[str, Phase], None]


def notify_phase(hook: PhaseHook | None, trial_id: str, phase: Phase) -> None:
    """Tell ``hook`` that trial ``trial_id`` entered ``phase``; what the hook raises is logged, never raised."""
    if hook is None:
        return
    try:
        hook(trial_id, phase)
    except Exception:  # noqa: BLE001 - a display bug must not fail a trial
        log.exception("phase callback failed for trial %s (%s)", trial_id, phase)


class Lane(Protocol):
    def execute(self, trial: TrialSpec, *, attempt: int = 1) -> TrialResult:
        """Run one attempt (1, 2, ... for retries) of ``trial``; each attempt keeps its own artifacts."""
        ...


class Executor(Lane, Protocol):
    """Runs trials. Optional, for concurrency: ``lane()`` (a new :class:`Lane` with ``close()``),
    ``capacity(trials) -> int`` (trials the cluster can hold at once), ``cancel()``; for a display,
    ``on_phase`` (a :data:`PhaseHook` the caller sets)."""


WRITER_THREAD = "sweep-writer"


class _Writer:
    """One thread that makes the calls submitted to it, one at a time, in the order submitted.

    ``close()`` lets it end once it has made every call submitted before; a call submitted after
    that (a lane still running when an interrupted sweep gave up waiting for it) is made in the
    caller's thread once the writer has ended, so it is neither lost nor concurrent with another.
    """

    def __init__(self, name: str = WRITER_THREAD) -> None:
        self._queue: SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = SimpleQueue()
        self._lock = threading.Lock()  # submit against close: nothing is queued behind the end
        self._late = threading.Lock()  # calls after close, one at a time
        self._closed = False
        # Not a daemon: if run() is left before the join (a second Ctrl-C), what is queued is still written.
        self._thread = threading.Thread(target=self._main, name=name, daemon=False)
        self._thread.start()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if not self._closed:
                self._queue.put((fn, args))
                return
        log.warning("%s: a call came after the sweep's writer closed; making it in thread %s",
                    getattr(fn, "__name__", fn), threading.current_thread().name)
        self._thread.join()
        with self._late:
            self._call(fn, args)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)

    def pending(self) -> int:
        return self._queue.qsize()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _main(self) -> None:
        while (item := self._queue.get()) is not None:
            self._call(*item)

    @staticmethod
    def _call(fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        # CallbackList and _call_progress already log and swallow an observer's Exception; this
        # catches only what gets past them (a BaseException such as SystemExit, or a bug here),
        # so the writer never dies with results still queued.
        try:
            fn(*args)
        except KeyboardInterrupt:  # only the main thread gets one (a late call made there): let it unwind
            raise
        except BaseException:  # noqa: BLE001
            log.exception("sweep writer: %s raised; going on", getattr(fn, "__name__", fn))


class SweepController:
    """Drive every trial of ``plan`` to a final state; never raises for a failed trial."""

    def __init__(self, plan: SweepPlan, executor: Executor, *, observers: Iterable[Callback] = (),
                 finished: Callable[[], set[str]] = set, max_failures: int | None = None,
                 max_concurrent: int | None = None,
                 on_progress: Callable[[Trial, TrialSpec, TrialResult | None], None] | None = None,
                 on_phase: PhaseHook | None = None) -> None:
        self.plan = plan
        self.executor = executor
        self.observers = CallbackList(observers)
        self.finished = finished
        self.max_failures = plan.spec.max_failures if max_failures is None else max_failures
        self.max_concurrent = plan.spec.max_concurrent_trials if max_concurrent is None else max_concurrent
        self.on_progress = on_progress or (lambda *_: None)
        self.on_phase = on_phase  # told "writing" when the writer takes a trial's result
        self.trials = {t.trial_id: Trial(t.trial_id) for t in plan.trials}
        self.lanes_used = 0
        self.write_s: list[float] = []  # seconds per on_trial_result call (all observers), in the writer
        self.write_wait_s = 0.0  # seconds on_sweep_end waited for the queued writes to drain
        self._writer: _Writer | None = None
        self._stop = threading.Event()

    # ------------------------------------------------------------------ the sweep
    def run(self) -> list[TrialResult]:
        self.observers.on_sweep_start(self.plan)
        results: list[TrialResult] = []
        self.write_s, self.write_wait_s = [], 0.0
        self._writer = _Writer()
        try:
            try:
                done_before = self.finished()
                todo = []
                for spec in self.plan.trials:
                    if spec.trial_id in done_before:
                        self.trials[spec.trial_id].transition(TrialState.SKIPPED)
                        self._progress(self.trials[spec.trial_id], spec, None)
                    else:
                        todo.append(spec)
                groups = chains(todo)
                lanes = self._lanes(todo, len(groups))
                self.lanes_used = lanes
                if lanes <= 1:
                    for spec in todo:
                        results.append(self._run_one(self.trials[spec.trial_id], spec, self.executor))
                else:
                    self._run_lanes(groups, lanes, results)
            except KeyboardInterrupt:
                log.warning("sweep %s interrupted after %d result(s)", self.plan.spec.name, len(results))
                self._end_sweep(results)
                raise
            self._end_sweep(results)
        finally:  # every path: the writer writes what is queued (the end too, if queued), then ends
            self._drain()
        return results

    def _end_sweep(self, results: list[TrialResult]) -> None:
        """Queue ``on_sweep_end`` behind every write, with the results as they are now."""
        queued = time.monotonic()
        final = list(results)

        def sweep_end() -> None:
            self.write_wait_s = time.monotonic() - queued
            self.observers.on_sweep_end(self.plan, final)

        self._submit(sweep_end)

    def _drain(self) -> None:
        writer = self._writer
        if writer is None:
            return
        writer.close()
        try:
            while writer.alive():
                writer.join(timeout=0.5)  # short waits, so Ctrl-C (SIGINT to the main thread) lands here
        except KeyboardInterrupt:
            log.warning("sweep %s: interrupted while writing results; about %d call(s) still queued are "
                        "written in the background before the process exits", self.plan.spec.name,
                        writer.pending())
            raise

    def _lanes(self, todo: list[TrialSpec], groups: int) -> int:
        if not hasattr(self.executor, "lane") or groups <= 1:
            return 1
        bounds = [groups]
        if self.max_concurrent is not None:
            bounds.append(self.max_concurrent)
        capacity = getattr(self.executor, "capacity", None)
        if capacity is not None:
            bounds.append(capacity(todo))
        return max(1, min(bounds))

    def _run_lanes(self, groups: list[list[TrialSpec]], lanes: int, results: list[TrialResult]) -> None:
        queue = deque(groups)
        take = threading.Lock()

        def lane_main() -> None:
            lane = self.executor.lane()
            try:
                while not self._stop.is_set():
                    with take:
                        if not queue:
                            return
                        chain = queue.popleft()
                    for spec in chain:
                        if self._stop.is_set():
                            return
                        result = self._run_one(self.trials[spec.trial_id], spec, lane)
                        with take:
                            results.append(result)
            finally:
                close = getattr(lane, "close", None)
                if close is not None:
                    close()

        threads = [threading.Thread(target=lane_main, name=f"lane-{i}", daemon=True) for i in range(lanes)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)  # short waits, so Ctrl-C (SIGINT to the main thread) lands here
        except KeyboardInterrupt:
            self._stop.set()
            cancel = getattr(self.executor, "cancel", None)
            if cancel is not None:
                cancel()
            for t in threads:
                t.join(timeout=30)
            raise
        # A lane that died (a bug) leaves trials without a final state: each gets one, and says why.
        for spec in (s for chain in groups for s in chain):
            trial = self.trials[spec.trial_id]
            if not trial.done:
                result = TrialResult.failed(spec.trial_id, ErrorKind.INTERNAL, "its lane ended before it finished")
                trial.transition(TrialState.FAILED)
                self._result(trial, spec, result)
                results.append(result)

    # ------------------------------------------------------------------ one trial
    def _run_one(self, trial: Trial, spec: TrialSpec, lane: Lane) -> TrialResult:
        while True:
            trial.transition(TrialState.RUNNING)
            self._start(trial, spec)
            try:
                result = lane.execute(spec, attempt=trial.attempts)
            except Exception as exc:  # an executor bug is still data
                log.exception("executor raised for trial %s", spec.trial_id)
                result = TrialResult.failed(spec.trial_id, ErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}")
            if result.ok:
                trial.transition(TrialState.COMPLETED)
            elif result.error_kind.retryable and trial.attempts <= self.max_failures and not self._stop.is_set():
                trial.transition(TrialState.RETRYING)
            else:
                trial.transition(TrialState.FAILED)
            self._result(trial, spec, result)
            if trial.done:
                return result

    # ------------------------------------------------------------------ to the writer
    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._writer is not None, "observer calls are made inside run()"
        self._writer.submit(fn, *args)

    def _start(self, trial: Trial, spec: TrialSpec) -> None:
        snap = _snapshot(trial)

        def trial_start() -> None:
            self._call_progress(snap, spec, None)
            self.observers.on_trial_start(spec)

        self._submit(trial_start)

    def _result(self, trial: Trial, spec: TrialSpec, result: TrialResult) -> None:
        snap = _snapshot(trial)

        def trial_result() -> None:
            if snap.done:  # a retry's next attempt is already placing on its lane: not shown as writing
                notify_phase(self.on_phase, spec.trial_id, "writing")
            t0 = time.monotonic()
            self.observers.on_trial_result(spec, result)
            self.write_s.append(time.monotonic() - t0)
            self._call_progress(snap, spec, result)

        self._submit(trial_result)

    def _progress(self, trial: Trial, spec: TrialSpec, result: TrialResult | None) -> None:
        self._submit(self._call_progress, _snapshot(trial), spec, result)

    def _call_progress(self, trial: Trial, spec: TrialSpec, result: TrialResult | None) -> None:
        try:  # a console that went away (a closed pipe) must not end a lane, or the sweep
            self.on_progress(trial, spec, result)
        except Exception:  # noqa: BLE001
            log.exception("progress callback failed for trial %s", spec.trial_id)


def _snapshot(trial: Trial) -> Trial:
    """The trial as it is now, for a call the writer makes later (the lane moves it on meanwhile)."""
    return dataclasses.replace(trial, history=list(trial.history))


__all__ = ["Executor", "Lane", "Phase", "PhaseHook", "SweepController", "notify_phase"]
