"""Which stage saturates first as one configuration's cores shrink, said in sentences (pure).

The decision is :mod:`orchestrator.observe.analysis.stage` (:func:`~orchestrator.observe.analysis.stage.decide`:
the stage, the case of its rules that applied, the figures behind it); this module only says it:
:func:`explain` turns a :class:`~orchestrator.observe.analysis.stage.Finding` into a :class:`Diagnosis`, and
:func:`diagnose` is the two together. What the trials did not record is left out of the evidence, and the
verdict says what it could not tell.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from orchestrator.observe.analysis.stage import (
    ATTRIBUTION,
    CPU_BUSY,
    CPU_GROWS,
    CPU_GROWS_S,
    FRONTEND_MOST,
    GPU_BUSY,
    SPARE_CPU,
    STUCK_RUNNING,
    TOLERANCE,
    WAIT,
    Finding,
    decide,
    split_ms,
)


@dataclass(frozen=True)
class Diagnosis:
    """The stage that saturates first (``frontend``, ``engine``, ``gpu`` or ``unknown``) and what is said of it.

    - ``sentence``: the whole verdict in one sentence: the stage, the fix, the figures behind it, the mechanism;
    - ``headline``: the verdict in one plain sentence for the report's reader: the stage, the fix and the figure
      that decides it (the report says the knee and what starving costs before it);
    - ``detail``: the mechanism's figures in one sentence (CPU time per request, the wait for a core, the GPU
      profile), empty when the trials recorded none;
    - ``evidence``: the figures by name, in seconds, percent (0-100), fractions and counts; ``_lo`` and ``_hi``:
      at the fewest and the most cores with a result.

    No sentence names a part larger than its whole, a share above 100% or below 0: when the frontend and the rest
    of server TTFT move apart, each movement is said on its own, with the net.
    """

    stage: str
    sentence: str
    evidence: dict[str, float] = field(default_factory=dict)
    headline: str = ""
    detail: str = ""


def _ms(v: float) -> str:
    return f"{1000 * v:.0f}"


def _n(cores: int) -> str:
    return f"{cores} core" if cores == 1 else f"{cores} cores"


def _pct(v: float) -> str:
    """A fraction as a percent, within 0-100% (a share cannot leave it; a figure that does is noise)."""
    return f"{min(max(v, 0.0), 1.0):.0%}"


def _busy(v: float) -> str:
    """A utilisation already in percent, within 0-100%."""
    return f"{min(max(v, 0.0), 100.0):.0f}%"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _where(cores: tuple[int, ...], kinds: tuple[str, ...]) -> str:
    """``1, 2 cores (timeout)``: the core counts without a result and the error kinds recorded for them."""
    where = f"{', '.join(str(c) for c in cores)} core{'s' if list(cores) != [1] else ''}"
    return f"{where} ({', '.join(kinds)})" if kinds else where


def _attribution(f: Finding) -> list[str]:
    """The mechanism behind the knee, as clauses (see :func:`orchestrator.observe.analysis.stage.decide`)."""
    a, lo_n, hi_n = f.attribution, f.c_lo, f.c_hi
    out = []
    if a.cpu is not None:
        col, at_hi, at_lo, grew = a.cpu
        if grew:
            out.append(f"of the CPU time per request, {col[len(ATTRIBUTION):]} grows most "
                       f"({1000 * at_hi:.1f} to {1000 * at_lo:.1f} ms from {hi_n} to {lo_n} cores)")
        else:
            out.append(f"the CPU time per request grows by less than {_pct(CPU_GROWS - 1)} or "
                       f"{1000 * CPU_GROWS_S:.0f} ms")
    if a.waits:
        who = " and ".join(f"the {c[len(WAIT):]} {b:.2f} s ({h:.2f} s at {hi_n})" for c, h, b in a.waits)
        out.append(f"waiting for a core per window at {_n(lo_n)}: {who}")
    if a.gpu_busy is not None:
        busy_lo, busy_hi = a.gpu_busy
        gpu = f"the GPU was busy {_pct(busy_lo)} of the time at {_n(lo_n)} against {_pct(busy_hi)} at {hi_n}"
        if a.gpu_gap is not None:
            gpu += f" (kernel gaps p99 {a.gpu_gap[0]:.0f} against {a.gpu_gap[1]:.0f} us)"
        out.append(gpu)
    return out


def _split(d_fe: float, d_srv: float, span: str = "") -> tuple[int, int, str]:
    """How server TTFT's change divides between the frontend and the rest, in whole ms, and the clause that says
    it; when they move apart each is said on its own, so no part is larger than its whole."""
    fe, rest = split_ms(d_fe, d_srv)
    net = fe + rest
    if fe >= 0 and rest >= 0:
        return fe, rest, f"{fe} of the {net} ms added to server TTFT{span} is frontend"
    if rest < 0:
        return fe, rest, (f"frontend time grew by {fe} ms{span} while the rest of server TTFT (queue and prefill) "
                          f"fell by {-rest} ms; net {net:+d} ms")
    return fe, rest, (f"the rest of server TTFT (queue and prefill) grew by {rest} ms{span} while frontend time "
                      f"fell by {-fe} ms; net {net:+d} ms")


def _grows(growth: float, c_hi: int, c_lo: int) -> str:
    verb = "grows" if growth >= 1 else "falls to"
    return f"TTFT p50 {verb} {growth:.2f}x from {c_hi} to {c_lo} cores"


def _flat(growth: float, c_lo: int, c_hi: int) -> str:
    if growth >= 1:
        return f"TTFT p50 stays within {_pct(growth - 1)} from {c_lo} to {c_hi} cores"
    return f"TTFT p50 is {_pct(1 - growth)} lower at {_n(c_lo)} than at {c_hi}"


def explain(f: Finding) -> Diagnosis:
    """:class:`Diagnosis` of ``f``: the same decision, in the sentences the report shows."""
    ev = f.evidence
    if f.case == "no_trials":
        return Diagnosis("unknown", "unknown: no trial of this configuration has a result yet.", {},
                         "No trial of this configuration has a result yet.")
    if f.case == "no_ttft":
        why = (f"every trial failed or had no ok request at {_where(f.failed, f.failed_kinds)}" if f.failed else
               "no trial recorded its core count")
        return Diagnosis("unknown", f"unknown: no trial of this configuration has a TTFT to compare: {why}.", ev,
                         f"No trial of this configuration has a TTFT to compare: {why}.")
    c_lo, c_hi = f.c_lo, f.c_hi
    failures = f"at {_where(f.failed_below, f.failed_below_kinds)} every trial failed; " if f.failed_below else ""
    clauses = _attribution(f)
    attribution = "".join(f"; {c}" for c in clauses)
    detail = _cap("; ".join(clauses)) + "." if clauses else ""
    running, in_flight = ev.get("server_num_requests_running_mean"), ev.get("client_in_flight_mean")
    cpu_hi, gpu_hi = ev.get("replica_cpu_util_mean_hi"), ev.get("gpu_util_mean_hi")

    def verdict(sentence: str, headline: str) -> Diagnosis:
        return Diagnosis(f.stage, sentence, ev, headline, detail)

    if f.case == "frontend_queue":
        servers, per = "", ""
        if f.api_servers is not None:
            per = f"this configuration runs {f.api_servers}"
            servers = f" (the api_servers axis; {per})"
        part = (f"{_ms(ev['server_frontend_s_mean_hi'])} of {_ms(ev['server_ttft_s_mean_hi'])} ms of server TTFT is "
                f"frontend (tokenization and request handling)")
        s = f"frontend-bound; more cores do not help; try more API servers{servers}: {failures}at {_n(c_hi)} {part}"
        head = f"Frontend-bound, and more cores do not help: at {_n(c_hi)} {part}"
        if running is not None:
            engine = (f", and only {running:.1f} of {in_flight:.0f} requests in flight were running in the engine"
                      if in_flight else f", and {running:.1f} requests were running in the engine on average")
            s, head = s + engine, head + engine
        head += f"; try more API servers{f' ({per})' if per else ''}."
        if f.top_flat and f.prev is not None:
            s += (f"; TTFT p50 went from {_ms(f.prev[1])} to {_ms(ev['ttft_p50_s_hi'])} ms from {f.prev[0]} to "
                  f"{c_hi} cores")
            if f.knee is not None and f.knee > c_lo:
                s += f" (cores helped up to the knee at {f.knee})"
        if cpu_hi is not None:
            s += f"; the replica's cores were {_busy(cpu_hi)} busy"
        return verdict(s + attribution + ".", head)

    if f.case == "one_count":
        facts = [f"{_ms(ev['server_frontend_s_mean_hi'])} of {_ms(ev['server_ttft_s_mean_hi'])} ms of server TTFT "
                 f"is frontend"] if "frontend_share_hi" in ev else []
        facts += [f"replica CPU {_busy(cpu_hi)} busy"] if cpu_hi is not None else []
        facts += [f"GPU {_busy(gpu_hi)} busy"] if gpu_hi is not None else []
        at = f"; at {_n(c_hi)} " + ", ".join(facts) if facts else ""
        only = (f"only {_n(c_hi)} {'has' if c_hi == 1 else 'have'} a result, so nothing shows what other core "
                f"counts would change{at}.")
        return verdict(f"unknown: {failures}{only}", _cap(only))

    assert f.growth is not None
    growth, knee = f.growth, f.knee
    timeouts = (f", and {_pct(ev['timeout_rate_lo'])} of its requests time out at {_n(c_lo)} "
                f"({_pct(ev['timeout_rate_hi'])} at {c_hi})" if f.timeouts else "")
    grows = _grows(growth, c_hi, c_lo) + timeouts
    cpu_lo = ev.get("replica_cpu_util_mean_lo")
    cpu = (f"; replica CPU {_busy(cpu_lo)} busy at {_n(c_lo)}" + (" (saturated)" if cpu_lo >= CPU_BUSY else "")
           if cpu_lo is not None else "")
    span = f" from {c_hi} to {c_lo} cores"
    fix = "the fix is cores" + (f" (the knee is at {knee})" if knee is not None else "")

    if f.case == "fewest_work":
        why = (f"the failed trials carry no figures to say which stage gave out, but the fix is cores: {c_lo} is the "
               f"fewest cores that work")
        return verdict(f"unknown stage, but the fix is cores: {failures}{_flat(growth, c_lo, c_hi)}, so "
                       f"{c_lo} is the fewest cores that work; the failed trials carry no figures to say "
                       f"which stage gave out.", _cap(why) + ".")
    if f.case == "cores_no_breakdown":
        return verdict(f"unknown stage, but {fix}: {failures}{grows}, and these trials carry no "
                       f"server TTFT breakdown (server_frontend_s_mean) to tell the frontend from "
                       f"the engine{cpu}{attribution}.",
                       f"The stage is unknown, but more cores fix it: these trials carry no server TTFT "
                       f"breakdown to tell the frontend from the engine{cpu}.")
    if f.case in ("frontend_before_clock", "frontend", "engine"):
        assert f.split is not None
        fe, rest, added = _split(*f.split)
        if f.case == "frontend_before_clock":
            lost = (f"server TTFT does not grow ({_ms(ev['server_ttft_s_mean_hi'])} to "
                    f"{_ms(ev['server_ttft_s_mean_lo'])} ms{span}): the time is lost before vLLM's clock starts, in "
                    f"the API server's request handling")
            return verdict(f"frontend-bound as cores shrink; {fix}: {failures}{grows}, but {lost}{cpu}{attribution}.",
                           f"Frontend-bound as cores shrink, and more cores fix it: {lost}{cpu}.")
        said = _split(*f.split, span)[2]
        if f.case == "frontend":
            handling = (f" (tokenization and request handling, {_ms(ev['server_frontend_s_mean_hi'])} to "
                        f"{_ms(ev['server_frontend_s_mean_lo'])} ms)" if rest >= 0 else "")
            return verdict(f"frontend-bound as cores shrink; {fix}: {failures}{grows}, and {added}"
                           f"{handling}{cpu}{attribution}.",
                           f"Frontend-bound as cores shrink, and more cores fix it: {said}"
                           f"{' (tokenization and request handling)' if rest >= 0 else ''}{cpu}.")
        loop = "; the rest is queue and prefill, the engine core's loop"
        engine, said = (f"but only {added}{loop}", f"only {said}{loop}") if fe >= 0 else (f"and {added}", said)
        return verdict(f"engine-bound as cores shrink; {fix}: {failures}{grows}, {engine}{cpu}{attribution}.",
                       f"Engine-bound as cores shrink, and more cores fix it: {said}{cpu}.")

    flat = _flat(growth, c_lo, c_hi)
    gpu_lo = ev.get("gpu_util_mean_lo")
    if f.case == "gpu":
        assert gpu_lo is not None
        busy = f"{flat} while the GPU is {_busy(gpu_lo)} busy at {_n(c_lo)}"
        return verdict(f"gpu-bound; more cores do not help: {busy}; the fix is GPUs (more, or faster ones), not cores.",
                       f"GPU-bound, and more cores do not help: {busy}; the fix is GPUs (more, or faster ones).")
    facts = [f"GPU {_busy(gpu_lo)} busy"] if gpu_lo is not None else []
    facts += [f"replica CPU {_busy(cpu_lo)} busy"] if cpu_lo is not None else []
    if "frontend_share_lo" in ev:
        facts.append(f"{_ms(ev['server_frontend_s_mean_lo'])} of {_ms(ev['server_ttft_s_mean_lo'])} ms of server "
                     f"TTFT frontend")
    at = f" ({', '.join(facts)} at {_n(c_lo)})" if facts else ""
    none = f"no stage saturates between {c_lo} and {c_hi} cores: {flat}{at}; the fewest cores tested suffice for " \
           f"this load."
    return verdict(f"unknown: {none}", _cap(none))


def diagnose(config_rows: pd.DataFrame, *, tolerance: float = TOLERANCE) -> Diagnosis:
    """The stage of one configuration that saturates first as its cores shrink, and what would fix it: the
    decision (:func:`orchestrator.observe.analysis.stage.decide`) said in sentences (:func:`explain`).

    Raises ValueError when ``config_rows`` has no ``cores`` column or holds more than one configuration.
    """
    return explain(decide(config_rows, tolerance=tolerance))


__all__ = ["CPU_BUSY", "Diagnosis", "FRONTEND_MOST", "GPU_BUSY", "SPARE_CPU", "STUCK_RUNNING", "TOLERANCE",
           "diagnose", "explain"]
