"""The catalogue of figures (orchestrator.values.figures): every declared figure is produced by the module it names,
a key resolves to its most specific declaration, the README's list is the catalogue's, and the payloads warn about
(and keep) a key nobody declared. That every key a real sweep logs is declared, and every ``always`` figure is
logged, is checked on the smoke sweep (tests/integration/test_smoke_sweep.py)."""

from __future__ import annotations

import enum
import importlib.util
import logging
import re
from pathlib import Path

import pytest

from orchestrator.observe import outbox
from orchestrator.observe.report import comparison, html
from orchestrator.values import figures
from orchestrator.values.figures import FIGURES, Agg, Kind

ROOT = Path(__file__).resolve().parents[3]


def _source(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    return Path(spec.origin).read_text()


def _spelled(key: str, src: str) -> bool:
    """The key as a string literal, a keyword argument, or (a family) every fixed part of it in the source."""
    if "{" not in key:
        return bool(re.search(rf"""["']{re.escape(key)}["']|\b{re.escape(key)}=""", src))
    parts = [p for p in re.split(r"\{[a-z_]+\}", key) if len(p) >= 2]
    return all(p in src for p in parts)


@pytest.mark.parametrize("figure", [f for f in FIGURES if f.producer != "mlflow" and not f.built],
                         ids=lambda f: f"{f.kind.value}:{f.key}")
def test_every_declared_figure_is_written_by_the_module_it_names(figure: figures.Figure) -> None:
    assert _spelled(figure.key, _source(figure.producer)), f"{figure.producer} does not write {figure.key}"


def test_keys_are_declared_once_per_kind_and_each_has_one_type() -> None:
    seen: set[tuple[Kind, str]] = set()
    for f in FIGURES:
        assert (f.kind, f.key) not in seen, f"{f.kind.value} {f.key} declared twice"
        seen.add((f.kind, f.key))
        if f.kind in (Kind.METRIC, Kind.SWEEP_METRIC):
            assert f.type is float, f.key
        elif f.kind is not Kind.REPORT:
            assert f.type is str or (issubclass(f.type, str) and issubclass(f.type, enum.Enum)), f.key
        assert f.meaning and f.producer


@pytest.mark.parametrize("key,kind,declared_as", [
    ("ttft_p50_s", Kind.METRIC, "ttft_p50_s"),
    ("server_ttft_s_p50", Kind.METRIC, "server_{phase}_s_p{q}"),
    ("server_queue_s_mean", Kind.METRIC, "server_{phase}_s_mean"),
    ("server_num_requests_running_mean", Kind.METRIC, "server_num_requests_running_mean"),
    ("server_kv_cache_usage_perc_max", Kind.METRIC, "{series}_max"),
    ("cpu_s_per_req_engine_core", Kind.METRIC, "cpu_s_per_req_{role}"),
    ("cpu_s_per_req_engine_core.structured_output", Kind.METRIC, "cpu_s_per_req_{role}"),
    ("engine_core_threads", Kind.METRIC, "{role}_threads"),
    ("gpu1_mem_gib_mean", Kind.METRIC, "{series}_mean"),
    ("ts/cpu0_util", Kind.METRIC, "ts/{series}"),
    ("gpu_held_s", Kind.SWEEP_METRIC, "{unit}_held_s"),
    ("core_idle_in_scrape_s", Kind.SWEEP_METRIC, "{unit}_{phase}_s"),
    ("workload_turns", Kind.PARAM, "workload_{setting}"),
    ("cores", Kind.PARAM, "cores"),
    ("cores", Kind.SWEEP_PARAM, "cores"),
])
def test_a_key_resolves_to_its_most_specific_declaration(key: str, kind: Kind, declared_as: str) -> None:
    found = figures.find(key, kind)
    assert found is not None and found.key == declared_as


def test_undeclared_keys_are_found() -> None:
    assert figures.undeclared(["ttft_p50_s", "made_up_figure", "requests"]) == ["made_up_figure"]
    assert figures.undeclared(["gpu_held_s", "tpu_held_s"], Kind.SWEEP_METRIC) == ["tpu_held_s"]
    assert figures.undeclared(["trial_id", "mlflow.runName", "no_such_tag"], Kind.TAG) == ["no_such_tag"]


def test_the_comparison_takes_its_columns_and_aggregation_from_the_catalogue() -> None:
    assert [*comparison.CONFIG, *figures.columns()] == comparison.COLUMNS
    by_key = {f.key: f for f in FIGURES if f.column is not None}
    assert [by_key[c].agg for c in comparison._MEDIANS] == [Agg.MEDIAN] * len(comparison._MEDIANS)
    assert set(comparison._SUMS) == {"requests", "timeouts"}
    assert "ttft_p50_s" in comparison._MEDIANS and "timeout_rate" in comparison._MEANS
    assert comparison.SEARCH_PARAMS == ("search_reason", "search_step", "search_grid_cores")


def test_the_evidence_table_takes_labels_and_units_from_the_catalogue() -> None:
    assert list(html.EVIDENCE)[:3] == ["ttft_p50_s", "server_ttft_s_mean", "server_frontend_s_mean"]
    label, unit, fmt = html.EVIDENCE["timeout_rate"]
    assert (label, unit, fmt(0.25)) == ("requests timed out", "%", "25")
    label, unit, fmt = html.EVIDENCE["replica_cpu_util_mean"]  # a utilisation is already a percent
    assert (unit, fmt(55.4)) == ("%", "55")
    assert html.EVIDENCE["cpu_s_per_req_"][2](0.01234) == "12.3" and html._PREFIXED == ("cpu_s_per_req_",
                                                                                          "runq_wait_s_")


def test_the_mlflow_readme_lists_the_catalogue() -> None:
    text = (ROOT / "mlflow" / "README.md").read_text()
    section = figures.readme_section(text)
    assert section is not None, "mlflow/README.md lost its generated markers"
    assert section == figures.markdown(), \
        "mlflow/README.md's list of figures is stale: run `python -m orchestrator.values.figures`"
    for f in FIGURES:
        if f.kind is not Kind.REPORT:
            assert f"`{f.key}`" in section, f.key


def test_an_undeclared_key_is_warned_about_once_and_still_logged(caplog: pytest.LogCaptureFixture) -> None:
    payload = {"metrics": {"ttft_p50_s": 0.1, "brand_new_figure_s": 2.0}, "params": {"cores": "2"},
               "tags": {"trial_id": "t"}}
    outbox._WARNED.discard((Kind.METRIC, "brand_new_figure_s"))
    with caplog.at_level(logging.WARNING, logger="orchestrator.observe.outbox"):
        assert outbox.check_declared(payload) == ["metric brand_new_figure_s"]
        assert outbox.check_declared(payload) == ["metric brand_new_figure_s"]
    assert sum("brand_new_figure_s" in r.getMessage() for r in caplog.records) == 1
    assert payload["metrics"]["brand_new_figure_s"] == 2.0
