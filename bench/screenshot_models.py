"""The README's shot of the Models view: ``python bench/screenshot_models.py [OUT_DIR]`` (default ``docs/``).

Builds a model library under a private HOME from the files this machine has
(these machines cannot download others): the bundled SmolLM2 GGUF as LM Studio,
Ollama and GPT4All keep it (hard links), its converted safetensors folder in the
Hugging Face cache, a second Ollama model whose blob is missing and a GGUF of
an architecture transformers cannot read, then opens the Models view offscreen,
selects the Hugging Face copy, starts a download that cannot reach the hub, and
saves ``screenshot-models.png``.  Not a benchmark (those are in ``engine/bench/``): a script of the
repository, kept here because it drives the window with ``tests.support``'s model library fixtures.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs"
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    home = Path(tempfile.mkdtemp(prefix="brisk-models-home-"))
    os.environ["HOME"] = str(home)
    os.environ["HF_HUB_CACHE"] = str(home / ".cache" / "huggingface" / "hub")
    os.environ["BRISK_DATA_DIR"] = str(home / "brisk-data")
    os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens: the download says so
    from PySide6.QtWidgets import QApplication

    from app.dialogs.models import ModelsDialog
    from engine.client import model_library
    from engine.model.source import bundled_model_path, converted_dir
    from tests.support.model_library import hf_cache_add_folder, link_or_copy, ollama_add, write_gguf

    bundled = bundled_model_path()
    converted = converted_dir(bundled, lambda _share, _text: None)
    hf_cache_add_folder(Path(os.environ["HF_HUB_CACHE"]), "HuggingFaceTB/SmolLM2-135M-Instruct", converted)
    lms = home / ".lmstudio/models/bartowski/SmolLM2-135M-Instruct-GGUF"
    link_or_copy(bundled, lms / "SmolLM2-135M-Instruct-Q4_1.gguf")
    link_or_copy(bundled, home / ".local/share/nomic.ai/GPT4All/smollm2-135m-instruct.Q4_1.gguf")
    ollama_add(home / ".ollama/models", "smollm2", "135m", bundled)
    ollama_add(home / ".ollama/models", "llama3.2", "1b", None)
    write_gguf(home / ".lmstudio/models/RWKV/rwkv-6-world-GGUF/rwkv-6-world-1b6-Q8_0.gguf", "rwkv6", file_type=7)

    app = QApplication.instance() or QApplication(sys.argv)
    dialog = ModelsDialog("", [], None, scan=model_library)
    dialog.show()
    began = time.monotonic()
    while dialog.library is None and time.monotonic() - began < 60:
        app.processEvents()
        time.sleep(0.01)
    name = "HuggingFaceTB/SmolLM2-135M-Instruct"
    dialog.table.selectRow(next(i for i, r in enumerate(dialog.rows) if r.entry.name == name))
    dialog.repo_edit.setText("bartowski/Qwen2.5-0.5B-Instruct-GGUF")
    dialog.quant_edit.setText("Q4_K_M")
    dialog.start_download()
    while dialog._cancel is not None and time.monotonic() - began < 120:
        app.processEvents()
        time.sleep(0.01)
    for _ in range(20):
        app.processEvents()
        time.sleep(0.01)
    dialog.grab().save(str(out / "screenshot-models.png"))
    print(f"wrote {out / 'screenshot-models.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
