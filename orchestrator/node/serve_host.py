"""The trial as a Ray Serve LLM app: its config (pure), and the program that serves it on a Ray of its own.

The config is a pure function of the TrialSpec (:func:`llm_config`, :func:`host_spec`): the engine
settings ``build_vllm_command`` gives ``vllm serve``, the trial's ``vllm.args`` as engine kwargs, and
placement-group bundles from its GPUs and cores. :func:`classify` names Serve's processes. Nothing of
Ray is imported at import time, so the node side and the unit tests use this module freely.

:func:`main` is the program :class:`~orchestrator.node.serve_replica.ServeReplica` launches, restricted
and with a lifeline. It checks the ``LLMConfig`` with Ray Serve LLM's own validation before anything
starts (a refused flag is the trial's fault: exit code 2); starts a local Ray (``address="local"``,
never the cluster this node joined; on loopback) whose CPUs are the trial's cores and whose GPUs are
the trial actor's; starts Serve with its proxy on ``127.0.0.1:<port>``; and deploys the app
``build_openai_app`` builds (an OpenAI ingress deployment in front of one LLMServer deployment, Ray's
default options), assembled from its public pieces so that the ingress also serves what the protocol
reads from every stack: ``GET /health``, ``POST /reset_prefix_cache`` (no body) and ``GET /metrics``
(the LLMServer replica's own vLLM metrics). A replica Serve has to restart is a dead server to the
trial, as a dead ``vllm serve`` is (exit code 1). On SIGTERM it deletes the app and shuts Serve and Ray
down. It reports through a status file (``state``: starting, running, failed, stopped; phase times,
versions, the deployments' options, what teardown did); it and Ray's workers print to the trial's
``vllm.log``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from orchestrator.infra.local_servers import ray_on_loopback
from orchestrator.node.cores import parse_cpulist
from orchestrator.node.replica import MULTICAST_OFF_COMPILATION_CONFIG
from orchestrator.values.trial import TrialSpec

Role = Literal["serving", "frontend", "ray"]
APP_NAME = "trial"
HOOK = "orchestrator.node.serve_host.pin_worker"
CPUS_ENV = "CPUSWEEP_SERVE_CPUS"  # the cores the hook pins a serving worker to
CGROUP_ENV = "CPUSWEEP_SERVE_CGROUP_PROCS"  # cgroup.procs files a serving worker joins (a JSON list)
# The deployment names build_openai_app gives ("LLMServer:<model id>", "OpenAiIngress"); process titles carry them.
SERVER_PREFIX = "LLMServer:"
INGRESS_NAME = "OpenAiIngress"
OBJECT_STORE_BYTES = 256 << 20  # the app passes requests through it, not tensors
WATCH_S = 5.0  # how often a running app's status is read (one call to Serve's controller)
PROXY_PORT = "Serve's proxy listens on the trial's port"
REFUSED_ARGS = {"host": PROXY_PORT, "port": PROXY_PORT, "model": "the model comes from the trial",  # no engine kwargs
                "served_model_name": "the model id is the trial's model name",
                "api_server_count": "Serve runs no API-server processes (its proxy and ingress stand in for them)"}


# ---------------------------------------------------------------- the trial as a Ray Serve LLM config (pure)

def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_cli_args(args: Sequence[str]) -> dict[str, Any]:
    """``vllm serve`` flags as engine kwargs: ``--max-num-seqs 8`` is ``{"max_num_seqs": 8}``, a bare
    ``--enforce-eager`` is True, ``--no-enable-prefix-caching`` sets ``enable_prefix_caching`` False;
    ``--flag=value`` too. A value is JSON where it parses as JSON (numbers, objects), else a string.
    Raises ValueError for what has no engine-kwarg form (short flags, positionals, ``REFUSED_ARGS``)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or arg == "--":
            raise ValueError(f"{arg!r}: only --long flags map to Ray Serve LLM engine kwargs")
        name, eq, text = arg[2:].partition("=")
        if eq:
            value: Any = _value(text)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = _value(args[i + 1]), i + 1
        elif name.startswith("no-"):
            name, value = name[3:], False
        else:
            value = True
        key = name.replace("-", "_")
        if key in REFUSED_ARGS:
            raise ValueError(f"--{name}: {REFUSED_ARGS[key]}")
        out[key] = value
        i += 1
    return out


def engine_kwargs(trial: TrialSpec) -> dict[str, Any]:
    """What ``build_vllm_command`` passes to ``vllm serve``, as engine kwargs; ``trial.vllm.args`` win."""
    s = trial.server
    if trial.api_servers > 1:
        raise ValueError(f"--api-server-count {trial.api_servers}: {REFUSED_ARGS['api_server_count']}")
    extra = parse_cli_args(trial.vllm.args)
    kw: dict[str, Any] = {"load_format": s.load_format, "max_model_len": s.max_model_len,
                          "enable_prefix_caching": s.enable_prefix_caching,
                          "enable_prompt_tokens_details": True}  # cached-token counts, for prefix-hit accounting
    if s.block_size is not None:
        kw["block_size"] = s.block_size
    if s.kv_cache_bytes is not None:  # server_env then leaves out vLLM-CPU's own size, as for vllm serve
        kw["kv_cache_memory_bytes"] = s.kv_cache_bytes
    if trial.gpus > 1:
        kw["tensor_parallel_size"] = trial.gpus
        if "compilation_config" not in extra:
            kw["compilation_config"] = json.loads(MULTICAST_OFF_COMPILATION_CONFIG)
    return {**kw, **extra}


def placement_bundles(trial: TrialSpec) -> list[dict[str, float]]:
    """The LLMServer's placement-group bundles: one per GPU (the trial's cores shared out), or one of
    the trial's cores on a CPU node. Logical, as every Ray resource: the restriction is what pins."""
    if trial.gpus == 0:
        return [{"CPU": float(trial.cores)}]
    base, extra = divmod(trial.cores, trial.gpus)
    return [{"GPU": 1.0, "CPU": float(base + (1 if i < extra else 0))} for i in range(trial.gpus)]


def llm_config(trial: TrialSpec, model_dir: str, env: Mapping[str, str]) -> dict[str, Any]:
    """The trial's ``ray.serve.llm.LLMConfig``, as the plain dict it is validated from (and recorded as).

    Ray's defaults stand except where the trial needs otherwise: the LLMServer actor reserves no CPU of
    its own (its bundles hold the trial's cores), a replica whose constructor fails is not retried (a
    failed start fails the trial, as a failed ``vllm serve`` does), and vLLM's Prometheus metrics stay
    in the replica, where the ingress's ``/metrics`` reads them (``log_engine_metrics: false``)."""
    return {
        "model_loading_config": {"model_id": trial.model.name, "model_source": str(model_dir)},
        "engine_kwargs": engine_kwargs(trial),
        "placement_group_config": {"bundles": placement_bundles(trial), "strategy": "STRICT_PACK"},
        "deployment_config": {"max_constructor_retry_count": 1, "ray_actor_options": {"num_cpus": 0}},
        "runtime_env": {"env_vars": dict(env), "worker_process_setup_hook": HOOK},
        "log_engine_metrics": False,
    }


def host_spec(trial: TrialSpec, config: Mapping[str, Any], port: int, status_path: Path,
              temp_dir: Path) -> dict[str, Any]:
    """What :func:`main` reads: its Ray's size, Serve's port, the app's config, where to report."""
    return {"port": port, "num_cpus": trial.cores, "num_gpus": trial.gpus, "app_name": APP_NAME,
            "object_store_bytes": OBJECT_STORE_BYTES, "temp_dir": str(temp_dir), "status_path": str(status_path),
            "startup_timeout_s": trial.server.startup_timeout_s, "llm_config": dict(config)}


# ---------------------------------------------------------------- which process is which (pure)

_METHOD = re.compile(r"\.[A-Za-z_]\w*$")


def process_name(title: str, deployments: Sequence[str] = ()) -> str:
    """A process's name that does not depend on when it is read. Ray titles an actor's worker
    ``ray::<actor class>.<method>`` while a method runs and ``ray::<actor class>`` between methods
    (``ray::ServeController.listen_for_change``, then ``ray::ServeController``); a Serve replica's actor
    class is ``ServeReplica:<app>:<deployment>``. The method is dropped. A deployment name may hold dots
    itself (``LLMServer:llama-3.1-8b``): a title that starts with one of ``deployments`` (full
    ``ServeReplica:<app>:<deployment>`` names, without ``ray::``) is named by it exactly."""
    t = title.strip()
    if not t.startswith("ray::"):
        return t
    for d in sorted(deployments, key=len, reverse=True):
        full = "ray::" + d
        if t == full or t.startswith(full + "."):
            return full
    return _METHOD.sub("", t)


def replica_names(model: str, app: str = APP_NAME) -> tuple[str, str]:
    """The actor classes of the app's two deployments: the ingress's and the LLMServer's."""
    return f"ServeReplica:{app}:{INGRESS_NAME}", f"ServeReplica:{app}:{SERVER_PREFIX}{model}"


def classify(title: str, serving_env: bool = False) -> Role | None:
    """A process's role from its title (Ray's ``ray::<actor class>[:<app>:<deployment>][.<method>]``,
    vLLM's ``VLLM::<process>``) and whether it was started with the LLMServer's runtime env
    (``serving_env``: vLLM's Ray workers, Ray Serve LLM's telemetry actor, the worker of its node-set-up
    task). None for a process that says nothing, whose parent then decides. The method a Ray worker runs
    at the moment never changes the answer."""
    t = title.strip()
    if t.startswith("ray::ServeReplica:"):
        deployment = t.split(":", 4)[-1] if t.count(":") >= 4 else ""
        return "serving" if deployment.startswith(SERVER_PREFIX) else "frontend"
    if process_name(t) in ("ray::ServeController", "ray::ProxyActor"):
        return "frontend"
    if serving_env or t.startswith("VLLM::"):  # vLLM's engine core and workers are the replica's children
        return "serving"
    return None


SERVE_ROLES = ("serve_controller", "serve_proxy", "serve_ingress", "serve_llm_server", "serve_vllm_worker", "serve_ray")
# vLLM's GPU worker under Serve LLM: vLLM's Ray executor runs the model in a Ray actor of its own (the engine core
# then hands it every step through shared memory), where `vllm serve` at TP=1 runs it inside the engine core.
VLLM_RAY_WORKERS = ("ray::RayWorkerProc", "ray::RayWorkerWrapper")  # vLLM 0.26 (seen on the H200), older vLLM


def serve_role(title: str) -> str | None:
    """Which of Serve's processes a title names, finer than :func:`classify`: ``serve_controller``
    (``ray::ServeController``), ``serve_proxy`` (``ray::ProxyActor``), ``serve_ingress`` (the OpenAI ingress
    replica), ``serve_llm_server`` (the LLMServer replica: vLLM's OpenAI serving layer and engine client),
    ``serve_vllm_worker`` (vLLM's GPU worker, a Ray actor of vLLM's Ray executor: ``VLLM_RAY_WORKERS``);
    None for any other title (vLLM's engine core, Ray's GCS, raylet, agents, idle workers). The method a
    worker runs at the moment, and anything after the title's first word (an argv read as one string),
    never change the answer."""
    words = title.split()
    t = words[0] if words else ""
    if t.startswith("ray::ServeReplica:"):
        deployment = t.split(":", 4)[-1] if t.count(":") >= 4 else ""
        return "serve_llm_server" if deployment.startswith(SERVER_PREFIX) else "serve_ingress"
    name = process_name(t)
    if name in VLLM_RAY_WORKERS:
        return "serve_vllm_worker"
    return {"ray::ServeController": "serve_controller", "ray::ProxyActor": "serve_proxy"}.get(name)


def process_sets(procs: Mapping[int, tuple[int, str, bool]]) -> dict[Role, list[int]]:
    """``{pid: (ppid, title, serving_env)}`` split into the three sets: a process takes the role of the
    nearest of itself and its ancestors (within ``procs``) that has one. The rest (GCS, raylet, agents,
    idle workers, the host itself) are ``ray``."""
    out: dict[Role, list[int]] = {"serving": [], "frontend": [], "ray": []}
    for pid in sorted(procs):
        role, cur, seen = None, pid, set()
        while role is None and cur in procs and cur not in seen:
            seen.add(cur)
            role = classify(procs[cur][1], procs[cur][2])
            cur = procs[cur][0]
        out[role or "ray"].append(pid)
    return out


def roots(pids: Sequence[int], procs: Mapping[int, tuple[int, str, bool]]) -> list[int]:
    """The members of ``pids`` whose parent is not one of them (each stands for its subtree)."""
    members = set(pids)
    return [p for p in pids if p in procs and procs[p][0] not in members]


def pin_worker() -> None:
    """Ray's ``worker_process_setup_hook`` for the LLMServer replica (and vLLM's Ray workers), run before
    the actor's constructor: join the trial's cgroups, pin every thread the worker has to the trial's
    cores. What it starts later (vLLM's engine core, its threads) inherits that."""
    for path in json.loads(os.environ.get(CGROUP_ENV) or "[]"):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
    if cpus := os.environ.get(CPUS_ENV):
        # heavy: workloads.bare brings aiohttp and the workload spec; only a serving worker's hook pins
        from workloads.bare import pin  # the one pin-every-thread helper

        pin(set(parse_cpulist(cpus)))


# ---------------------------------------------------------------- the app (Ray Serve LLM, imported here only)

def app_classes() -> tuple[type, type, dict[str, Any]]:
    """The LLMServer with what the protocol reads from a replica (its vLLM metrics, a prefix-cache reset
    that says whether vLLM did it), the OpenAI ingress with the endpoints for them, and its routes."""
    # heavy: Ray Serve LLM, in the host process only (importing this module stays Ray-free: see the docstring)
    from ray.llm._internal.serve.core.ingress.ingress import DEFAULT_ENDPOINTS
    from ray.serve.llm.deployment import LLMServer
    from ray.serve.llm.ingress import OpenAiIngress
    from starlette.responses import JSONResponse, PlainTextResponse, Response

    class TrialLLMServer(LLMServer):
        async def metrics_text(self) -> str:
            # heavy: vLLM, in the LLMServer replica only (its registry is that process's)
            from prometheus_client import generate_latest
            from vllm.v1.metrics.prometheus import get_prometheus_registry

            return generate_latest(get_prometheus_registry()).decode()

        async def reset_prefix_cache_checked(self) -> bool:  # Ray's reset_prefix_cache drops vLLM's answer
            return bool(await self.engine._engine_client.reset_prefix_cache())  # type: ignore[union-attr]

    class TrialIngress(OpenAiIngress):
        def __init__(self, llm_deployments: dict[str, Any], model_cards: dict[str, Any], **kw: Any) -> None:
            super().__init__(llm_deployments, model_cards, **kw)
            self._servers = list(llm_deployments.values())

        async def health_endpoint(self) -> Any:
            try:
                for server in self._servers:
                    await server.check_health.remote()
            except Exception:  # noqa: BLE001 (any failed health check is "not healthy")
                return Response(status_code=503)
            return Response(status_code=200)

        async def reset_endpoint(self) -> Any:
            done = [await server.reset_prefix_cache_checked.remote() for server in self._servers]
            return JSONResponse({"success": bool(done) and all(done)})

        async def metrics_endpoint(self) -> Any:
            texts = [await server.metrics_text.remote() for server in self._servers]
            return PlainTextResponse("".join(texts), media_type="text/plain; version=0.0.4; charset=utf-8")

    routes = {**DEFAULT_ENDPOINTS, "health_endpoint": lambda app: app.get("/health"),
              "reset_endpoint": lambda app: app.post("/reset_prefix_cache"),
              "metrics_endpoint": lambda app: app.get("/metrics")}
    return TrialLLMServer, TrialIngress, routes


def build_app(config: Any) -> tuple[Any, dict[str, Any]]:
    """The app ``build_openai_app`` builds for ``config`` (the same two deployments and default options),
    with the ingress of :func:`app_classes`; and the options each deployment got, for the record."""
    # heavy: Ray Serve LLM, in the host process only (importing this module stays Ray-free: see the docstring)
    from ray import serve
    from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata
    from ray.serve.llm import build_llm_deployment
    from ray.serve.llm.ingress import OpenAiIngress, make_fastapi_ingress

    server_cls, ingress_cls, routes = app_classes()
    server_options = server_cls.get_deployment_options(config)  # type: ignore[attr-defined]
    server = build_llm_deployment(config, name_prefix=SERVER_PREFIX, deployment_cls=server_cls)
    ingress_options = OpenAiIngress.get_deployment_options([config])
    # The LLMServer's bundles hold every CPU this Ray has (the trial's cores, bookkeeping only): the
    # ingress, like Serve's controller and proxy, must not need one of them to be scheduled.
    ingress_options["ray_actor_options"] = {**ingress_options.get("ray_actor_options", {}), "num_cpus": 0}
    ingress_options.setdefault("name", INGRESS_NAME)
    ingress = serve.deployment(make_fastapi_ingress(ingress_cls, endpoint_map=routes), **ingress_options)
    app = ingress.bind(llm_deployments={config.model_id: server},  # type: ignore[attr-defined]
                       model_cards={config.model_id: to_model_metadata(config.model_id, config)})
    record = json.loads(json.dumps({"llm_server": server_options, "ingress": ingress_options}, default=str))
    record["llm_server"].get("ray_actor_options", {}).get("runtime_env", {}).pop("env_vars", None)  # recorded apart
    return app, record


class Status:
    """The status file the replica reads: one JSON object, replaced whole on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"state": "starting", "pid": os.getpid()}

    def write(self, **fields: Any) -> None:
        self.data.update(fields)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, default=str))
        os.replace(tmp, self.path)


def say(message: str) -> None:  # into vllm.log, beside Ray's and vLLM's lines
    print(f"# serve_host: {message}", flush=True)


def main(argv: list[str]) -> int:
    """Serve the app of the spec file ``argv[0]`` until SIGTERM; the exit code says how it ended."""
    spec = json.loads(Path(argv[0]).read_text())
    status, stop, t0 = Status(Path(spec["status_path"])), threading.Event(), time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # heavy: Ray, in the host process only (importing this module stays Ray-free: see the docstring)
    import ray
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    status.write(ray_version=ray.__version__, serve_version=ray.__version__)  # Serve ships inside Ray
    runtime_env = spec["llm_config"].get("runtime_env") or {}
    if hook := runtime_env.get("worker_process_setup_hook"):
        # Ray honours the key only in a job's runtime_env (ray.init); in an actor's it is dropped without a
        # word. Its workers run the hook this variable names, which the actor's env_vars can set.
        runtime_env.setdefault("env_vars", {})[WORKER_PROCESS_SETUP_HOOK_ENV_VAR] = hook
    try:  # Ray Serve LLM's own checks, before any process starts
        from ray.serve.llm import LLMConfig  # heavy (Ray); inside the try: an import that fails is a refused config

        config = LLMConfig.model_validate(spec["llm_config"])
        config.get_engine_config()
    except Exception as exc:  # noqa: BLE001 (every refusal is the trial's config)
        say(why := f"Ray Serve LLM refused the trial's config: {exc}")
        status.write(state="failed", error_kind="config", message=why)
        return 2
    from ray import serve  # heavy: Ray, in the host process only (see the docstring)

    started = {"ray": False, "serve": False}

    def reached(what: str, text: str) -> None:
        started[what] = True
        status.write(**{f"{what}_started_s": round(time.monotonic() - t0, 3)})
        say(f"{text} after {time.monotonic() - t0:.1f} s")

    try:
        with ray_on_loopback():
            ray.init(address="local", num_cpus=spec["num_cpus"], num_gpus=spec["num_gpus"],
                     include_dashboard=False, object_store_memory=spec["object_store_bytes"],
                     _temp_dir=spec["temp_dir"], log_to_driver=True, configure_logging=False)
        signal.signal(signal.SIGTERM, lambda *_: stop.set())  # ray.init put in one that exits at once
        reached("ray", "local Ray up")
        serve.start(http_options={"host": "127.0.0.1", "port": spec["port"]}, proxy_location="HeadOnly")
        reached("serve", f"Serve up, its proxy on 127.0.0.1:{spec['port']},")
        app, record = build_app(config)
        status.write(deployment=record)
        serve.run_many([serve.RunTarget(app, name=spec["app_name"], route_prefix="/")],
                       wait_for_applications_running=False)
        code = _serve(spec, status, stop, t0)
    except Exception as exc:  # noqa: BLE001 (reported, then the same teardown)
        say(f"failed: {exc}\n{traceback.format_exc()}")
        status.write(state="failed", error_kind="server_died", message=f"{type(exc).__name__}: {exc}")
        code = 1
    _teardown(spec, status, started)
    if status.data["state"] != "failed":
        status.write(state="stopped")
    return code


def _app_status(name: str) -> tuple[str, str]:
    from ray import serve  # heavy: Ray, in the host process only (see the docstring)

    app = serve.status().applications.get(name)
    if app is None:
        return "NOT_STARTED", ""
    detail = "; ".join(f"{d}: {s.status} {s.message}".strip() for d, s in app.deployments.items())
    return str(getattr(app.status, "value", app.status)), f"{app.message} {detail}".strip()


def _serve(spec: dict[str, Any], status: Status, stop: threading.Event, t0: float) -> int:
    """Wait for the app to be RUNNING (checked every second), then watch it (every ``WATCH_S``) until
    SIGTERM: 0. Or 1: it failed to deploy, ran out of time, or left RUNNING (Serve restarts a dead replica)."""
    deadline, running = t0 + spec["startup_timeout_s"], False
    while not stop.wait(WATCH_S if running else 1.0):
        state, detail = _app_status(spec["app_name"])
        if state == "RUNNING" and not running:
            running = True
            status.write(state="running", running_s=round(time.monotonic() - t0, 3))
            say(f"app {spec['app_name']} RUNNING after {time.monotonic() - t0:.1f} s")
        elif (running and state != "RUNNING") or state in ("DEPLOY_FAILED", "UNHEALTHY"):
            say(f"app {spec['app_name']} {state}: {detail}")
            status.write(state="failed", error_kind="server_died", message=f"Serve app {state}: {detail}")
            return 1
        elif not running and time.monotonic() > deadline:
            status.write(state="failed", error_kind="startup_timeout",
                         message=f"Serve app still {state} after {spec['startup_timeout_s']:.0f} s: {detail}")
            return 1
    return 0


def _teardown(spec: dict[str, Any], status: Status, started: dict[str, bool]) -> None:
    """Delete the app, shut Serve and Ray down; each step recorded, and a failed one does not stop the next."""
    # heavy: Ray, in the host process only (see the docstring)
    import ray
    from ray import serve

    done: dict[str, Any] = {"app_deleted": False, "serve_shutdown": False, "ray_shutdown": False}
    steps = [("app_deleted", lambda: serve.delete(spec["app_name"])), ("serve_shutdown", serve.shutdown)]
    for step, call in (steps if started["serve"] else []) + ([("ray_shutdown", ray.shutdown)] if started["ray"] else []):
        try:
            call()
            done[step] = True
        except Exception as exc:  # noqa: BLE001
            done[f"{step}_error"] = f"{type(exc).__name__}: {exc}"
    status.write(teardown=done)
    say(f"teardown: {json.dumps(done)}")



__all__ = ["APP_NAME", "CGROUP_ENV", "CPUS_ENV", "HOOK", "SERVE_ROLES", "VLLM_RAY_WORKERS", "Role", "app_classes", "build_app", "classify", "engine_kwargs", "process_name", "replica_names",
           "host_spec", "llm_config", "main", "parse_cli_args", "pin_worker", "placement_bundles", "process_sets", "roots", "serve_role"]
