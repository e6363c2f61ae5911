"""Where a vLLM replica's start-up time goes: phases read from its own log, and the state of its caches.

A sweep spends most of its GPU time starting vLLM, so each start is taken apart into phases, in
order (each one the time between two of vLLM's own log messages, or a figure vLLM states):

- ``imports``: the launch until vLLM's first log line (the interpreter, torch and vLLM imports).
- ``engine_spawn``: the first line until ``Initializing a V1 LLM engine`` (the API server resolves
  the model's config and starts the engine-core process, which imports them again).
- ``workers``: until ``Starting to load model`` / ``Loading model from scratch`` (worker processes,
  distributed init).
- ``weights``: ``Model loading took .. and X seconds``, else ``Initializing model took`` plus
  ``Loading weights took`` (vLLM-CPU with dummy weights states only the first).
- ``compile``: ``init engine .. (compilation: X s)``, else the sum of ``torch.compile took|takes X s
  in total``, else the time from the compile's first message to its last (vLLM-CPU states no figure).
- ``graph_capture``: ``Graph capturing finished in N secs`` (GPU only; vLLM rounds it to seconds).
- ``engine_init``: the rest of ``init engine (profile, create kv cache, warmup model) took X s``:
  memory profiling, KV-cache allocation and warm-up runs, less the compile and graph capture inside it.
- ``api``: the end of engine init until the server answered its health checks.

Log timestamps have second resolution (``INFO 12-02 03:08:57``), so a phase timed from them is good
to about a second; figures vLLM states are preferred, and ``sources`` says which each phase used:
``stated``, ``log-time`` (two log timestamps), ``launch-time`` (the launch or ready time against a log
timestamp) or ``stated-less`` (a stated total less phases that were not all stated). Unknown lines are
ignored and a phase whose messages are missing is absent, never 0.

The cache states: ``compile_cache`` (warm when the compile-cache entry vLLM used, or any entry where
the log names none, was under ``$VLLM_CACHE_ROOT/torch_compile_cache`` before the start),
``compile_cache_load`` (what vLLM said it did: ``loaded``, ``partly-loaded``, ``compiled``,
``load-failed``, ``disabled`` or ``none``), ``model_page_cache`` (presumed: cold at the model folder's
first start on this node since boot) and ``startup_weights`` (``dummy`` or ``real``).

``parse_startup`` and ``startup_record`` are pure; ``compile_cache_entries``, ``first_start`` and
``read_log`` look at the disk.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

PHASES = ("imports", "engine_spawn", "workers", "weights", "compile", "graph_capture", "engine_init", "api")
LAUNCH_HEADER = "# launch:"
# Lines the replica writes beside vLLM's own, so that a log read later (an MLflow artifact) times itself.
_LAUNCHED = re.compile(r"^# launched: (\S+)", re.M)
_HEALTHY = re.compile(r"^# healthy after: ([\d.]+) s", re.M)

# vLLM's own format ("INFO 12-02 03:08:57 [file.py:12] msg"), torch's glog ("W1202 03:19:02.341000 ..."),
# and FlashInfer's ("2026-12-01 21:24:25,826 - INFO - ..."); anything else inherits the last time seen.
_VLLM_TS = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))? \[")
_GLOG_TS = re.compile(r"^\[?[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)")
_ISO_TS = re.compile(r"\b(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d),(\d+) - [A-Z]+ - ")

_S = r"([\d.]+)"
STATED = {
    "model_loading": re.compile(r"Model loading took [\d.]+ ?GiB(?: memory)? and " + _S + r" ?s"),
    "init_model": re.compile(r"Initializing model took " + _S + r" ?s"),
    "load_weights": re.compile(r"Loading weights took " + _S + r" ?s"),
    "torch_compile": re.compile(r"torch\.compile (?:takes|took) " + _S + r" s in total"),
    "torch_compile_and_run": re.compile(r"torch\.compile and initial profiling/warmup run together took " + _S),
    "graph_capture": re.compile(r"Graph capturing finished in " + _S + r" secs?"),
    "init_engine": re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _S
                              + r" ?s(?:econds)?(?: \(compilation: " + _S + r" s)?"),
}
MARKERS = {  # first occurrence of each
    "engine_start": re.compile(r"Initializing a V1 LLM engine"),
    "load_start": re.compile(r"Starting to load model|Loading model from scratch"),
    "compile_start": re.compile(r"Starting torch\.compile|Dynamo bytecode transform time|"
                                r"for vLLM's torch\.compile|Warming up model for the compilation"),
    "api_start": re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on|Application startup complete"),
}
COMPILE_END = re.compile(r"saved AOT compiled function|Directly load AOT compilation|"
                         r"Compiling a graph for .* takes|Directly load the compiled graph")
CACHE_LOADED = re.compile(r"Directly load AOT compilation from path|"
                          r"Directly load the compiled graph\(s\) for .* from the cache")
CACHE_COMPILED = re.compile(r"saved AOT compiled function to|Cache the graph of .* for later use|"
                            r"Compiling a graph for .* takes")
CACHE_LOAD_FAILED = re.compile(r"Compiling model again due to a load failure")
CACHE_DISABLED = re.compile(r"torch\.compile cache is disabled")
CACHE_ENTRY = re.compile(r"torch_compile_cache/((?:torch_aot_compile/)?[0-9a-f]{6,})")


@dataclass(frozen=True)
class Line:
    """One line of the log with the time it carries (or the last time seen before it)."""

    at: datetime | None
    text: str
    stamped: bool


@dataclass(frozen=True)
class StartupLog:
    """What one start's log says: phases in seconds, where each figure came from, and the compile cache."""

    phases: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    compile_load: str = "none"  # loaded | partly-loaded | compiled | load-failed | disabled | none
    compile_entries: tuple[str, ...] = ()  # the torch_compile_cache entries the log names
    ready_after_s: float | None = None  # launch to healthy, as the replica measured it


def last_start(text: str) -> str:
    """The part of a log written by its last launch (the replica appends one ``# launch:`` header per start)."""
    at = text.rfind("\n" + LAUNCH_HEADER)
    if text.startswith(LAUNCH_HEADER) and at < 0:
        return text
    return text[at + 1:] if at >= 0 else text


def _stamp(line: str, year: int) -> datetime | None:
    for rx in (_VLLM_TS, _GLOG_TS):
        m = rx.search(line) if rx is _VLLM_TS else rx.match(line)
        if m:
            mo, d, h, mi, s = (int(g) for g in m.groups()[:5])
            frac = m.group(6)
            us = int((frac + "000000")[:6]) if frac else 0
            try:
                return datetime(year, mo, d, h, mi, s, us)
            except ValueError:
                return None
    m = _ISO_TS.search(line)
    if m:
        y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
        return datetime(y, mo, d, h, mi, s, int((m.group(7) + "000000")[:6]))
    return None


def timed_lines(text: str, launched: datetime | None = None) -> list[Line]:
    """The log's lines with their times. vLLM's stamps carry no year: the launch's is used, and a stamp
    more than a day before the launch belongs to the next year (a start across New Year)."""
    year = launched.year if launched else 2000  # a leap year: a 02-29 stamp still parses
    out: list[Line] = []
    last: datetime | None = None
    for raw in text.splitlines():
        at = _stamp(raw, year)
        if at is not None and launched is not None and at < launched - timedelta(days=1):
            at = at.replace(year=year + 1)
        if at is not None:
            last = at
        out.append(Line(at if at is not None else last, raw, at is not None))
    return out


def _secs(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else max(0.0, (b - a).total_seconds())


def parse_startup(text: str, launched: datetime | None = None, ready_after_s: float | None = None) -> StartupLog:
    """The phases of the last start in ``text`` (a replica's ``vllm.log``).

    ``launched`` is the launch's wall-clock time in the log's clock (local time, naive) and
    ``ready_after_s`` the seconds from the launch until the server was healthy. Where not given they
    are read from the replica's own ``# launched:`` and ``# healthy after:`` lines; where unknown, the
    phases that need them are absent."""
    text = last_start(text)
    if launched is None and (m := _LAUNCHED.search(text)):
        launched = datetime.fromisoformat(m.group(1))
    if ready_after_s is None and (m := _HEALTHY.search(text)):
        ready_after_s = float(m.group(1))
    lines = timed_lines(text, launched)
    stamped = [ln for ln in lines if ln.stamped and ln.at is not None]
    first_line = stamped[0].at if stamped else None
    marks: dict[str, datetime | None] = {}
    stated: dict[str, list[tuple[datetime | None, tuple[float, ...]]]] = {k: [] for k in STATED}
    compile_end: datetime | None = None
    loaded = compiled = failed = disabled = False
    entries: list[str] = []
    for ln in lines:
        t = ln.text
        for name, rx in MARKERS.items():
            if name not in marks and rx.search(t):
                marks[name] = ln.at
        for name, rx in STATED.items():
            m = rx.search(t)
            if m:
                stated[name].append((ln.at, tuple(float(g) for g in m.groups() if g is not None)))
        if COMPILE_END.search(t):
            compile_end = ln.at
        loaded |= bool(CACHE_LOADED.search(t))
        compiled |= bool(CACHE_COMPILED.search(t))
        failed |= bool(CACHE_LOAD_FAILED.search(t))
        disabled |= bool(CACHE_DISABLED.search(t))
        entries += [e for e in CACHE_ENTRY.findall(t) if e not in entries]

    phases: dict[str, float] = {}
    sources: dict[str, str] = {}

    def put(name: str, value: float | None, source: str) -> None:
        if value is not None:
            phases[name] = round(value, 3)
            sources[name] = source

    put("imports", _secs(launched, first_line), "launch-time")
    put("engine_spawn", _secs(first_line, marks.get("engine_start")), "log-time")
    put("workers", _secs(marks.get("engine_start"), marks.get("load_start")), "log-time")
    if stated["model_loading"]:
        put("weights", sum(v[0] for _, v in stated["model_loading"]), "stated")
    elif stated["init_model"] or stated["load_weights"]:
        put("weights", sum(v[0] for _, v in stated["init_model"] + stated["load_weights"]), "stated")
    init = stated["init_engine"][-1] if stated["init_engine"] else None
    if init is not None and len(init[1]) > 1:
        put("compile", init[1][1], "stated")
    elif stated["torch_compile"] or stated["torch_compile_and_run"]:
        put("compile", sum(v[0] for _, v in stated["torch_compile"] + stated["torch_compile_and_run"]), "stated")
    else:
        put("compile", _secs(marks.get("compile_start"), compile_end), "log-time")
    if stated["graph_capture"]:
        put("graph_capture", sum(v[0] for _, v in stated["graph_capture"]), "stated")
    if init is not None:
        inner = [phases[p] for p in ("compile", "graph_capture") if p in phases]
        all_stated = all(sources[p] == "stated" for p in ("compile", "graph_capture") if p in phases)
        put("engine_init", max(0.0, init[1][0] - sum(inner)), "stated" if all_stated else "stated-less")
        ready = launched + timedelta(seconds=ready_after_s) if launched and ready_after_s is not None else None
        if ready is not None:
            put("api", _secs(init[0], ready), "launch-time")
        else:
            put("api", _secs(init[0], marks.get("api_start")), "log-time")
    if disabled:
        load = "disabled"
    elif failed:
        load = "load-failed"
    elif loaded or compiled:
        load = "loaded" if loaded and not compiled else "compiled" if compiled and not loaded else "partly-loaded"
    else:
        load = "none"
    return StartupLog(phases, sources, load, tuple(entries), ready_after_s)


def compile_cache_state(before: frozenset[str], used: tuple[str, ...]) -> str:
    """``warm`` when every entry vLLM named was in the cache before the start (or, where it named none,
    when the cache held any entry); else ``cold``."""
    if used:
        return "warm" if all(e in before for e in used) else "cold"
    return "warm" if before else "cold"


def startup_record(log: StartupLog, *, cache_before: frozenset[str] | None = None,
                   model_first_start: bool | None = None, load_format: str | None = None) -> dict[str, float | str]:
    """One start as flat figures: floats for metrics (``startup_s``, ``startup_<phase>_s``,
    ``startup_other_s`` = the total less the phases found), strings for params (cache states, sources)."""
    out: dict[str, float | str] = {}
    if log.ready_after_s is not None:
        out["startup_s"] = round(log.ready_after_s, 3)
    for phase in PHASES:
        if phase in log.phases:
            out[f"startup_{phase}_s"] = log.phases[phase]
    if log.ready_after_s is not None and log.phases:
        out["startup_other_s"] = round(log.ready_after_s - sum(log.phases.values()), 3)
    out["startup_sources"] = ",".join(f"{p}={log.sources[p]}" for p in PHASES if p in log.sources)
    out["compile_cache_load"] = log.compile_load
    if cache_before is not None:
        out["compile_cache"] = compile_cache_state(cache_before, log.compile_entries)
        out["compile_cache_entries"] = str(len(cache_before))
    if model_first_start is not None:
        out["model_page_cache"] = "cold" if model_first_start else "warm"
    if load_format is not None:
        out["startup_weights"] = "dummy" if load_format == "dummy" else "real"
    return out


# ---------------------------------------------------------------- effects: the disk before a start


def compile_cache_entries(cache_root: str | Path) -> frozenset[str]:
    """The entries under ``<cache_root>/torch_compile_cache`` now (hash folders, and
    ``torch_aot_compile/<hash>`` for AOT-compiled functions), as the log names them."""
    root = Path(cache_root) / "torch_compile_cache"
    out: set[str] = set()
    try:
        for d in root.iterdir():
            if d.name == "torch_aot_compile" and d.is_dir():
                out |= {f"torch_aot_compile/{a.name}" for a in d.iterdir() if a.is_dir()}
            elif d.is_dir():
                out.add(d.name)
    except OSError:
        pass
    return frozenset(out)


def read_log(path: str | Path, offset: int = 0) -> str:
    """The log from byte ``offset`` on (where one start's part begins); empty if it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown-boot"


def first_start(model_dir: str | Path, marker_root: str | Path | None = None) -> bool:
    """True the first time this model folder starts on this node since boot (its files are then
    presumably not in the page cache); records the start, so the next call says False."""
    root = Path(marker_root or Path(tempfile.gettempdir()) / f"cpusweep-model-starts-{os.getuid()}") / _boot_id()
    marker = root / hashlib.sha256(str(Path(model_dir).resolve()).encode()).hexdigest()[:16]
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(marker, "x"):
            return True
    except FileExistsError:
        return False
    except OSError:
        return True


__all__ = ["PHASES", "StartupLog", "compile_cache_entries", "compile_cache_state", "first_start", "last_start",
           "parse_startup", "read_log", "startup_record", "timed_lines"]
