"""Reading a sweep file into a :class:`~orchestrator.values.sweep_spec.SweepSpec`, with errors a user can act on.

Every error names the file, and for a bad field its dotted path and YAML line; nothing is
partly loaded. Relative trace paths are resolved against the sweep file's folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.values.sweep_spec import SweepSpec
from workloads.loaders import trace_path


class SpecError(ValueError):
    """A sweep file that cannot be used; the message names the file and the field."""


def _locate(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<root>"


def _line_of(node: Any, loc: tuple[Any, ...]) -> int | None:
    """1-based YAML line of the deepest node on ``loc`` (a pydantic error location)."""
    line = None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            node = None
    if node is not None:
        line = node.start_mark.line + 1
    return line


_TAGGED = ("models", "workloads")  # lists of tagged unions: pydantic puts the item's tag into the error location


def _field_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The error location as the YAML has it: without the union tag pydantic inserts after a list index
    (``models.0.shape.shape`` is the ``shape`` field of ``models[0]``)."""
    out: list[Any] = []
    for i, part in enumerate(loc):
        if i >= 2 and isinstance(loc[i - 1], int) and loc[i - 2] in _TAGGED and len(out) == i:
            continue
        out.append(part)
    return tuple(out)


def _root_causes(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop a list's "too short" error that only repeats an item's own error: an invalid item is left out
    before the length is checked, so a list whose only item is bad also reads as empty. Drop, too, the
    error of a default that depends on other fields (``repeats``): pydantic gives it whenever any field
    before it failed, so it only says that another error happened."""
    locs = [e["loc"] for e in errors]
    return [e for e in errors
            if e["type"] != "default_factory_not_called"
            and not (e["type"] == "too_short" and any(len(o) > len(e["loc"]) and o[:len(e["loc"])] == e["loc"]
                                                      for o in locs))]


def parse_spec(data: Any, source: str = "<spec>", *, yaml_root: Any = None) -> SweepSpec:
    """Validate already-parsed YAML data; errors name the source, the line where known, and each bad field,
    one line per root cause."""
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        lines = []
        for e in _root_causes([{**e, "loc": _field_loc(e["loc"])} for e in exc.errors()]):
            line = _line_of(yaml_root, e["loc"]) if yaml_root is not None else None
            where = f"{source}:{line}" if line else source
            lines.append(f"{where}: {_locate(e['loc'])}: {e['msg']}")
        raise SpecError("invalid sweep spec\n  " + "\n  ".join(lines)) from None


def yaml_error_message(path: str | Path, exc: yaml.YAMLError) -> str:
    """One line: where the parser noticed the error, and where the broken construct opened.

    PyYAML reports a missing ``}`` or ``]`` where it gives up, often lines below the bracket
    that was left open; ``context_mark`` points at that bracket, so both are named, e.g.
    ``bad.yaml:12:5: invalid YAML: while parsing a flow mapping (opened at line 9, column 14):
    expected ',' or '}', but got ':'``.
    """
    mark = getattr(exc, "problem_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
    problem = getattr(exc, "problem", None) or str(exc)
    context, opened = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context:
        at = f" (opened at line {opened.line + 1}, column {opened.column + 1})" if opened else ""
        problem = f"{context}{at}: {problem}"
    return " ".join(f"{where}: invalid YAML: {problem}".split())


def load_spec(path: str | Path) -> SweepSpec:
    """Load a sweep YAML file. Relative trace paths are resolved against the file's folder."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(yaml_error_message(path, exc)) from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a sweep must be a YAML mapping, got {type(data).__name__}")
    spec = parse_spec(data, str(path), yaml_root=yaml.compose(text, Loader=yaml.SafeLoader))
    return _resolve_paths(spec, path.parent)


def _resolve_paths(spec: SweepSpec, base: Path) -> SweepSpec:
    workloads = []
    for w in spec.workloads:
        p = trace_path(w)
        if p is not None and not Path(p).is_absolute():
            w = w.model_copy(update={"path": (base / p).resolve()})
        workloads.append(w)
    return spec.model_copy(update={"workloads": tuple(workloads)})


__all__ = ["SpecError", "load_spec", "parse_spec", "yaml_error_message"]
