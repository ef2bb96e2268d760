"""OpenAI-compatible server for one model version, configured by its deployment profile.

Endpoints: /v1/completions (string or token-id prompts, echo + logprobs for loglikelihood scoring),
/v1/chat/completions (the model's chat template, the profile's system prompt and stops, SSE streaming),
/v1/models, /health, /tokenizer_info, /tokenize, /detokenize. Every request gets an id (the `X-Request-ID`
header, taken from the client when it sends one) that appears in the response header and in the log.

String prompts are tokenized without special tokens, exactly as lm-eval's `hf` model does: a server that
prepends BOS would shift loglikelihoods by several nats.
"""


import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from pathlib import Path

from evaluation.api_schema import ApiError, ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from evaluation.generation import Engine, Generated, GenParams, Scored
from mlops.profile import DeploymentProfile, chat_template_hash, template_of

log = logging.getLogger("mlops.serve")
REQUEST_ID = "X-Request-ID"
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def create_app(model_dir: Path | str, profile: DeploymentProfile, *, model_name: str | None = None, engine=None):
    """The FastAPI app serving `model_dir` under `profile`; `engine` may be shared (tests, benchmarks)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    model_dir = Path(model_dir)
    engine = engine or Engine(model_dir)
    state = _State(engine, profile, model_name or model_dir.name, model_dir)
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        engine.close()

    app = FastAPI(title="mlops OpenAI-compatible server", version="1", lifespan=lifespan)
    app.state.serving = state

    @app.middleware("http")
    async def request_id(request: Request, call_next):
        given = request.headers.get(REQUEST_ID, "")
        rid = given if _SAFE_ID.match(given) else uuid.uuid4().hex
        request.state.request_id = rid
        started = time.perf_counter()
        response = await call_next(request)
        response.headers[REQUEST_ID] = rid
        log.info(
            "request_id=%s %s %s %d %.1fms", rid, request.method, request.url.path, response.status_code,
            (time.perf_counter() - started) * 1000,
        )
        return response

    def error(request: Request, err: ApiError) -> JSONResponse:
        rid = getattr(request.state, "request_id", "-")
        log.warning("request_id=%s error %d %s", rid, err.status, err.message)
        return JSONResponse(err.body(rid), status_code=err.status)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        return error(request, err)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        problems = err.errors()
        first = problems[0] if problems else {}
        if first.get("type") == "json_invalid":
            return error(request, ApiError(400, f"the request body is not valid JSON: {first.get('msg')}.", code="invalid_json"))
        details = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in problems[:5])
        param = ".".join(str(p) for p in first.get("loc", ())[1:2]) or None
        return error(request, ApiError(400, f"invalid request: {details}.", param=param))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        return error(request, ApiError(err.status_code, str(err.detail), code="http_error"))

    @app.exception_handler(Exception)
    async def crash(request: Request, err: Exception):
        log.exception("request_id=%s unhandled", getattr(request.state, "request_id", "-"))
        return error(request, ApiError(500, f"internal error: {type(err).__name__}: {err}", code="internal_error"))

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": state.name, "profile_hash": profile.profile_hash()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": state.name, "object": "model", "created": state.created, "owned_by": "mlops",
            "max_model_len": profile.max_context, "profile_hash": profile.profile_hash(),
        }]}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        tok = engine.tokenizer
        template = template_of(model_dir)
        return {
            "tokenizer_class": type(tok).__name__, "eos_token": tok.eos_token, "bos_token": tok.bos_token,
            "pad_token": tok.pad_token, "model_max_length": profile.max_context, "vocab_size": len(tok),
            "chat_template": template, "chat_template_hash": chat_template_hash(template),
        }

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        tokens = engine.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens).input_ids
        return {"tokens": tokens, "count": len(tokens), "max_model_len": profile.max_context}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        return {"prompt": engine.tokenizer.decode(state.check_ids(body.tokens, "tokens"))}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        from evaluation.completions import complete

        return await complete(state, body, request.state.request_id)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        from evaluation.completions import chat_complete

        return await chat_complete(state, body, request.state.request_id)

    return app


class _State:
    """What every handler needs: the engine, the profile and the checks they share."""

    def __init__(self, engine: Engine, profile: DeploymentProfile, name: str, model_dir: Path) -> None:
        self.engine = engine
        self.profile = profile
        self.name = name
        self.model_dir = model_dir
        self.created = int(time.time())
        self.vocab = len(engine.tokenizer)

    def check_model(self, requested: str | None) -> None:
        if requested is not None and requested != self.name:
            raise ApiError(
                404, f"model '{requested}' is not served here; available: {self.name}.", param="model",
                code="model_not_found",
            )

    def check_ids(self, ids: list[int], param: str) -> list[int]:
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise ApiError(400, f"token ids {bad[:5]} are outside the vocabulary (0..{self.vocab - 1}).", param=param)
        return ids

    def max_tokens(self, requested: int | None, prompt_len: int, param: str = "max_tokens") -> int:
        limit = self.profile.max_context
        if prompt_len >= limit:
            raise ApiError(
                400, f"the prompt has {prompt_len} tokens; this model's context is {limit} tokens, "
                "which must also hold at least one generated token.", param="prompt", code="context_length_exceeded",
            )
        if requested is None:
            return min(self.profile.sampling.max_tokens, limit - prompt_len)
        if requested <= 0:
            raise ApiError(400, f"'{param}' must be at least 1; got {requested}.", param=param)
        if prompt_len + requested > limit:
            raise ApiError(
                400, f"'{param}' is {requested} but the prompt has {prompt_len} tokens and the context is {limit}; "
                f"at most {limit - prompt_len} tokens can be generated.", param=param, code="context_length_exceeded",
            )
        return requested

    def params(self, body, max_tokens: int, stops: list[str], logprobs: int | None) -> GenParams:
        sampling = self.profile.sampling
        return GenParams(
            max_tokens=max_tokens,
            temperature=sampling.temperature if body.temperature is None else body.temperature,
            top_p=sampling.top_p if body.top_p is None else body.top_p,
            seed=sampling.seed if body.seed is None else body.seed,
            stop=stops,
            logprobs=logprobs,
        )


def logprobs_block(engine: Engine, scored: Scored | None, gen: Generated | None, offset0: int = 0) -> dict:
    """OpenAI `logprobs` of a completion choice: echoed prompt tokens first (when scored), then generated."""
    ids: list[int] = []
    lps: list[float | None] = []
    tops: list[dict | None] = []
    if scored is not None:
        ids, lps, tops = list(scored.tokens), list(scored.token_logprobs), list(scored.top_logprobs)
    if gen is not None:
        if scored is not None:  # the scored greedy token is replaced by the real generation
            ids, lps, tops = ids[:-1], lps[:-1], tops[:-1]
        ids += gen.tokens
        lps += gen.token_logprobs
        tops += gen.top_logprobs or [None] * len(gen.tokens)
    text = [engine.token_text(i) for i in ids]
    offsets, pos = [], offset0
    for piece in text:
        offsets.append(pos)
        pos += len(piece)
    top_text = [None if t is None else {engine.token_text(k): v for k, v in t.items()} for t in tops]
    return {"tokens": text, "token_logprobs": lps, "top_logprobs": top_text, "text_offset": offsets}


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def serve(model_dir: Path | str, profile: DeploymentProfile, *, host: str = "127.0.0.1", port: int = 8000,
          model_name: str | None = None, threads: int | None = None) -> None:
    """Run the server until interrupted (uvicorn, one process; the engine batches concurrent scoring)."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    from evaluation.generation import default_threads

    engine = Engine(model_dir, threads=threads or default_threads())
    app = create_app(model_dir, profile, model_name=model_name, engine=engine)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)


async def wait(future) -> object:
    return await asyncio.wrap_future(future)
