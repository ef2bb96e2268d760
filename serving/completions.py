"""Handlers of /v1/completions and /v1/chat/completions on top of the engine.

Each request is prepared in a worker thread (JSON parsing, validation, tokenization, chat template, limits),
so a large body never stalls the event loop, and is refused with a 400 naming the field before it reaches
the engine. The engine work is cancelled when the client disconnects, for every kind of request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from serving.api_schema import ApiError, ChatRequest, CompletionRequest, parse_body
from serving.engine import GenParams


def context_limit(profile, engine) -> int:
    """Tokens one request may hold: the profile's context, or less where the engine holds less."""
    return min(profile.max_context, getattr(engine, "max_context", None) or profile.max_context)


class View:
    """A request's view of the server: the model name, the serving it leased, the configured limits."""

    def __init__(self, name: str, serving, config) -> None:
        self.name, self.serving, self.config = name, serving, config
        self.engine, self.profile = serving.engine, serving.profile
        self.vocab = self.engine.vocab_size

    def check_model(self, requested: str | None) -> None:
        if requested is not None and requested != self.name:
            raise ApiError(404, f"model '{requested}' is not served here; available: {self.name}.", param="model",
                           code="model_not_found")

    def check_ids(self, ids: list[int], param: str) -> list[int]:
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise ApiError(400, f"'{param}' holds token ids {bad[:5]} outside the vocabulary (0..{self.vocab - 1}).",
                           param=param)
        return ids

    def max_tokens(self, requested: int | None, prompt_len: int, param: str = "max_tokens") -> int:
        limit = context_limit(self.profile, self.engine)
        if prompt_len >= limit:
            raise ApiError(400, f"the prompt has {prompt_len} tokens; this model's context is {limit} tokens, "
                           "which must also hold at least one generated token.", param="prompt",
                           code="context_length_exceeded")
        if requested is None:
            return min(self.profile.sampling.max_tokens, limit - prompt_len)
        if requested <= 0:
            raise ApiError(400, f"'{param}' must be at least 1; got {requested}.", param=param)
        if prompt_len + requested > limit:
            raise ApiError(400, f"'{param}' is {requested} but the prompt has {prompt_len} tokens and the context is "
                           f"{limit}; at most {limit - prompt_len} tokens can be generated.", param=param,
                           code="context_length_exceeded")
        return requested

    def check_request_tokens(self, prompts: list[list[int]], limits: list[int]) -> None:
        total, cap = sum(map(len, prompts)) + sum(limits), self.config.max_request_tokens
        if total > cap:
            raise ApiError(400, f"this request asks for {total} tokens (prompts plus completions); the limit per "
                           f"request is {cap} (serve.max_request_tokens). Split it into smaller requests.",
                           param="prompt", code="request_too_large")

    def params(self, body, max_tokens: int, stops: list[str], logprobs: int | None) -> GenParams:
        sampling = self.profile.sampling
        return GenParams(
            max_tokens=max_tokens,
            temperature=sampling.temperature if body.temperature is None else body.temperature,
            top_p=sampling.top_p if body.top_p is None else body.top_p,
            seed=sampling.seed if body.seed is None else body.seed,
            stop=stops, logprobs=logprobs,
        )


@dataclass
class Prepared:
    body: object
    prompts: list[list[int]]
    params: list[GenParams]
    include_usage: bool
    chat: bool


def prepare_completion(view: View, raw: bytes) -> Prepared:
    body = parse_body(raw, CompletionRequest)
    view.check_model(body.model)
    stops, include_usage = body.stops(), body.include_usage()
    if body.stream and body.echo:
        raise ApiError(400, "'echo' is not supported with 'stream'; ask without streaming.", param="echo",
                       code="unsupported_parameter")
    prompts = _prompts(view, body)
    if body.stream and len(prompts) > 1:
        raise ApiError(400, "streaming takes one prompt; send several prompts without 'stream'.", param="prompt",
                       code="unsupported_parameter")
    limits = [view.max_tokens(body.max_tokens, len(p)) for p in prompts]
    view.check_request_tokens(prompts, limits)
    params = [view.params(body, n, stops, body.logprobs) for n in limits]
    return Prepared(body, prompts, params, include_usage, chat=False)


def _prompts(view: View, body: CompletionRequest) -> list[list[int]]:
    prompt = body.prompt
    if isinstance(prompt, str):
        prompts = [prompt]
    elif not prompt:
        raise ApiError(400, "'prompt' is empty; send a string, a list of token ids or a list of either.", param="prompt")
    elif isinstance(prompt[0], int):
        return [view.check_ids(prompt, "prompt")]
    else:
        prompts = list(prompt)
    if len(prompts) > view.config.max_prompts:
        raise ApiError(400, f"'prompt' holds {len(prompts)} prompts; the limit per request is "
                       f"{view.config.max_prompts} (serve.max_prompts).", param="prompt", code="request_too_large")
    out = []
    for i, item in enumerate(prompts):
        ids = item if isinstance(item, list) else view.engine.tokenize(item)
        if not ids:
            raise ApiError(400, f"prompt {i} is empty (no tokens); send at least one token.", param="prompt")
        out.append(view.check_ids(ids, "prompt"))
    return out


def prepare_chat(view: View, raw: bytes) -> Prepared:
    body = parse_body(raw, ChatRequest)
    view.check_model(body.model)
    stops, include_usage = list(dict.fromkeys([*body.stops(), *view.profile.stop])), body.include_usage()
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true.", param="top_logprobs")
    ids = chat_ids(view, body)
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    limit = view.max_tokens(requested, len(ids), param)
    view.check_request_tokens([ids], [limit])
    top = (body.top_logprobs or 1) if body.logprobs else None
    return Prepared(body, [ids], [view.params(body, limit, stops, top)], include_usage, chat=True)


def chat_ids(view: View, body: ChatRequest) -> list[int]:
    if not body.messages:
        raise ApiError(400, "'messages' is empty; send at least one message.", param="messages")
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
    if view.profile.system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": view.profile.system_prompt})
    return view.engine.chat_prompt(messages)


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def run(view: View, prep: Prepared, request, rid: str):
    """Run a prepared request on the engine; None when the client went away (its work is cancelled)."""
    from starlette.concurrency import run_in_threadpool

    from serving.http import until_done

    engine, body, owner = view.engine, prep.body, object()  # owner: this request's fair share
    scoring = not prep.chat and body.echo
    scoring_only = scoring and all(p.max_tokens == 1 and p.temperature == 0 for p in prep.params)
    futures = [engine.score(prep.prompts, body.logprobs or 1, owner=owner)] if scoring else []
    jobs = [] if scoring_only else [engine.generate(p, gp, owner=owner) for p, gp in zip(prep.prompts, prep.params,
                                                                                          strict=True)]
    futures += [job.future for job in jobs]
    started = request.state.access
    results = await until_done(request, futures, lambda: [job.cancelled.set() for job in jobs])
    if results is None:
        return None
    scored = results[0] if scoring else [None] * len(prep.prompts)
    gens = results[1:] if scoring else results
    gens = gens or [None] * len(prep.prompts)
    firsts = [job.first_token_at for job in jobs if job.first_token_at]
    if firsts:
        started["ttft_ms"] = round((min(firsts) - request.state.started) * 1000, 1)
    build = _completion_body if not prep.chat else _chat_body
    return await run_in_threadpool(build, view, prep, scored, gens, rid)


def _completion_body(view: View, prep: Prepared, scored: list, gens: list, rid: str) -> dict:
    from serving.logprobs import completion_logprobs

    engine, body = view.engine, prep.body
    choices, completion_tokens = [], 0
    for index, (ids, score, gen) in enumerate(zip(prep.prompts, scored, gens, strict=True)):
        prompt_text = engine.detokenize(ids) if body.echo else ""
        if gen is None:  # scoring: the one generated token is the greedy one
            new_text, finish, completion_tokens = engine.token_piece(score.tokens[-1]), "length", completion_tokens + 1
        else:
            new_text, finish, completion_tokens = gen.text, gen.finish_reason, completion_tokens + len(gen.tokens)
        logprobs = completion_logprobs(engine, score, gen) if body.logprobs is not None else None
        choices.append({"index": index, "text": prompt_text + new_text, "logprobs": logprobs, "finish_reason": finish})
    return {
        "id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()), "model": view.name,
        "choices": choices, "usage": usage(sum(len(p) for p in prep.prompts), completion_tokens),
    }


def _chat_body(view: View, prep: Prepared, _scored: list, gens: list, rid: str) -> dict:
    from serving.logprobs import chat_logprobs

    gen = gens[0]
    choice = {"index": 0, "message": {"role": "assistant", "content": gen.text}, "logprobs": None,
              "finish_reason": gen.finish_reason}
    if prep.body.logprobs:
        choice["logprobs"] = {"content": chat_logprobs(view.engine, gen.tokens, gen.token_logprobs, gen.top_logprobs)}
    return {
        "id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(time.time()), "model": view.name,
        "choices": [choice], "usage": usage(len(prep.prompts[0]), len(gen.tokens)),
    }
