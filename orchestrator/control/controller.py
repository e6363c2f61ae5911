"""SweepController: runs a plan through an executor, applying retries and resume, several trials at once.

It imports no Ray: the executor is injected (anything with ``execute(trial) -> TrialResult``),
and so are the observers. Retry policy lives here and only here: a retryable failure (node
lost, server died, startup timeout) is run again up to ``max_failures`` times; a config error
never is, and in a repin chain it fails the chain's later trials with it, none of them started.

**Concurrency.** The plan is cut into *chains* (:func:`orchestrator.plan.expand.chains`): trials that
must run one after another on one replica (a repin group, the windows of a shared start) form
one chain, every other trial is a chain of its own. Up to ``max_concurrent`` lanes run chains
side by side, each on its own thread with its own executor lane (``executor.lane()``: its own
warm replica, its own node). How many trials the cluster can hold at once is the executor's to
say (``executor.capacity(trials)``); the controller takes the smaller of that and the cap. Lanes
belong to a kind of node (``executor.kind_of(trial)``: H100, H200, any): each kind's chains are
taken in plan order by that kind's own lanes, as many as its nodes hold, so a plan that lists its
H200 trials first still keeps the H100 nodes busy from the start. An
executor without lanes (a test's fake) runs one trial at a time, as before; trials finish in
any order.

**The writer.** Writing a result to MLflow (a child run with its params, metrics and artifacts)
takes a fraction of a second, seconds with big artifacts. So a lane does not upload: it only
makes the result durable (``persist_result``: the tracker puts it into its outbox on disk, so
what waits for the writer is on disk, not only in memory), then ``on_trial_start``, ``on_trial_result`` and the progress callback are
queued to one writer thread (``sweep-writer``), and the lane goes on at once to its next trial;
the next trial's replica starts while the last one's results are written. One thread, fed in
FIFO order, so observers never run concurrently and each trial's start comes before its result.
The progress callback gets a snapshot of the :class:`Trial` as it was when the event was queued.
``on_sweep_start`` is called before the writer starts. ``on_sweep_end`` is queued last: by the
last of the threads that can still queue a result (``run()``'s own and each lane's) to finish, so
it runs after every result is written and gets every result, however the lanes and an interrupt
interleave; then the writer ends. ``run()`` returns (or raises) only after the writer has ended,
unless it gave up waiting for a lane (below). Lanes are counted as they finish their last trial,
not by ``Thread.is_alive()``/``join()``: on CPython 3.11 a KeyboardInterrupt that lands in
``Thread.join(timeout)`` marks a thread that still runs as stopped, and an interrupted sweep then
ended for the observers while a lane was still returning its trial (``on_sweep_end`` got 1 result
of 2, and the late result was written after it). An observer that raises is logged by the
:class:`CallbackList` and the writer goes on. Retry decisions are the lane's, from the
:class:`TrialResult` alone; they never wait for the writer. ``write_s`` (seconds per
``on_trial_result``) and ``write_wait_s`` (how long ``on_sweep_end`` waited for the queue to
drain) say what the writing cost, by ``clock`` (``time.monotonic``; a test injects its own).

**Phases.** What a running trial is doing (:data:`Phase`: placing, starting, warm-up, window, ...)
is told to ``on_phase(trial_id, phase)``, for a live display: the executor tells it from its lanes
(``executor.on_phase``), the writer tells ``writing``. :func:`notify_phase` makes every such call:
a display that raises is logged and never fails a trial.

**A knee search** (``search: knee``) runs a subset of the plan: per configuration, one trial at a time, each chosen by
:class:`orchestrator.control.search.ConfigSearch` from every finished trial of that configuration: this
run's, and the ones ``finished()`` names, read back through ``history()`` (trial id -> ``SearchTrial``).
A chosen trial records why (``search_reason``, ``search_step`` params). The search of a configuration
ends when its knee is settled or its budget is spent; ``outcomes`` says how each ended, in the order the
configurations first appear. Configurations are searched side by side, each on a lane of its own as chains are
(as many as the cluster holds, capped by ``max_concurrent``); an executor without lanes searches them one
after another. One at a time, a search used one node of a cluster of any size: in ``benchmarks/scale_sim.py``
4 configurations ran 86-103 trials an hour at 8 and at 64 nodes alike. Trials never
chosen stay ``PENDING``, they are not failures; once every search has ended, ``on_sweep_end`` gets the plan
of the trials the searches ran (so the tracker calls the sweep complete), after an interrupt the whole plan. Searches run side by side take their knee estimates (a 1000-draw bootstrap,
milliseconds of CPU each) from an :class:`~orchestrator.control.search.EstimatorPool` of ``estimate_workers``
processes held for the search's duration, so the driver's GIL and core stay free for the lanes; the estimate
is the same function of the same windows and seed, so the search decides as it would in the lane's thread.

An interrupt (Ctrl-C, or SIGTERM turned into one by the cli) still ends the sweep for the
observers: the lanes are told to stop (``executor.cancel()`` ends what is in flight) and
``run()`` waits up to ``lane_grace_s`` for them to return their trials; the writer writes what is
queued (nothing measured is lost), then ``on_sweep_end`` gets the results, then the interrupt
goes on unwinding. A lane still running after the grace (or when a second interrupt leaves that
wait) no longer holds ``run()`` up: its result is still queued to the writer, which stays open for
it, and ``on_sweep_end`` follows it and counts it; the writer (not a daemon) keeps the process
alive until then. A second interrupt while the writer drains leaves ``run()`` at once; the writer
still finishes its queue, ``on_sweep_end`` included, before the process exits. A tracker tells an
interrupted sweep from a complete one by the trials that have no result.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from queue import SimpleQueue
from typing import Any, Literal, Protocol

from orchestrator.control.search import (
    ConfigSearch,
    EstimatorPool,
    KneeEstimator,
    Outcome,
    SearchTrial,
    configurations,
    from_result,
)
from orchestrator.control.trial import Trial, TrialState
from orchestrator.observe.analysis.knee import estimate_knee
from orchestrator.plan.expand import chains
from orchestrator.values.callbacks import Callback, CallbackList
from orchestrator.values.results import ErrorKind, TrialResult
from orchestrator.values.trial import SweepPlan, TrialSpec

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
    that (a safety net: the controller closes the writer only once no lane can queue a result) is
    made in the caller's thread once the writer has ended, so it is neither lost nor concurrent
    with another. Its end is an event of its own, not ``Thread.join()``, which a KeyboardInterrupt
    can leave believing a running thread stopped (CPython 3.11; see the module docstring).
    """

    def __init__(self, name: str = WRITER_THREAD) -> None:
        self._queue: SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = SimpleQueue()
        self._lock = threading.Lock()  # submit against close: nothing is queued behind the end
        self._late = threading.Lock()  # calls after close, one at a time
        self._closed = False
        self._ended = threading.Event()  # set once the last call is made
        # Not a daemon: if run() is left before the writer ends (a second Ctrl-C, a lane past the grace),
        # what is queued, and what such a lane still queues, is written before the process exits.
        self._thread = threading.Thread(target=self._main, name=name, daemon=False)
        self._thread.start()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if not self._closed:
                self._queue.put((fn, args))
                return
        log.warning("%s: a call came after the sweep's writer closed; making it in thread %s",
                    getattr(fn, "__name__", fn), threading.current_thread().name)
        self.join()
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
        """True until the writer has made its last call."""
        return not self._ended.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for the writer to make its last call; True once it has (and its thread is gone)."""
        if not self._ended.wait(timeout):
            return False
        self._thread.join()  # it has ended its work: only the thread's exit is left
        return True

    def _main(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                self._call(*item)
        finally:
            self._ended.set()

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


MAIN = "run"  # the producer name of the thread in SweepController.run()
_ALL = "\0all"  # the lanes' key when every lane takes chains of any kind


class _Producers:
    """The threads that can still queue a trial's result: the one in ``run()`` and each lane it started.

    Each says :meth:`done` once it queues nothing more (a lane: after its last result is queued and
    appended); the last one calls ``on_last`` (queue the sweep's end, close the writer). Counted
    here, under one lock, and never read from ``Thread.is_alive()``/``join()`` (see the module docstring).
    """

    def __init__(self, on_last: Callable[[], None]) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._running = {MAIN}
        self._on_last = on_last

    def add(self, name: str) -> None:
        with self._cond:
            self._running.add(name)

    def done(self, name: str) -> bool:
        """``name`` queues nothing more. True if it was the last, and ``on_last`` was called (by this thread)."""
        with self._cond:
            if name not in self._running:
                return False
            self._running.discard(name)
            self._cond.notify_all()
            last = not self._running
        if last:
            self._on_last()
        return last

    def lanes(self) -> list[str]:
        with self._cond:
            return sorted(self._running - {MAIN})

    def wait_lanes(self, timeout: float | None = None) -> bool:
        """Wait until no lane is running; False if ``timeout`` (seconds) ran out first.

        Short waits, so an interrupt (SIGINT to the main thread) lands here; an interrupted
        ``Condition.wait`` leaves nothing marked that is not so."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._running - {MAIN}:
                left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True


class SweepController:
    """Drive every trial of ``plan`` to a final state; never raises for a failed trial."""

    def __init__(self, plan: SweepPlan, executor: Executor, *, observers: Iterable[Callback] = (),
                 finished: Callable[[], set[str]] = set, max_failures: int | None = None,
                 max_concurrent: int | None = None,
                 on_progress: Callable[[Trial, TrialSpec, TrialResult | None], None] | None = None,
                 on_phase: PhaseHook | None = None, lane_grace_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 history: Callable[[], Mapping[str, SearchTrial]] = dict,
                 estimate_workers: int | None = None) -> None:
        self.plan = plan
        self.executor = executor
        self.observers = CallbackList(observers)
        self.finished = finished
        self.max_failures = plan.spec.max_failures if max_failures is None else max_failures
        self.max_concurrent = plan.spec.max_concurrent_trials if max_concurrent is None else max_concurrent
        self.on_progress = on_progress or (lambda *_: None)
        self.on_phase = on_phase  # told "writing" when the writer takes a trial's result
        self.lane_grace_s = lane_grace_s  # after an interrupt: how long run() waits for the lanes to return
        self.clock = clock  # for write_s and write_wait_s
        self.history = history  # a knee search's finished trials of earlier runs (see the module docstring)
        # Worker processes for the knee estimates of searches run side by side (one lane: in the lane's thread).
        self.estimate_workers = estimate_workers if estimate_workers is not None else \
            max(1, min(4, (os.cpu_count() or 2) - 1))
        self.outcomes: list[Outcome] = []  # how each configuration's knee search ended
        self.trials = {t.trial_id: Trial(t.trial_id) for t in plan.trials}
        self.lanes_used = 0
        self.write_s: list[float] = []  # seconds per on_trial_result call (all observers), in the writer
        self.write_wait_s = 0.0  # seconds on_sweep_end waited for the queued writes to drain
        self._writer: _Writer | None = None
        self._producers = _Producers(lambda: None)
        self._end_results: list[TrialResult] | None = None  # set when the sweep's end is due
        self._end_plan: SweepPlan | None = None  # what on_sweep_end gets, when not the plan (a search's end)
        self._stop = threading.Event()

    # ------------------------------------------------------------------ the sweep
    def run(self) -> list[TrialResult]:
        self.observers.on_sweep_start(self.plan)
        results: list[TrialResult] = []
        self.write_s, self.write_wait_s = [], 0.0
        self._end_results = None
        self._end_plan = None
        self.outcomes = []
        self._producers = _Producers(self._close_writer)
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
                if self.plan.spec.search.kind == "knee":
                    self._run_search(done_before, results)
                    self._end_sweep(results)
                    return results
                groups = chains(todo)
                lanes = self._lanes(groups)
                self.lanes_used = sum(lanes.values())
                if self.lanes_used <= 1:
                    for chain in groups:  # the plan's order: chains are consecutive runs of it
                        self._run_chain(chain, self.executor, results.append)
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
        """The sweep's end is due: ``on_sweep_end`` is queued behind every write once no thread can queue
        a result (:meth:`_close_writer`), with ``results`` as they are then."""
        self._end_results = results

    def _close_writer(self) -> None:
        """Called once, by the last producer to finish: queue the end (if due) behind every write, close the writer."""
        results = self._end_results
        plan = self._end_plan or self.plan
        if results is not None:
            queued = self.clock()

            def sweep_end() -> None:
                self.write_wait_s = self.clock() - queued
                self.observers.on_sweep_end(plan, list(results))  # nobody appends any more

            self._submit(sweep_end)
        assert self._writer is not None
        self._writer.close()

    def _drain(self) -> None:
        writer = self._writer
        if writer is None:
            return
        if not self._producers.done(MAIN):  # a lane outlived the interrupt's grace: it ends the writer
            log.warning("sweep %s: %s still running; what they return is written, then the sweep's end, "
                        "before the process exits", self.plan.spec.name, ", ".join(self._producers.lanes()) or "a lane")
            return
        try:
            while not writer.join(timeout=0.5):  # short waits, so Ctrl-C (SIGINT to the main thread) lands here
                pass
        except KeyboardInterrupt:
            log.warning("sweep %s: interrupted while writing results; about %d call(s) still queued are "
                        "written in the background before the process exits", self.plan.spec.name,
                        writer.pending())
            raise

    def _kind_of(self, group: list[TrialSpec]) -> str:
        """The kind of node a chain (or a configuration's search) waits for; one kind for an executor that has none."""
        kind_of = getattr(self.executor, "kind_of", None)
        return str(kind_of(group[0])) if kind_of is not None else ""

    def _lanes(self, groups: list[list[TrialSpec]]) -> dict[str, int]:
        """Lanes per kind of node (:meth:`_kind_of`): as many as that kind's chains, capped by what the cluster
        holds of them at once (``executor.capacity``); all kinds together capped by ``max_concurrent``, each kind
        keeping at least one. An executor without lanes gets one, for every kind."""
        by_kind: dict[str, list[list[TrialSpec]]] = {}
        for g in groups:
            by_kind.setdefault(self._kind_of(g), []).append(g)
        cap = self.max_concurrent
        if not hasattr(self.executor, "lane") or len(groups) <= 1 or (cap is not None and cap <= 1):
            return {_ALL: 1}
        capacity = getattr(self.executor, "capacity", None)
        if cap is not None and cap < len(by_kind):  # fewer lanes than kinds: every lane takes any kind, in order
            return {_ALL: min(cap, len(groups), capacity([t for g in groups for t in g]) if capacity else cap)}
        want = {k: max(1, min(len(gs), capacity([t for g in gs for t in g]) if capacity is not None else len(gs)))
                for k, gs in by_kind.items()}
        if cap is not None and sum(want.values()) > cap:  # shared out in proportion, at least one a kind
            total = sum(want.values())
            want = {k: max(1, (n * cap) // total) for k, n in want.items()}
        return want

    def _run_lanes(self, groups: list[list[TrialSpec]], lanes: dict[str, int], results: list[TrialResult],
                   run: Callable[[list[TrialSpec], Lane, Callable[[TrialResult], None]], bool] | None = None) -> None:
        """``lanes[kind]`` threads per kind of node take that kind's ``groups`` in order, each running one with
        ``run`` (a chain's trials by default; a configuration's knee search) on its own executor lane. A lane of
        one kind never takes another kind's group: it would wait for a node of that kind while a free node of its
        own idled."""
        run = run or self._run_chain
        queues: dict[str, deque[list[TrialSpec]]] = {k: deque() for k in lanes}
        for g in groups:
            queues[_ALL if _ALL in queues else self._kind_of(g)].append(g)
        take = threading.Lock()

        def lane_main(queue: deque[list[TrialSpec]]) -> None:
            try:
                lane = self.executor.lane()  # type: ignore[attr-defined]  # optional: checked by hasattr above
                try:
                    while not self._stop.is_set():
                        with take:
                            if not queue:
                                return
                            chain = queue.popleft()

                        def keep(result: TrialResult) -> None:
                            with take:
                                results.append(result)

                        if not run(chain, lane, keep):
                            return
                finally:
                    close = getattr(lane, "close", None)
                    if close is not None:
                        close()
            finally:  # every result of this lane is queued and appended (or it died): it is done
                self._producers.done(threading.current_thread().name)

        threads = [threading.Thread(target=lane_main, args=(queues[k],), name=f"lane-{k}-{i}" if k not in ("", _ALL)
                                    else f"lane-{i}", daemon=True) for k, n in lanes.items() for i in range(n)]
        try:
            for t in threads:
                self._producers.add(t.name)  # before it starts, so no lane runs uncounted
                t.start()
            self._producers.wait_lanes()
        except BaseException:  # an interrupt (or a lane that could not start): stop the lanes, let them return
            self._stop.set()
            for t in threads:
                if t.ident is None:  # never started (the interrupt came while the lanes were starting)
                    self._producers.done(t.name)
            cancel = getattr(self.executor, "cancel", None)
            if cancel is not None:
                cancel()
            if not self._producers.wait_lanes(self.lane_grace_s):
                log.warning("sweep %s: %s still running %.0f s after the stop; going on without waiting for them",
                            self.plan.spec.name, ", ".join(self._producers.lanes()), self.lane_grace_s)
            raise
        if run != self._run_chain:  # a search's trials it never chose stay PENDING: they are not failures
            return
        # A lane that died (a bug) leaves trials without a final state: each gets one, and says why.
        for spec in (s for chain in groups for s in chain):
            trial = self.trials[spec.trial_id]
            if not trial.done:
                result = TrialResult.failed(spec.trial_id, ErrorKind.INTERNAL, "its lane ended before it finished")
                trial.transition(TrialState.FAILED)
                self._result(trial, spec, result)
                results.append(result)

    # ------------------------------------------------------------------ a knee search
    def _run_search(self, done_before: set[str], results: list[TrialResult]) -> None:
        """Each configuration's search, one trial at a time (see the module docstring)."""
        history = self.history() if done_before else {}
        groups = configurations(self.plan.trials)
        ended: dict[str, tuple[Outcome, set[str]]] = {}  # configuration's first trial -> how its search ended, its trials
        ended_lock = threading.Lock()

        estimator: KneeEstimator = estimate_knee

        def search_one(group: list[TrialSpec], lane: Lane, keep: Callable[[TrialResult], None]) -> bool:
            search = ConfigSearch(group, self.plan.spec, estimator=estimator)
            # A finished trial whose history could not be read counts as run, without a window.
            done = [history.get(t.trial_id) or SearchTrial(t.trial_id, t.cores, completed=False)
                    for t in group if t.trial_id in done_before]
            while (choice := search.choose(done)).trial is not None:
                if self._stop.is_set():
                    return False
                spec = choice.trial
                assert choice.reason is not None
                recording = _Recording(lane, search.params(choice.reason, len(done) + 1))
                result = self._run_one(self.trials[spec.trial_id], spec, recording)
                keep(result)
                done.append(from_result(spec, result))
            assert choice.stop is not None
            outcome = Outcome(search.label, choice.stop, len(done), sum(t.gpu_seconds for t in done), choice.estimate,
                              group[0].gpus)
            log.info("%s", outcome.line())
            with ended_lock:
                ended[group[0].trial_id] = (outcome, {t.trial_id for t in done})
            return True

        lanes = self._lanes(groups)
        self.lanes_used = sum(lanes.values())
        try:
            if self.lanes_used <= 1:
                for group in groups:
                    search_one(group, self.executor, results.append)
            else:  # searches side by side: their estimates in worker processes, off the driver's GIL and core
                with EstimatorPool(workers=self.estimate_workers) as pool:
                    estimator = pool
                    self._run_lanes(groups, lanes, results, run=search_one)
        finally:  # in the configurations' order, however the lanes finished (an interrupt: those that ended)
            self.outcomes = [ended[g[0].trial_id][0] for g in groups if g[0].trial_id in ended]
        ran = set().union(*(trials for _, trials in ended.values()))
        self._end_plan = self.plan.model_copy(update={"trials": tuple(t for t in self.plan.trials if t.trial_id in ran)})

    # ------------------------------------------------------------------ one trial
    def _run_chain(self, chain: list[TrialSpec], lane: Lane, keep: Callable[[TrialResult], None]) -> bool:
        """Run one chain's trials in order on ``lane``, handing each result to ``keep``; False if the sweep was
        stopped before its end. After a config error in a repin chain, its later trials fail with it unstarted."""
        refused: TrialResult | None = None
        for spec in chain:
            if self._stop.is_set():
                return False
            trial = self.trials[spec.trial_id]
            if refused is not None:
                result = self._not_started(trial, spec, refused)
            else:
                result = self._run_one(trial, spec, lane)
                if result.error_kind is ErrorKind.CONFIG and spec.start == "repin":
                    refused = result
            keep(result)
        return True

    def _not_started(self, trial: Trial, spec: TrialSpec, refused: TrialResult) -> TrialResult:
        """A re-pinned replica's later trial after an earlier one failed as a config error: they differ only
        in cores and repeat, so its start (or its workload) would be refused the same way. It fails with that
        error, named, and starts nothing: on the H200 a Ray Serve stack that could not import vLLM was
        otherwise started again for each of its trials, 30 s of a GPU each."""
        result = TrialResult.failed(spec.trial_id, ErrorKind.CONFIG,
                                    f"not started: trial {refused.trial_id} of the same re-pinned replica failed "
                                    f"as a config error: {refused.message}")
        trial.transition(TrialState.FAILED)
        self._result(trial, spec, result)
        return result

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
        # Durable first, in this (the lane's) thread: an observer that persists results (the tracker's outbox on
        # disk) has it before it waits in the writer's queue, so a driver killed with results queued loses none.
        persist = getattr(self.observers, "persist_result", None)
        if persist is not None:
            persist(spec, result)
        snap = _snapshot(trial)

        def trial_result() -> None:
            if snap.done:  # a retry's next attempt is already placing on its lane: not shown as writing
                notify_phase(self.on_phase, spec.trial_id, "writing")
            t0 = self.clock()
            self.observers.on_trial_result(spec, result)
            self.write_s.append(self.clock() - t0)
            self._call_progress(snap, spec, result)

        self._submit(trial_result)

    def _progress(self, trial: Trial, spec: TrialSpec, result: TrialResult | None) -> None:
        self._submit(self._call_progress, _snapshot(trial), spec, result)

    def _call_progress(self, trial: Trial, spec: TrialSpec, result: TrialResult | None) -> None:
        try:  # a console that went away (a closed pipe) must not end a lane, or the sweep
            self.on_progress(trial, spec, result)
        except Exception:  # noqa: BLE001
            log.exception("progress callback failed for trial %s", spec.trial_id)


class _Recording:
    """A lane whose results also carry ``params`` (a search's why and step), for the tracker."""

    def __init__(self, lane: Lane, params: dict[str, str]) -> None:
        self.lane, self.params = lane, params

    def execute(self, trial: TrialSpec, *, attempt: int = 1) -> TrialResult:
        result = self.lane.execute(trial, attempt=attempt)
        return dataclasses.replace(result, params={**result.params, **self.params})


def _snapshot(trial: Trial) -> Trial:
    """The trial as it is now, for a call the writer makes later (the lane moves it on meanwhile)."""
    return dataclasses.replace(trial, history=list(trial.history))


__all__ = ["Executor", "Lane", "Phase", "PhaseHook", "SweepController", "notify_phase"]
