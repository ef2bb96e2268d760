"""The engine contract's types and the engine registry: what an engine is (`Engine`, `EngineSpec`), what it hands
back (`Scored`, `Generated`, `Delta`, `GenerationHandle`), and `ENGINES`, the registry engines are named in.

They sit low, importing no serving module, because every engine under `serving.engines` builds on them and
`serving.engine` (which the API layer imports) loads those engines by name: with the types here, engines point
down to this module and never back up to the module that loads them. `serving.engine` re-exports all of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from mlops.plugins import Registry

REPLACEMENT = "\ufffd"  # what part of a multi-byte character decodes to on its own


@dataclass
class Scored:
    """Echo result for one prompt: a logprob per prompt token (first is None) plus one greedy next token."""

    tokens: list[int]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[int, float] | None]


@dataclass
class GenParams:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None


@dataclass
class Generated:
    text: str
    tokens: list[int]
    token_logprobs: list[float]
    top_logprobs: list[dict[int, float]]
    finish_reason: str  # "stop", "length" or "cancelled"


@dataclass
class Delta:
    """Text streamed to a client, with the tokens whose text it completes."""

    text: str
    tokens: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]]
    token_texts: list[str]

    def __str__(self) -> str:
        return self.text


@dataclass
class TokenizerInfo:
    """What /tokenizer_info reports (vLLM's fields)."""

    tokenizer_class: str
    eos_token: str | None
    bos_token: str | None
    pad_token: str | None
    vocab_size: int


@dataclass(eq=False)
class GenerationHandle:
    """A queued generation: its future yields `Generated`; `cancel()` stops it at the next token."""

    future: Future = field(default_factory=Future)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None

    def cancel(self) -> None:
        self.cancelled.set()

    def dropped(self) -> bool:
        return self.cancelled.is_set() or self.future.cancelled()


def settle(future: Future, result=None, error: BaseException | None = None) -> None:
    """Complete a future once: a future the client cancelled meanwhile stays cancelled."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class EngineClosed(RuntimeError):
    """A job was submitted to an engine that was closed (nothing will ever run it)."""


@dataclass(frozen=True)
class EngineSpec:
    """How to build an engine: its name, the model artifact, and the knobs every engine reads."""

    name: str = "hf"
    threads: int | None = None
    max_batch_tokens: int = 4096
    max_batch_rows: int = 8
    slice_steps: int = 16
    options: dict = field(default_factory=dict)  # engine-specific (e.g. llamacpp's parallel slots)


@runtime_checkable
class Engine(Protocol):
    """One loaded model. Every method may be called from any thread unless it says otherwise."""

    name: str  # the engine's registered name ("hf", "llamacpp", "vllm")
    model_path: Path  # the artifact it loaded (an HF folder, a GGUF file)
    vocab_size: int
    # Tokens one request may hold (prompt + completion) when the engine holds less than the profile's context
    # (llama.cpp's slot size); None: the profile's max_context.
    max_context: int | None
    # Lower priority (a shadow model): while this returns True the engine stands aside between steps.
    yield_to: Callable[[], bool] | None
    # Told (kind "score" or "generate", rows, tokens) for each batch the engine runs (metrics).
    observer: Callable[[str, int, int], None] | None

    # -- text <-> ids
    def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]: ...
    def detokenize(self, ids: list[int]) -> str: ...
    def chat_prompt(self, messages: list[dict]) -> list[int]:
        """The ids of `messages` under the model's chat template, with the generation prompt appended."""
    def tokenizer_info(self) -> TokenizerInfo: ...
    def chat_template(self) -> str | None:
        """The chat template the engine applies (its hash must match the profile's)."""
    def token_piece(self, token_id: int) -> str:
        """A token decoded on its own (part of a character decodes as U+FFFD)."""
    def token_text(self, token_id: int) -> str:
        """A token as a `top_logprobs` key (partial characters spelled `bytes:\\xNN`)."""
    def token_bytes(self, token_id: int) -> list[int]: ...

    # -- work
    def score(self, prompts: list[list[int]], top_k: int = 1, owner: object = None) -> Future:
        """Future of list[Scored], one per prompt, in order; cancelling it drops the work not yet done."""
    def generate(self, ids: list[int], params: GenParams, on_text: Callable[[Delta], None] | None = None,
                 owner: object = None) -> GenerationHandle: ...

    # -- health
    def alive(self) -> bool: ...
    def busy(self) -> bool: ...
    def queue_depth(self) -> int: ...
    def stalled(self, seconds: float) -> bool: ...
    def yielded(self) -> float:
        """Seconds spent standing aside for `yield_to` so far."""
    def close(self, timeout: float = 10.0) -> None: ...


EngineFactory = Callable[[Path, EngineSpec], Engine]
ENGINES: Registry[EngineFactory] = Registry("serving engine")
