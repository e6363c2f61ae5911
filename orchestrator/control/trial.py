"""The trial state machine: one Enum, one ``transition()`` that rejects illegal moves."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class TrialState(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"        # final: retries exhausted or a non-retryable error
    RETRYING = "RETRYING"    # failed once, will run again
    SKIPPED = "SKIPPED"      # already finished in an earlier run of the sweep (resume)


_ALLOWED: dict[TrialState, frozenset[TrialState]] = {
    TrialState.PENDING: frozenset({TrialState.RUNNING, TrialState.SKIPPED, TrialState.FAILED}),
    TrialState.RUNNING: frozenset({TrialState.COMPLETED, TrialState.FAILED, TrialState.RETRYING}),
    TrialState.RETRYING: frozenset({TrialState.RUNNING, TrialState.FAILED}),
    TrialState.COMPLETED: frozenset(),
    TrialState.FAILED: frozenset(),
    TrialState.SKIPPED: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


@dataclass
class Trial:
    """Mutable run-time state of one TrialSpec; ``history`` keeps every move."""

    trial_id: str
    state: TrialState = TrialState.PENDING
    attempts: int = 0
    history: list[TrialState] = field(default_factory=list)

    def transition(self, new: TrialState) -> None:
        if new not in _ALLOWED[self.state]:
            raise IllegalTransition(f"trial {self.trial_id}: {self.state.value} -> {new.value} is not allowed")
        if new is TrialState.RUNNING:
            self.attempts += 1
        self.history.append(self.state)
        self.state = new

    @property
    def done(self) -> bool:
        return not _ALLOWED[self.state]


__all__ = ["IllegalTransition", "Trial", "TrialState"]
