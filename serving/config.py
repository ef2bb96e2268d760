"""The `serve:` config section: engine, limits, scheduling, shutdown and auth of `mlops serve`. Owned by serving."""

from __future__ import annotations

from pydantic import Field, field_validator

from mlops.config import StrictModel
from mlops.profile import known_quantization

DEFAULT_KEYS_FILE = ".mlops/serve/api_keys.json"


class AuthConfig(StrictModel):
    enabled: bool = Field(True, description="require `Authorization: Bearer <key>` (off only with --no-auth)")
    keys_file: str = Field(
        DEFAULT_KEYS_FILE, description="hashed API keys (`mlops serve keys add`); relative to the project home"
    )
    open_metrics: bool = Field(False, description="serve /metrics without a key (a scraper on a private network)")
    identities: bool = Field(
        False, description="also accept `Bearer <user>:<password>` of a registry identity (MLOPS_IDENTITIES, "
        "configs/registry/identities.yaml): people sign in with the password they use for the registry"
    )


class RequestLogConfig(StrictModel):
    enabled: bool = Field(True, description="log every generation request and answer (PII-scrubbed) for shadow "
                          "reports, spot-checks and `mlops data harvest`; eval servers turn it off")
    database: str | None = Field(
        None, description="MLflow tracking URI the answers are written to as traces (default: MLOPS_REQUEST_LOG_DB, "
        "then the tracking URI)"
    )
    retention_days: float = Field(30.0, gt=0, description="rows older than this are pruned at start and daily")
    queue: int = Field(10000, ge=1, description="rows waiting for the writer; beyond it rows are dropped (counted) "
                       "rather than delaying a user")
    batch_rows: int = Field(200, ge=1, description="rows written per database transaction")
    flush_seconds: float = Field(0.5, gt=0, description="longest a row waits before it is written")
    idle_lag_seconds: float = Field(
        5.0, ge=0, description="traces wait up to this long for CPU time nothing else wants (the writer runs at idle "
        "priority); an older backlog is written at nice 10, competing with the gateway. 0: always nice 10"
    )
    drain_seconds: float = Field(
        60.0, ge=0, description="on SIGTERM, after the engines drained, the backlog is written for up to this long; "
        "rows left then are kept in a spool file that the next server on the same store writes first"
    )


class ShadowConfig(StrictModel):
    share: float = Field(0.0, ge=0.0, le=1.0, description="share of user requests also answered by the shadow "
                         "model in the background (`--shadow-share`)")
    queue: int = Field(16, ge=1, description="shadow requests waiting; more are dropped (counted), never waited for")
    timeout_seconds: float = Field(120.0, gt=0, description="a shadow answer not done this long after it started "
                                   "is cancelled and counted as timed out")
    idle_ms: float = Field(50.0, ge=0, description="the user-facing engines must have been idle this long before "
                           "the shadow takes a step (so it never fills the short gaps of steady traffic)")
    scorer: str | None = Field(None, description="win-rate scorer of `mlops shadow report` (e.g. reference_overlap: "
                               "closer to the corrections users sent wins)")


    @field_validator("scorer")
    @classmethod
    def _known_scorer(cls, name: str | None) -> str | None:
        if name is not None:
            from evaluation.shadow import SCORERS

            SCORERS.get(name)  # unknown: "did you mean ...?"
        return name


class LlamaCppConfig(StrictModel):
    quantization: str | None = Field(None, description="GGUF type an HF folder is converted to on llamacpp (f16, "
                                     "q8_0, q4_k_m); default: the profile's quantization, else q8_0. A .gguf "
                                     "artifact is served as it is")
    parallel: int = Field(16, ge=1, le=256, description="llama-server slots: generations decoded together")
    context_per_slot: int | None = Field(None, ge=64, description="tokens one request may hold (each slot's KV "
                                         "cache, the scorer's context); default: the profile's max_context, at "
                                         "most 4096. Longer requests get a 400 naming the limit")
    batch_threads: int | None = Field(None, ge=1, description="threads for prompt processing (default: threads)")
    start_timeout: float = Field(120.0, gt=0, description="seconds llama-server may take to load the model")

    @field_validator("quantization")
    @classmethod
    def _known_quantization(cls, value: str | None) -> str | None:
        return known_quantization(value)


class VllmConfig(StrictModel):
    url: str | None = Field(None, description="base URL of the vLLM OpenAI server (its own image, Dockerfile.vllm), "
                            "e.g. http://vllm:8000; the gateway adds auth, limits, logs and routing in front")
    model: str | None = Field(None, description="the model name vLLM serves (`--served-model-name`, or a LoRA "
                              "module name from `--lora-modules`); default: the only one it lists")
    api_key_env: str = Field("VLLM_API_KEY", description="environment variable holding vLLM's --api-key, if any")
    timeout_seconds: float = Field(600.0, gt=0, description="longest a request to vLLM may take")


class ServeConfig(StrictModel):
    engine: str | None = Field(None, description="inference engine (`mlops serve --engine`): hf (float32 torch, the "
                               "reference), llamacpp (llama.cpp on CPU, GGUF), vllm (GPU, its own image); default: "
                               "the one the version's deployment profile names")
    threads: int | None = Field(None, ge=1, description="compute threads (default: cores - 1, or "
                                "MLOPS_SERVE_THREADS): a busy neighbour stalls a team as wide as the machine")
    llamacpp: LlamaCppConfig = Field(default_factory=LlamaCppConfig)
    vllm: VllmConfig = Field(default_factory=VllmConfig)
    max_body_bytes: int = Field(4 * 2**20, ge=1024, description="largest request body; bigger ones get 413")
    max_prompts: int = Field(128, ge=1, description="prompts in one /v1/completions request")
    max_request_tokens: int = Field(
        32768, ge=16, description="prompt tokens plus requested completion tokens of one request, all prompts together"
    )
    max_batch_tokens: int = Field(4096, ge=64, description="tokens the engine runs in one batch")
    max_batch_rows: int = Field(8, ge=1, description="generation requests decoded together")
    slice_steps: int = Field(
        16, ge=1, description="decode steps before waiting requests may join or take a turn (fairness)"
    )
    drain_timeout: float = Field(
        30.0, ge=0, description="seconds SIGTERM waits for running requests before cutting them (exit 0 when drained)"
    )
    ready_stall_seconds: float = Field(
        120.0, gt=0, description="/ready fails when the engine made no progress this long with work waiting"
    )
    access_log: bool = Field(True, description="one JSON line per request on the `mlops.serve.access` logger")
    auth: AuthConfig = Field(default_factory=AuthConfig)
    request_log: RequestLogConfig = Field(default_factory=RequestLogConfig)
    shadow: ShadowConfig = Field(default_factory=ShadowConfig)

    def engine_for(self, profile) -> str:
        """The engine to serve `profile`'s version on: this config's, else the profile's."""
        return self.engine or profile.engine

    def engine_options(self, engine: str, profile) -> dict:
        """The settings of `engine` (its own section, when it has one), the profile's quantization filled in."""
        section = getattr(self, engine, None)
        options = section.model_dump() if isinstance(section, StrictModel) else {}
        if engine == "llamacpp":
            options["quantization"] = options.get("quantization") or profile.quantization or "q8_0"
            # a slot's KV cache and the scorer's logits grow with it: the profile's context, at most 4096
            options["context_per_slot"] = options.get("context_per_slot") or min(profile.max_context, 4096)
        return options

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, name: str | None) -> str | None:
        from serving.engine import known_engine

        return known_engine(name)
