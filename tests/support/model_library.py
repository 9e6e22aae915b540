"""Builds the folders other apps keep models in, under a test's own HOME, for the model library's tests.

Each layout is the real one: the Hugging Face hub cache (``models--org--name``
with blobs, snapshots linking to them and ``refs/main``), LM Studio's
``~/.lmstudio/models/publisher/repo/file.gguf``, GPT4All's data folder, and
Ollama's manifests pointing to ``blobs/sha256-...``.  GGUF files are either a
hard link of the bundled model (a real, loadable file) or a small file written
with the ``gguf`` package's writer, whose header says what a test needs
(architecture, quantization, tokens, chat template).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from engine.bench.tiny import write_gguf

__all__ = ["build_library", "hf_cache_add", "hf_cache_add_folder", "link_or_copy", "ollama_add", "write_gguf"]


def link_or_copy(source: Path, target: Path) -> Path:
    """``target`` as a hard link of ``source`` (a copy across file systems): its own path, the same bytes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
    return target


def hf_cache_add(cache: Path, repo_id: str, files: dict[str, Path], commit: str = "a" * 40) -> Path:
    """Lay ``files`` (name in the repo -> file on disk) out as the hub cache does; return the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for name, source in files.items():
        data = source.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def hf_cache_add_folder(cache: Path, repo_id: str, folder: Path) -> Path:
    """A saved model folder put into the hub cache as ``repo_id``."""
    return hf_cache_add(cache, repo_id, {p.name: p for p in folder.iterdir() if p.is_file()})


def ollama_add(root: Path, name: str, tag: str, blob_source: Path | None, digest: str | None = None) -> Path:
    """An Ollama manifest ``registry.ollama.ai/library/NAME/TAG`` whose model layer is ``blob_source``'s bytes
    (``None``: a manifest pointing to a blob that is not there)."""
    if blob_source is not None:
        digest = digest or hashlib.sha256(blob_source.read_bytes()).hexdigest()
        link_or_copy(blob_source, root / "blobs" / f"sha256-{digest}")
    digest = digest or "0" * 64
    manifest = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    layers = [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": 1},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 1},
    ]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    return manifest


def build_library(home: Path, tiny_dir: Path) -> dict[str, Path]:
    """Models in every place the library looks; returns the interesting paths."""
    from engine.model.source import bundled_model_path

    bundled = bundled_model_path()
    hub = Path(os.environ["HF_HUB_CACHE"])
    paths = {"hf_folder": hf_cache_add_folder(hub, "Org/tiny-chat", tiny_dir)}
    gguf_src = write_gguf(home / "src" / "qwen.gguf", "qwen2", [f"w{i}" for i in range(40)])
    snap = hf_cache_add(hub, "Org/qwen-GGUF", {"qwen-q4_k_m.gguf": gguf_src, "README.md": gguf_src})
    paths["hf_gguf"] = snap / "qwen-q4_k_m.gguf"
    lms = home / ".lmstudio" / "models" / "bartowski" / "SmolLM2-GGUF"
    paths["lmstudio"] = link_or_copy(bundled, lms / "SmolLM2-135M-Instruct-Q4_1.gguf")
    write_gguf(lms / "mmproj-model-f16.gguf", "clip")  # a vision projector: not a model
    write_gguf(lms / "big-00002-of-00002.gguf", "llama")  # a later part of a split file
    paths["gpt4all"] = write_gguf(home / ".local" / "share" / "nomic.ai" / "GPT4All" / "rwkv.gguf", "rwkv6")
    ollama = home / ".ollama" / "models"
    ollama_add(ollama, "smollm2", "135m", bundled)
    ollama_add(ollama, "ghost", "latest", None)
    mine = home / "my-models"
    paths["mine"] = link_or_copy(tiny_dir / "config.json", mine / "deep" / "tiny" / "config.json").parent
    for p in tiny_dir.iterdir():
        if p.name != "config.json":
            link_or_copy(p, paths["mine"] / p.name)
    paths["mine_root"] = mine
    return paths
