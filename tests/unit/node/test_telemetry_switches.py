"""telemetry.stacks and telemetry.gpu_profile: off by default, strict, and in a trial's identity only when set."""

from __future__ import annotations

import pytest

from orchestrator.plan.expand import expand
from orchestrator.plan.load import SpecError, parse_spec
from orchestrator.values.sweep_spec import TelemetrySpec
from orchestrator.values.trial import TrialSpec


def spec(**telemetry: object) -> dict[str, object]:
    data: dict[str, object] = {"name": "t", "models": [{"name": "tiny", "shape": "tiny-llama"}],
                               "workloads": [{"name": "w", "kind": "agentic", "sessions": 2, "turns": 2}],
                               "grid": {"cores": [1, 2]}}
    if telemetry:
        data["telemetry"] = telemetry
    return data


def test_defaults_are_off_and_leave_trial_ids_as_they_were() -> None:
    t = TelemetrySpec()
    assert not t.stacks.enabled and t.stacks.rate_hz == 49 and not t.stacks.native
    assert not t.gpu_profile.enabled and t.gpu_profile.seconds == 2
    # Written out without the new sections, so every existing trial hashes as before.
    assert t.model_dump(mode="json") == {"host_hz": 10.0, "metrics_hz": 1.0, "gpu": True}
    plain = expand(parse_spec(spec())).trials
    spelled = expand(parse_spec(spec(stacks={"enabled": False}, gpu_profile={"seconds": 2}))).trials
    assert [a.trial_id for a in plain] == [b.trial_id for b in spelled]


def test_stacks_on_is_another_trial_and_survives_the_round_trip() -> None:
    off = expand(parse_spec(spec())).trials
    on = expand(parse_spec(spec(stacks={"enabled": True, "rate_hz": 97}))).trials
    assert on[0].telemetry.stacks.enabled and on[0].telemetry.stacks.rate_hz == 97
    assert {t.trial_id for t in on}.isdisjoint(t.trial_id for t in off)
    back = TrialSpec.model_validate_json(on[0].model_dump_json())
    assert back == on[0] and back.trial_id == on[0].trial_id


@pytest.mark.parametrize("bad", [{"stacks": {"enabled": True, "rate": 49}}, {"stacks": {"rate_hz": 0}},
                                 {"gpu_profile": {"seconds": 600}}])
def test_bad_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(SpecError):
        parse_spec(spec(**bad))
