"""The built-in engines, registered by name; each factory imports its engine only when it is built.

- `hf`: transformers in float32 on a worker thread of our own: the reference the others are measured against.
- `llamacpp`: llama.cpp on CPU: `llama-server` generates (continuous batching), the bindings score prompts.
- `vllm`: vLLM's OpenAI server on a GPU, in its own image (`Dockerfile.vllm`), behind our gateway.
"""

from __future__ import annotations

from pathlib import Path

from serving.engine_types import ENGINES, Engine, EngineSpec


@ENGINES.register("hf")
def _hf(model_path: Path, spec: EngineSpec) -> Engine:
    from serving.engines.hf.engine import build

    return build(model_path, spec)


@ENGINES.register("llamacpp")
def _llamacpp(model_path: Path, spec: EngineSpec) -> Engine:
    from serving.engines.llamacpp.engine import build

    return build(model_path, spec)


@ENGINES.register("vllm")
def _vllm(model_path: Path, spec: EngineSpec) -> Engine:
    from serving.engines.vllm import build

    return build(model_path, spec)
