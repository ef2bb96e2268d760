"""Where this venv's llama.cpp build lives (`scripts/build_llamacpp.sh`, run by `make install`)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from mlops.errors import MLOpsError

MANIFEST = "llamacpp.json"
FIX = "Fix: run `make install` (it builds llama.cpp once per machine from the llama-cpp-python sdist)."


class LlamaCppMissing(MLOpsError):
    """llama.cpp is not built for this venv."""


@dataclass(frozen=True)
class LlamaCppInstall:
    version: str  # the llama-cpp-python release whose vendored llama.cpp was built
    bin: Path
    src: Path  # llama.cpp's source tree: convert_hf_to_gguf.py and gguf-py

    @property
    def server(self) -> Path:
        return self._tool("llama-server")

    @property
    def quantize(self) -> Path:
        return self._tool("llama-quantize")

    @property
    def converter(self) -> Path:
        path = self.src / "convert_hf_to_gguf.py"
        if not path.is_file():
            raise LlamaCppMissing(f"llama.cpp's converter {path} is missing. {FIX}")
        return path

    def _tool(self, name: str) -> Path:
        path = self.bin / name
        if not path.is_file():
            raise LlamaCppMissing(f"{name} is not built ({path} is missing). {FIX}")
        return path


def find_install(prefix: Path | None = None) -> LlamaCppInstall:
    """The build recorded in the venv; a clear error naming the fix when there is none."""
    path = Path(prefix or sys.prefix) / MANIFEST
    if not path.is_file():
        raise LlamaCppMissing(f"the llamacpp engine needs llama.cpp, and this environment has none ({path} is "
                              f"missing). {FIX}")
    info = json.loads(path.read_text())
    return LlamaCppInstall(info["version"], Path(info["bin"]), Path(info["src"]))
