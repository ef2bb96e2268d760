"""The `vllm` engine: our gateway in front of vLLM's OpenAI server, which runs in its own image on a GPU.

vLLM pins its own torch, transformers and CUDA packages, so it never shares our venv: `Dockerfile.vllm`
builds its image, and `serve.vllm.url` points the gateway at it. The gateway keeps everything that is ours
(auth, limits, request log, shadow, canary, metrics, `--follow`) and translates the engine contract into
vLLM's documented API:

- scoring: `POST /v1/completions` with token-id prompts, `echo: true`, `logprobs: k`, `max_tokens: 1`,
  temperature 0 (vLLM returns prompt logprobs for echoed tokens, the first one null);
- generation: the same endpoint with `stream: true`; `return_tokens_as_token_ids` names every token
  `token_id:<id>`, so ids come back exactly, never re-tokenized;
- text: `POST /tokenize` (a prompt, or chat `messages` with `add_generation_prompt`), `POST /detokenize`,
  `GET /tokenizer_info` (vLLM's `--enable-tokenizer-info-endpoint`) for the chat template and special tokens.

A LoRA version is served by vLLM as `--enable-lora --lora-modules <name>=<path>`: `serve.vllm.model` names it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from serving.engine_types import (
    REPLACEMENT,
    Delta,
    EngineClosed,
    EngineSpec,
    Generated,
    GenerationHandle,
    GenParams,
    Scored,
    TokenizerInfo,
    settle,
)
from serving.engines.sse import stream_generation

log = logging.getLogger("mlops.serve")
TOKEN_ID = "token_id:"


class VllmEngine:
    name = "vllm"

    def __init__(self, model_path: Path, *, url: str, model: str | None = None, api_key: str | None = None,
                 timeout: float = 600.0, workers: int = 64) -> None:
        import httpx

        self.model_path = Path(model_path)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers,
                                  timeout=httpx.Timeout(timeout, connect=10.0),
                                  limits=httpx.Limits(max_connections=workers))
        self.model = model or self._only_model()
        listed = {m["id"]: m for m in self._get("/v1/models").get("data", [])}
        self.max_context = listed.get(self.model, {}).get("max_model_len")
        info = self._get("/tokenizer_info")
        self._info = TokenizerInfo(info.get("tokenizer_class", "vLLM"), _text(info.get("eos_token")),
                                   _text(info.get("bos_token")), _text(info.get("pad_token")),
                                   int(info.get("vocab_size") or _config_vocab(self.model_path)))
        self._template = info.get("chat_template")
        self.vocab_size = self._info.vocab_size
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vllm")
        self._inflight: set = set()
        self._lock = threading.Lock()
        self._pieces: dict[int, str] = {}
        self._closed = False
        self.yield_to: Callable[[], bool] | None = None
        self.observer: Callable[[str, int, int], None] | None = None
        self.yielded_s = 0.0
        self.last_progress = time.monotonic()

    # ------------------------------------------------------------------ HTTP

    def _get(self, path: str) -> dict:
        response = self._http.get(path)
        _raise_for(response, path)
        return response.json()

    def _post(self, path: str, body: dict) -> dict:
        response = self._http.post(path, json=body)
        _raise_for(response, path)
        return response.json()

    def _only_model(self) -> str:
        names = [m["id"] for m in self._get("/v1/models").get("data", [])]
        if len(names) != 1:
            from mlops.errors import ConfigError

            raise ConfigError(f"vLLM at {self._http.base_url} serves {names or 'no model'}; set serve.vllm.model to "
                              "the one this gateway fronts (a --served-model-name or a --lora-modules name).")
        return names[0]

    # ------------------------------------------------------------------ text <-> ids

    def tokenize(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": add_special_tokens}
        return [int(t) for t in self._post("/tokenize", body)["tokens"]]

    def detokenize(self, ids: list[int]) -> str:
        return self._post("/detokenize", {"model": self.model, "tokens": list(ids)})["prompt"]

    def chat_prompt(self, messages: list[dict]) -> list[int]:
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True, "add_special_tokens": False}
        return [int(t) for t in self._post("/tokenize", body)["tokens"]]

    def chat_template(self) -> str | None:
        return self._template

    def tokenizer_info(self) -> TokenizerInfo:
        return self._info

    def token_piece(self, token_id: int) -> str:
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self.detokenize([token_id])
        return piece

    def token_bytes(self, token_id: int) -> list[int]:
        return list(self.token_piece(token_id).encode("utf-8"))

    def token_text(self, token_id: int) -> str:
        text = self.token_piece(token_id)
        return text if REPLACEMENT not in text else f"{TOKEN_ID}{token_id}"

    # ------------------------------------------------------------------ work

    def score(self, prompts: list[list[int]], top_k: int = 1, owner: object = None) -> Future:
        future: Future = Future()
        if self._closed:
            future.set_exception(EngineClosed("the vllm engine is closed"))
            return future
        self._pool.submit(self._score, future, prompts, max(1, top_k))
        return future

    def _score(self, future: Future, prompts: list[list[int]], top_k: int) -> None:
        try:
            body = {"model": self.model, "prompt": prompts, "echo": True, "logprobs": top_k, "max_tokens": 1,
                    "temperature": 0.0, "return_tokens_as_token_ids": True, "skip_special_tokens": False}
            if self.observer is not None:
                self.observer("score", len(prompts), sum(map(len, prompts)))
            choices = sorted(self._post("/v1/completions", body)["choices"], key=lambda c: c["index"])
            self.last_progress = time.monotonic()
            settle(future, result=[scored_from_vllm(c["logprobs"], ids) for c, ids in zip(choices, prompts,
                                                                                           strict=True)])
        except Exception as err:  # noqa: BLE001 - the request's own failure
            settle(future, error=err)

    def generate(self, ids: list[int], params: GenParams, on_text: Callable[[Delta], None] | None = None,
                 owner: object = None) -> GenerationHandle:
        handle = GenerationHandle()
        if self._closed:
            handle.future.set_exception(EngineClosed("the vllm engine is closed"))
            return handle
        with self._lock:
            self._inflight.add(handle)
        if self.observer is not None:
            self.observer("generate", len(self._inflight), len(ids))
        self._pool.submit(self._generate, handle, ids, params, on_text)
        return handle

    def _generate(self, handle: GenerationHandle, ids: list[int], params: GenParams, on_text) -> None:
        try:
            while self.yield_to is not None and self.yield_to() and not handle.dropped():
                time.sleep(0.002)
            settle(handle.future, result=self._stream(handle, ids, params, on_text))
        except Exception as err:  # noqa: BLE001 - delivered to the request that asked
            settle(handle.future, error=err)
        finally:
            with self._lock:
                self._inflight.discard(handle)

    def _stream(self, handle: GenerationHandle, ids: list[int], params: GenParams, on_text) -> Generated:
        body = generation_body(self.model, ids, params)
        return stream_generation(self._http, "/v1/completions", body, handle, on_text, self._parse,
                                 keep_tops=bool(params.logprobs), on_progress=self._progressed)

    def _parse(self, event: dict) -> tuple[Delta | None, str | None]:
        choice = (event.get("choices") or [None])[0]
        if choice is None:  # the usage chunk
            return None, None
        return delta_from_vllm(choice, self), choice.get("finish_reason")

    def _progressed(self) -> None:
        self.last_progress = time.monotonic()

    # ------------------------------------------------------------------ health and lifecycle

    def alive(self) -> bool:
        if self._closed:
            return False
        try:
            return self._http.get("/health", timeout=5).status_code == 200
        except Exception:  # noqa: BLE001 - unreachable is not alive
            return False

    def queue_depth(self) -> int:
        return len(self._inflight)

    def busy(self) -> bool:
        return bool(self._inflight)

    def stalled(self, seconds: float) -> bool:
        return self.busy() and time.monotonic() - self.last_progress > seconds

    def yielded(self) -> float:
        return self.yielded_s

    def close(self, timeout: float = 10.0) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            for handle in self._inflight:
                handle.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._http.close()


def generation_body(model: str, ids: list[int], params: GenParams) -> dict:
    """A vLLM streaming completion for one token-id prompt under the gateway's sampling parameters."""
    body = {"model": model, "prompt": ids, "max_tokens": params.max_tokens, "temperature": params.temperature,
            "top_p": params.top_p, "stream": True, "return_tokens_as_token_ids": True, "logprobs": params.logprobs or 1,
            "skip_special_tokens": True, "stop": [s for s in params.stop if s] or None}
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def token_id(label: str) -> int:
    """vLLM's `token_id:<id>` label (return_tokens_as_token_ids) back to the id."""
    if not label.startswith(TOKEN_ID):
        raise ValueError(f"vLLM returned token '{label}' without its id: start it with --return-tokens-as-token-ids "
                         "or keep the gateway's requests as they are")
    return int(label[len(TOKEN_ID):])


def _tops(entries: list | None) -> list:
    return [None if t is None else {token_id(k): float(v) for k, v in t.items()} for t in entries or []]


def scored_from_vllm(logprobs: dict, prompt: list[int]) -> Scored:
    """An echoed completion's logprobs (prompt tokens, then the one generated) as a `Scored`."""
    ids = [token_id(t) for t in logprobs["tokens"]]
    if ids[: len(prompt)] != list(prompt) or len(ids) != len(prompt) + 1:
        raise RuntimeError(f"vLLM echoed {len(ids)} tokens for a {len(prompt)}-token prompt plus one; it must "
                           "return the prompt's own ids (token-id prompts, echo, max_tokens 1)")
    lps = [None if v is None else float(v) for v in logprobs["token_logprobs"]]
    lps[0] = None  # the first prompt token has no context
    return Scored(ids, lps, [None, *_tops(logprobs.get("top_logprobs"))[1:]])


def delta_from_vllm(choice: dict, engine: VllmEngine) -> Delta:
    logprobs = choice.get("logprobs") or {}
    ids = [token_id(t) for t in logprobs.get("tokens") or []]
    lps = [float(v) if v is not None else 0.0 for v in logprobs.get("token_logprobs") or []]
    return Delta(choice.get("text", ""), ids, lps, _tops(logprobs.get("top_logprobs")),
                 [engine.token_piece(i) for i in ids])


def _config_vocab(model_path: Path) -> int:
    """The embedding rows of the version's own folder: vLLM's /tokenizer_info need not report a vocab size."""
    config = Path(model_path) / "config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("vocab_size") or 0) or 2**31 - 1
    return 2**31 - 1  # unknown: vLLM itself refuses ids outside its vocabulary


def _text(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def _raise_for(response, path: str) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"vLLM {path} answered {response.status_code}: {response.text[:300]}")



def build(model_path: Path, spec: EngineSpec) -> VllmEngine:
    from mlops.errors import ConfigError

    options = spec.options or {}
    if not options.get("url"):
        raise ConfigError("the vllm engine fronts a running vLLM server, and serve.vllm.url is not set. Fix: start "
                          "the image of Dockerfile.vllm on a GPU machine and pass serve.vllm.url=http://HOST:8000.")
    return VllmEngine(model_path, url=options["url"], model=options.get("model"),
                      api_key=os.environ.get(options.get("api_key_env") or "VLLM_API_KEY"),
                      timeout=options.get("timeout_seconds", 600.0))
