"""OpenAI-compatible server for one model slot, configured by the deployment profile of the version in it.

Endpoints: /v1/completions (string or token-id prompts, echo + logprobs for loglikelihood scoring),
/v1/chat/completions (the model's chat template, the profile's system prompt and stops, SSE streaming),
/v1/models, /v1/models/{id}, /tokenizer_info, /tokenize, /detokenize (vLLM style), /v1/feedback (a rating and
an optional correction of a logged answer), /health (the process is alive), /ready (a model is loaded and
answering), /metrics (Prometheus). Every request gets an id (the `X-Request-ID` header, taken from the client
when it sends a safe one); model responses name the version that answered in `X-Model-Version`.

Around the main slot: a canary slot that takes a share of generation requests while the registry runs a canary
(`serving_canary`), a shadow model that answers a share again in the background (`serving_shadow`), and the
request log every generation answer goes to as an MLflow trace (`serving.request_log`, `mlops.requestlog`).

String prompts are tokenized without special tokens, exactly as lm-eval's `hf` model does: a server that
prepends BOS would shift loglikelihoods by several nats.
"""


# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request) at runtime.
import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlops.profile import DeploymentProfile, chat_template_hash
from serving.api_schema import ApiError, DetokenizeRequest, TokenizeRequest, parse_body
from serving.config import ServeConfig
from serving.engine import EngineSpec, build_engine, default_threads
from serving.http import MODEL_VERSION, REQUEST_ID  # noqa: F401 - re-exported for clients and tests
from serving.slot import ModelSlot

if TYPE_CHECKING:
    from serving.auth import KeyStore
    from serving.canary import CanaryRoute
    from serving.metrics import ServerMetrics
    from serving.request_log import RequestLogWriter
    from serving.shadow import ShadowRunner

log = logging.getLogger("mlops.serve")


@dataclass(eq=False)
class ServerContext:
    """What the middleware and every handler share."""

    slot: ModelSlot
    config: ServeConfig
    metrics: "ServerMetrics"
    keys: "KeyStore | None" = None  # None: no auth
    canary: "CanaryRoute | None" = None  # empty until the registry starts a canary
    shadow: "ShadowRunner | None" = None
    request_log: "RequestLogWriter | None" = None  # None: nothing is logged, no feedback
    log_model: str | None = None  # the model's name in the request log (the registered name)
    draining: bool = False
    cut: int = 0  # requests cut by the drain timeout


def engine_spec(config: ServeConfig, profile: DeploymentProfile, threads: int | None = None) -> EngineSpec:
    """The engine for a version: `serve.engine`, else the one its profile names, with the configured limits."""
    engine = config.engine_for(profile)
    return EngineSpec(engine, threads=threads or config.threads or default_threads(),
                      max_batch_tokens=config.max_batch_tokens, max_batch_rows=config.max_batch_rows,
                      slice_steps=config.slice_steps, options=config.engine_options(engine, profile))


def create_app(model_dir: Path | str, profile: DeploymentProfile, *, model_name: str | None = None, engine=None,
               version: str | None = None, config: ServeConfig | None = None, keys=None, **parts):
    """The app serving `model_dir` under `profile`; `engine` may be shared (tests, benchmarks).

    `keys` (a `serving_auth.KeyStore`) turns API keys on; without it every route is open, which is what
    `mlops serve --no-auth` does for local use. `parts` go to `build_app` (request_log, shadow, log_model).
    """
    config = config or ServeConfig()
    model_dir = Path(model_dir)
    slot = ModelSlot(model_name or model_dir.name)
    slot.swap(engine or build_engine(model_dir, engine_spec(config, profile)), profile, version or slot.name, model_dir=model_dir)
    return build_app(slot, config, keys=keys, **parts)


def build_app(slot: ModelSlot, config: ServeConfig, *, keys=None, request_log=None, shadow=None,
              log_model: str | None = None):
    """The app for a model slot; `app.state.slot` is the slot a registry follower swaps versions into, and
    `app.state.canary` the canary route it loads a canary into.

    `request_log` (a started or unstarted `serving.request_log.RequestLogWriter`) logs every generation answer and turns
    /v1/feedback on; `shadow` (a `serving_shadow.ShadowRunner`) answers a share of requests again in the
    background. The app starts both and stops them when it shuts down.
    """
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException

    from serving.completions import View, context_limit, prepare_chat, prepare_completion, run
    from serving.http import ServingMiddleware
    from serving.request_rows import parse_feedback, request_messages
    from serving.streaming import stream

    slot.engine_factory = lambda folder, profile: build_engine(folder, engine_spec(config, profile))
    ctx = _context(slot, config, keys, request_log, shadow, log_model)
    metrics = ctx.metrics

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        await run_in_threadpool(_stop, ctx)

    app = FastAPI(title="mlops OpenAI-compatible server", version="1", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.state.slot, app.state.ctx, app.state.canary = slot, ctx, ctx.canary
    app.add_middleware(ServingMiddleware, ctx=ctx)

    def error(request: Request, err: ApiError) -> JSONResponse:
        rid = getattr(request.state, "request_id", "-")
        log.info("request_id=%s answered %d %s: %s", rid, err.status, err.code, err.message)
        capture = getattr(request.state, "capture", None)
        if capture is not None:
            capture["error"] = err.message
        return JSONResponse(err.body(rid), status_code=err.status)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError):
        return error(request, err)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        first = (err.errors() or [{}])[0]
        return error(request, ApiError(400, f"invalid request: {first.get('msg', 'malformed')}."))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException):
        return error(request, ApiError(err.status_code, str(err.detail), code="http_error"))

    def view(request: Request) -> View:
        return View(slot.name, request.state.serving, config)

    @app.get("/health")
    async def health():
        serving = slot.current
        return {"status": "ok", "model": slot.name, "version": serving.version if serving else None}

    @app.get("/ready")
    async def ready():
        ok, reason = slot.ready(config.ready_stall_seconds)
        if ctx.draining:
            ok, reason = False, "shutting down"
        serving = slot.current
        body = {"status": "ready" if ok else "not_ready", "reason": reason, "model": slot.name,
                "version": serving.version if serving else None}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus():
        payload, content_type = metrics.render()
        return Response(payload, media_type=content_type)

    def model_card(request: Request) -> dict:
        serving = request.state.serving
        return {"id": slot.name, "object": "model", "created": serving.loaded_at, "owned_by": "mlops",
                "version": serving.version, "max_model_len": context_limit(serving.profile, serving.engine),
                "engine": serving.engine.name, "quantization": serving.profile.quantization,
                "profile_hash": serving.profile.profile_hash()}

    @app.get("/v1/models")
    async def models(request: Request):
        return {"object": "list", "data": [model_card(request)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request):
        View(slot.name, request.state.serving, config).check_model(model_id)
        return model_card(request)

    @app.get("/tokenizer_info")
    async def tokenizer_info(request: Request):
        serving = request.state.serving
        info, template = serving.engine.tokenizer_info(), serving.engine.chat_template()
        return {
            "tokenizer_class": info.tokenizer_class, "eos_token": info.eos_token, "bos_token": info.bos_token,
            "pad_token": info.pad_token, "model_max_length": context_limit(serving.profile, serving.engine),
            "vocab_size": info.vocab_size,
            "chat_template": template, "chat_template_hash": chat_template_hash(template),
        }

    def _tokenize(v: View, raw: bytes) -> dict:
        body = parse_body(raw, TokenizeRequest)
        tokens = v.engine.tokenize(body.prompt, add_special_tokens=body.add_special_tokens)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": context_limit(v.profile, v.engine)}

    def _detokenize(v: View, raw: bytes) -> dict:
        body = parse_body(raw, DetokenizeRequest)
        return {"prompt": v.engine.detokenize(v.check_ids(body.tokens, "tokens"))}

    def as_json(work, *args) -> bytes:
        # Built and serialized off the event loop: a scoring response can hold thousands of logprobs.
        return json.dumps(work(*args)).encode()

    @app.post("/tokenize")
    async def tokenize(request: Request):
        payload = await run_in_threadpool(as_json, _tokenize, view(request), await request.body())
        return Response(payload, media_type="application/json")

    @app.post("/detokenize")
    async def detokenize(request: Request):
        payload = await run_in_threadpool(as_json, _detokenize, view(request), await request.body())
        return Response(payload, media_type="application/json")

    async def generate(request: Request, prepare):
        v = view(request)
        prep = await run_in_threadpool(prepare, v, await request.body())
        request.state.access["prompt_tokens"] = sum(len(p) for p in prep.prompts)
        capture = request.state.capture
        capture["scoring"] = not prep.chat and prep.body.echo
        capture["shadowable"] = not capture["scoring"] and len(prep.prompts) == 1
        capture["messages"] = request_messages(prep, v.engine)
        identity = getattr(request.state, "identity", None)
        capture["key"] = identity.name if identity is not None else None  # the key's name on the trace, never the key
        if prep.body.stream:
            return stream(v, prep, request, request.state.request_id)
        out = await run(v, prep, request, request.state.request_id)
        if out is None:  # the client went away; its work was cancelled
            return Response(status_code=499)
        request.state.access["completion_tokens"] = out["usage"]["completion_tokens"]
        capture["response"] = "\n".join(c["message"]["content"] if prep.chat else c["text"] for c in out["choices"])
        return Response(await run_in_threadpool(as_json, lambda: out), media_type="application/json")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, prepare_completion)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await generate(request, prepare_chat)

    @app.post("/v1/feedback")
    async def feedback(request: Request):
        if request_log is None:
            raise ApiError(404, "feedback is not taken here: this server keeps no request log "
                           "(serve.request_log.enabled is false).", code="feedback_disabled")
        identity = getattr(request.state, "identity", None)
        item = parse_feedback(await request.body(), identity.name if identity is not None else None)
        try:
            logged, owner = await run_in_threadpool(request_log.owner, item.request_id)
            if not logged:
                raise ApiError(404, f"request_id '{item.request_id}': no answer with this id is in the request log "
                               "(its traces); send the X-Request-ID of an answer from this service.",
                               param="request_id", code="request_not_found")
            if owner is not None and owner != item.source:
                raise ApiError(403, f"request_id '{item.request_id}' was answered for another API key, and feedback "
                               "is taken only from the key that asked; send it with that key.", param="request_id",
                               code="feedback_not_yours")
            status = await run_in_threadpool(request_log.write_feedback, item)
        except ApiError:
            raise
        except Exception as err:  # noqa: BLE001 - the database is unreachable: say so, keep serving
            log.error("request_id=%s feedback not stored: %s: %s", request.state.request_id, type(err).__name__, err)
            raise ApiError(503, "the feedback could not be stored (the tracking store holding the answer's trace "
                           "is unreachable or slow); try again later.", code="feedback_unavailable") from None
        return {"object": "feedback", "id": item.feedback_id, "request_id": item.request_id, "rating": item.rating,
                "status": status}

    return app


def _context(slot: ModelSlot, config: ServeConfig, keys, request_log, shadow, log_model) -> ServerContext:
    """The shared context, with an (empty) canary slot, and the request log and shadow started."""
    from serving.canary import CanaryRoute
    from serving.metrics import ServerMetrics

    metrics = ServerMetrics()
    metrics.watch_slot(slot)
    canary_slot = ModelSlot(f"{slot.name}#canary")
    canary_slot.engine_factory = slot.engine_factory
    ctx = ServerContext(slot, config, metrics, keys, canary=CanaryRoute(canary_slot, metrics), shadow=shadow,
                        request_log=request_log, log_model=log_model)
    if request_log is not None:
        request_log.on_count = lambda outcome, n: metrics.request_log_rows.labels(outcome).inc(n)
        request_log.on_feedback_count = lambda outcome: metrics.feedback.labels(outcome).inc()
        request_log.gateway_busy = lambda: bool(ctx.slot.inflight() or ctx.canary.slot.inflight())
        request_log.start()
    if shadow is not None:
        shadow.slot.engine_factory = slot.engine_factory
        shadow.attach(ctx).start()
    return ctx


def _stop(ctx: ServerContext) -> None:
    """Shadow first (its queue is dropped, counted), then the engines, then the log writes what it holds."""
    if ctx.shadow is not None:
        ctx.shadow.close()
    ctx.canary.slot.close()
    ctx.slot.close()
    if ctx.request_log is not None:
        ctx.request_log.close()


def serve(model_dir: Path | str, profile: DeploymentProfile, *, host: str = "127.0.0.1", port: int = 8000,
          model_name: str | None = None, version: str | None = None, threads: int | None = None,
          config: ServeConfig | None = None, keys=None, on_app=None, log_model: str | None = None,
          shadow=None) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit code (0: every running request finished).

    `shadow` (a `serving_shadow.ShadowTarget`) loads a candidate that answers `serve.shadow.share` of the requests
    again in the background; `log_model` names the model in the request log (`serve.request_log`).
    """
    from serving.request_log import RequestLogWriter
    from serving.signals import run_until_signal

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = config or ServeConfig()
    request_log = None
    if config.request_log.enabled:
        from mlops.requestlog import log_url
        from mlops.tracking import check_tracking_uri

        check_tracking_uri(log_url(config.request_log.database))  # an unreachable store fails now, not later
        request_log = RequestLogWriter.from_config(config.request_log)
    engine = build_engine(model_dir, engine_spec(config, profile, threads))
    runner = _shadow_runner(shadow, config, model_name or Path(model_dir).name) if shadow is not None else None
    app = create_app(model_dir, profile, model_name=model_name, engine=engine, version=version, config=config,
                     keys=keys, request_log=request_log, shadow=runner, log_model=log_model)
    if on_app is not None:  # e.g. a registry follower that swaps versions into app.state.slot
        on_app(app)
    return run_until_signal(app, host=host, port=port, drain_timeout=config.drain_timeout)


def _shadow_runner(target, config: ServeConfig, name: str):
    from serving.shadow import ShadowRunner

    slot = ModelSlot(f"{name}#shadow")
    if target.model_dir is not None:  # else empty until its follower swaps a candidate in
        slot.swap(build_engine(target.model_dir, engine_spec(config, target.profile)), target.profile, target.version,
                  model_dir=target.model_dir)
    log.info("shadow: version %s answers %.0f%% of requests in the background", target.version or "(none yet)",
             config.shadow.share * 100)
    return ShadowRunner(slot, share=config.shadow.share, queue_size=config.shadow.queue,
                        timeout=config.shadow.timeout_seconds, idle_ms=config.shadow.idle_ms)
