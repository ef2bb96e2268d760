"""The engine contract: what the API layer may ask of an inference engine, and the types they share.

The HTTP layer (server, completions, streaming, shadow, slot) depends on this module only; engines live under
`serving.engines` and are chosen by name (`ENGINES`, `mlops serve --engine NAME`). An engine owns its model,
its tokenizer and its scheduler: the API layer sends token ids and `GenParams`, and gets back `Scored` and
`Generated` results through futures, and `Delta`s while a generation streams. Those types and the `ENGINES`
registry live in `serving.engine_types` (below the engines, which import them from there) and are re-exported here.

Token ids are the lingua franca: string prompts are tokenized by the engine without special tokens (as
lm-eval's `hf` model does), so a loglikelihood is scored on exactly the ids the client meant.
"""

from __future__ import annotations

from pathlib import Path

from serving.engine_types import (  # noqa: F401 - the contract's types, imported from here by the API layer
    ENGINES,
    REPLACEMENT,
    Delta,
    Engine,
    EngineClosed,
    EngineFactory,
    EngineSpec,
    Generated,
    GenerationHandle,
    GenParams,
    Scored,
    TokenizerInfo,
    settle,
)


def default_threads() -> int:
    """Compute threads for a server: every core but one, left to its clients (lm-eval, load generators).

    On a busy machine, an OpenMP team wider than the cores it actually gets stalls at every barrier, which
    costs far more than the parallelism gains (measured: 2 threads 5-15x slower than 1 on a loaded 2-core box).
    """
    import os

    env = os.environ.get("MLOPS_SERVE_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 2) - 1)


def _load_builtin() -> None:
    # The built-in engines register on first use: importing one loads nothing heavy (torch, llama_cpp).
    if "hf" not in ENGINES:
        import serving.engines  # noqa: F401


def engine_names() -> list[str]:
    _load_builtin()
    return ENGINES.names()


def known_engine(name: str | None) -> str | None:
    """An engine this stack serves on, or None; anything else fails naming the choices (config validators)."""
    if name is not None and name not in engine_names():
        from mlops.errors import did_you_mean

        raise ValueError(f"unknown serving engine '{name}': {did_you_mean(name, engine_names())}")
    return name


def build_engine(model_path: Path | str, spec: EngineSpec) -> Engine:
    """The engine `spec.name` names, loaded from `model_path`; an unknown name lists the available ones.
    Every engine loads through here: a model folder that ships code is refused before any engine reads it."""
    from mlops.model_safety import require_no_code

    _load_builtin()
    factory = ENGINES.get(spec.name)
    return factory(require_no_code(Path(model_path)), spec)
