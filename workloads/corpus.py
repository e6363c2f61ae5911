"""Real text to build prompt text from: source code, prose and JSON found on this machine.

Why: a synthetic prompt must tokenize like the real text it stands for (DESIGN.md, "The prompt
text decides whether a frontend queue forms"). vLLM tokenizes in one thread per API server,
so text that costs more per token than an agent's real context builds a frontend queue that
real text would not. Real text has that cost only because it is real: its mix of common words,
identifiers, indentation runs, punctuation and digits. So ``TextFactory`` slices real text,
and this module finds it.

Where it comes from: text that every install of this project has, and nothing committed
(no corpus text lives in the repository, so no licence question arises):

- ``code``: the interpreter's own standard library sources (``sysconfig`` ``stdlib``), every
  other top-level module in sorted order, the first 16k characters of each.
- ``prose``: the Python reference documentation shipped as strings in
  ``pydoc_data/topics.py`` (read as a literal, never run), and the long descriptions
  (Markdown / reST READMEs) in the ``METADATA`` of the project's own dependencies.
- ``json``: the JSON data files shipped in the ``mlflow`` and ``ray`` packages, in sorted
  order until the budget is filled (today mlflow's model catalogue: nested records of names,
  numbers and prices, much like an API tool's output), minified ones re-printed with
  ``indent=2`` as a tool would print them. ``vllm``'s JSON is left out on purpose: the CPU and
  GPU builds ship different files, and the text must not depend on which one is installed.

Sizes are capped (``_BUDGET``; about 90k tokens of draw text for code, 80k for json, 50k for
prose), so reading and tokenizing all three takes well under a second on one core.

Every source is split into sections of ``SECTION_LINES`` lines dealt alternately to a *draw*
half, which prompts are made of, and a *reference* half, which they never use: the held-out
text that tests and ``benchmarks/text_bench.py`` compare tokenization cost against. Sections
are dealt across all documents, so both halves sample every file alike.

Deterministic: sorted file lists, fixed caps, no randomness; the text depends only on the
installed Python and package versions (equal installs give byte-identical text). A missing
source fails with ``CorpusError`` saying what is missing, never with silently different text.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import itertools
import json
import re
import sysconfig
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations: no tokenizer is loaded here
    from tokenizers import Tokenizer

KINDS = ("code", "prose", "json")
SECTION_LINES = 40
_MAX_LINE = 400         # longer lines are minified data or base64, not text anyone reads
_MIN_CHARS = 150_000    # per half: less would repeat the same passages within one long prompt
_BUDGET = {"code": 760_000, "prose": 420_000, "json": 500_000}  # characters, both halves together
# READMEs of the project's own dependencies (pyproject.toml), present on every install.
_DESCRIBED = ("mlflow", "pydantic", "rich", "psutil", "pandas", "tokenizers", "ray", "aiohttp",
              "pyarrow", "click")
_JSON_PACKAGES = ("mlflow", "ray")
_BLANK_RUNS = re.compile(r"\n{3,}")


class CorpusError(RuntimeError):
    """A corpus source is missing or too small on this install."""


def _clean(text: str) -> str:
    """NFC, no CR, no trailing spaces, no overlong lines, at most one blank line in a row."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    lines = [line.rstrip() for line in text.split("\n") if len(line) <= _MAX_LINE and "\x00" not in line]
    return _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip("\n")


def _stdlib() -> Path:
    path = Path(sysconfig.get_paths()["stdlib"])
    if not (path / "os.py").is_file():
        raise CorpusError(f"the standard library sources are not installed at {path} (no os.py): "
                          "the 'code' and 'prose' text styles need them")
    return path


def _literal_assignment(path: Path, name: str) -> dict[str, str]:
    """The literal value assigned to ``name`` in ``path``, read without running the file."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise CorpusError(f"{path} has no literal '{name} = ...' assignment")


def _code_documents() -> list[str]:
    files = sorted(p for p in _stdlib().glob("*.py") if p.is_file())[::2]
    return [p.read_text(encoding="utf-8", errors="replace")[:16_000] for p in files]


def _prose_documents() -> list[str]:
    topics_py = _stdlib() / "pydoc_data" / "topics.py"
    if not topics_py.is_file():
        raise CorpusError(f"{topics_py} is missing: the 'prose' text style reads the Python "
                          "reference documentation from it")
    topics = _literal_assignment(topics_py, "topics")
    docs = [topics[key][:12_000] for key in sorted(topics)]
    for name in _DESCRIBED:
        try:
            meta = importlib.metadata.distribution(name).metadata
        except importlib.metadata.PackageNotFoundError:
            continue
        body = meta.get_payload() or meta.get("Description") or ""  # type: ignore[attr-defined]
        if body.strip():
            docs.append(body[:20_000])
    return docs


def _json_documents() -> Iterator[str]:
    found = False
    for package in _JSON_PACKAGES:
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(root).rglob("*.json")):
                found = True
                try:
                    raw = path.read_text(encoding="utf-8")
                    if raw.count("\n") * 200 < len(raw):  # minified: print it as a tool would
                        raw = json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
                except (OSError, UnicodeDecodeError, ValueError):
                    continue
                yield raw[:8_000]
    if not found:
        raise CorpusError(f"no JSON files in the installed packages {_JSON_PACKAGES}: the 'json' "
                          "text style reads them (they are project dependencies)")


_LOADERS = {"code": _code_documents, "prose": _prose_documents, "json": _json_documents}


@cache
def _halves(kind: str) -> tuple[str, str]:
    if kind not in _LOADERS:
        raise ValueError(f"unknown corpus kind {kind!r}; expected one of {KINDS}")
    halves: tuple[list[str], list[str]] = ([], [])
    sizes = [0, 0]
    dealt = 0
    budget = _BUDGET[kind] // 2
    for doc in _LOADERS[kind]():
        lines = _clean(doc).split("\n")
        for i in range(0, len(lines), SECTION_LINES):
            section = "\n".join(lines[i:i + SECTION_LINES]).strip("\n")
            if not section:
                continue
            side = dealt % 2
            dealt += 1
            if sizes[side] < budget:
                halves[side].append(section)
                sizes[side] += len(section) + 1
        if min(sizes) >= budget:
            break
    if min(sizes) < _MIN_CHARS:
        raise CorpusError(f"the {kind!r} corpus has only {min(sizes)} characters per half on this "
                          f"install (need {_MIN_CHARS}); see workloads/corpus.py for its sources")
    return "\n".join(halves[0]), "\n".join(halves[1])


def draw_text(kind: str) -> str:
    """The text prompts of style ``kind`` are sliced from (``code``, ``prose`` or ``json``)."""
    return _halves(kind)[0]


def reference_text(kind: str) -> str:
    """Held-out text of the same kind and sources, never used in prompts: the cost reference."""
    return _halves(kind)[1]


def reference_sample(tokenizer: Tokenizer, shares: dict[str, float], n_tokens: int) -> str:
    """About ``n_tokens`` of held-out text, ``shares`` of it (by tokens) of each kind: pieces of
    about 1k tokens spread evenly over each kind's reference half, as prompt blocks spread over
    the draw half, the kinds' pieces interleaved."""
    streams = []
    for kind, share in shares.items():
        text = reference_text(kind)
        total = len(tokenizer.encode(text, add_special_tokens=False).ids)
        chars = len(text) * min(1.0, n_tokens * share / total)
        k = max(1, round(chars / 4000))
        pieces = []
        for i in range(k):
            a = text.find("\n", i * len(text) // k) + 1
            b = text.find("\n", a + int(chars / k))
            pieces.append(text[a:b if b > 0 else len(text)])
        streams.append(pieces)
    return "\n".join(p for group in itertools.zip_longest(*streams) for p in group if p)


__all__ = ["KINDS", "CorpusError", "draw_text", "reference_sample", "reference_text"]
