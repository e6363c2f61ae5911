"""Fakes the unit tests of the window sequence share (on the tests' path: ``pythonpath`` in pyproject.toml).

- :class:`TickClock`: monotonic seconds that move only when told, one tick at a time, calling listeners
  (a telemetry sampler) at every tick;
- :class:`Remote`: an actor handle whose ``method.remote(*a)`` calls the method at once;
- :func:`agentic_trial`: a small agentic trial of the tiny shape, no warm-up;
- :class:`Est` and ``GRID``: a knee estimate as the knee search reads it, and a 7-count grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.plan.expand import expand
from orchestrator.plan.load import parse_spec


class TickClock:
    """Monotonic seconds that move only when told; every ``tick`` of movement calls the listeners."""

    def __init__(self, tick: float = 0.1) -> None:
        self.t = 1000.0
        self.tick = tick
        self.listeners: list[Any] = []

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        for _ in range(round(seconds / self.tick)):
            self.t = round(self.t + self.tick, 6)
            for fn in list(self.listeners):
                fn()


class Remote:
    """An actor handle whose ``method.remote(*a)`` calls the method at once (``get`` is the identity)."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)

        class _M:
            @staticmethod
            def remote(*args: Any) -> Any:
                return method(*args)

        return _M


def agentic_trial(*, name: str = "m", cores: int = 1, repeat: int = 0, crosscheck: bool = False) -> Any:
    """Repeat ``repeat`` of a 2-session, 1-turn agentic trial at ``cores`` cores, with no warm-up."""
    spec = parse_spec({
        "name": name, "models": [{"name": "tiny", "shape": "tiny-llama"}],
        "workloads": [{"name": "w", "kind": "agentic", "sessions": 2, "concurrency": 2, "turns": 1,
                       "system_prompt_tokens": 64, "max_duration_s": 10}],
        "grid": {"cores": [cores]}, "repeats": repeat + 1,
        "protocol": {"warmup_s": 0, "crosscheck": crosscheck},
    })
    return expand(spec).trials[repeat]


GRID = [1, 2, 3, 4, 6, 8, 12]


@dataclass(frozen=True)
class Est:
    """What orchestrator.plan.knee_search reads of a knee estimate."""

    knee: int | None
    low: int | None
    high: int | None
    window_figures: tuple[tuple[int, float], ...] = ()
