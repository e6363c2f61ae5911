"""``crosscheck: auto``: which windows replay their load with the reference clients (pure; thread-safe).

Why. A reference (the bare client, and ``vllm bench serve`` where listed) costs a window of GPU time each,
after every window it checks; with ``crosscheck: true`` on every trial they took half the GPU-held time of
an H200 grid. What they are for is to show that the harness reads the server as a plain client does. So
``auto`` checks where it matters and once:

1. the first window of each configuration at its **fewest** and at its **most** cores (the two ends of its
   curve, where starvation and its absence are read; a configuration is the trial's factors but its cores
   and repeat);
2. **again** at a core count only while its last reference disagreed with the harness by more than
   ``protocol.crosscheck_tolerance`` (the harness/bare TTFT p50 ratio off 1 by more than it), until one
   agrees.

A window whose references measured nothing (the trial failed) gives its end back: the next window there
runs them. The reason of every window that ran references is recorded with it (``crosscheck_why``), and
:meth:`ReferencePlan.summary` says where they ran.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from orchestrator.values.trial import TrialSpec

FEWEST = "fewest cores"
MOST = "most cores"


def configuration(trial: TrialSpec) -> tuple[tuple[str, str], ...]:
    """The trial's configuration: its factors but cores and repeat."""
    return tuple((k, str(v)) for k, v in sorted(trial.factors().items()) if k not in ("cores", "repeat"))


@dataclass
class _Config:
    fewest: int
    most: int
    ran: dict[int, list[str]]     # core count -> the reasons of its windows with references, in order
    claimed: set[int]             # ends whose references ran or are running
    last_ratio: dict[int, float]  # core count -> its last harness/bare TTFT p50 ratio


class ReferencePlan:
    """Decides, window by window, whether a trial with ``crosscheck: auto`` runs the references."""

    def __init__(self, trials: Iterable[TrialSpec] = ()) -> None:
        self._lock = threading.Lock()
        self._configs: dict[tuple[tuple[str, str], ...], _Config] = {}
        for t in trials:
            if t.protocol.crosscheck == "auto":
                self._config(t)

    def _config(self, trial: TrialSpec) -> _Config:
        key = configuration(trial)
        c = self._configs.get(key)
        if c is None:  # a trial the plan did not list: its own cores are both ends until others come
            c = self._configs[key] = _Config(trial.cores, trial.cores, {}, set(), {})
        c.fewest, c.most = min(c.fewest, trial.cores), max(c.most, trial.cores)
        return c

    def claim(self, trial: TrialSpec) -> str | None:
        """Why this window runs the references, or None when it does not (also for a trial not on auto)."""
        if trial.protocol.crosscheck != "auto":
            return None
        with self._lock:
            c = self._config(trial)
            n = trial.cores
            why = None
            if n in (c.fewest, c.most) and n not in c.claimed:
                c.claimed.add(n)
                why = FEWEST if n == c.fewest else MOST
            elif (r := c.last_ratio.get(n)) is not None and abs(r - 1) > trial.protocol.crosscheck_tolerance + 1e-12:
                why = f"disagreed by {r - 1:+.0%}"
            if why is not None:
                c.ran.setdefault(n, []).append(why)
            return why

    def record(self, trial: TrialSpec, why: str | None, ratio: float | None) -> None:
        """The outcome of a window that ran the references for ``why``: their harness/bare TTFT p50 ratio,
        or None when they measured nothing (its end, if it claimed one, goes back)."""
        if why is None:
            return
        with self._lock:
            c = self._config(trial)
            if ratio is None or ratio != ratio:  # None or NaN
                if why in (FEWEST, MOST):  # a failed re-check after a disagreement gives no end back
                    c.claimed.discard(trial.cores)
                reasons = c.ran.get(trial.cores, [])
                if why in reasons:
                    reasons.remove(why)
                return
            c.last_ratio[trial.cores] = float(ratio)

    def resume(self, done: Iterable[tuple[TrialSpec, str | None, float | None]]) -> None:
        """The windows earlier runs of this sweep finished (a resumed sweep), in the order they ran, each with why it
        ran the references and their ratio: an end they ran at is claimed, the ratio kept, and the summary names
        them, so a window after the resume does not run the references again for an end that has had them."""
        for trial, why, ratio in done:
            if trial.protocol.crosscheck != "auto" or not why:
                continue
            with self._lock:
                c = self._config(trial)
                if why in (FEWEST, MOST):
                    c.claimed.add(trial.cores)
                c.ran.setdefault(trial.cores, []).append(why)
            self.record(trial, why, ratio)

    def summary(self) -> list[str]:
        """One line per configuration on auto: where the references ran, and why."""
        with self._lock:
            out = []
            for key, c in self._configs.items():
                f = dict(key)
                where = [f"{n} cores ({', '.join(ws)})" for n, ws in sorted(c.ran.items()) if ws]
                out.append(f"references (crosscheck: auto), {f['model']} {f['workload']}: "
                           + (", ".join(where) if where else "none ran"))
            return out


__all__ = ["FEWEST", "MOST", "ReferencePlan", "configuration"]
