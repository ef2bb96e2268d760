"""Handlers of /v1/completions and /v1/chat/completions on top of the engine."""

from __future__ import annotations

import asyncio
import time

from evaluation.api_schema import ApiError, ChatRequest, CompletionRequest
from evaluation.generation import GenParams
from evaluation.server import _State, logprobs_block, sse, wait


def _prompts(state: _State, body: CompletionRequest) -> list[list[int]]:
    prompt = body.prompt
    tok = state.engine.tokenizer
    if isinstance(prompt, str):
        prompts = [prompt]
    elif not prompt:
        raise ApiError(400, "'prompt' is empty; send a string, a list of token ids or a list of either.", param="prompt")
    elif isinstance(prompt[0], int):
        return [state.check_ids(prompt, "prompt")]
    else:
        prompts = list(prompt)
    out = []
    for item in prompts:
        ids = item if isinstance(item, list) else tok(item, add_special_tokens=False).input_ids
        if not ids:
            raise ApiError(400, "a prompt is empty (no tokens); send at least one token.", param="prompt")
        out.append(state.check_ids(ids, "prompt"))
    return out


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def complete(state: _State, body: CompletionRequest, rid: str):
    state.check_model(body.model)
    prompts = _prompts(state, body)
    stops = body.stops()
    limits = [state.max_tokens(body.max_tokens, len(p)) for p in prompts]
    params = [state.params(body, n, stops, body.logprobs) for n in limits]
    engine = state.engine
    if body.stream:
        if len(prompts) > 1 or body.echo:
            raise ApiError(400, "streaming takes one prompt and no echo.", param="stream")
        return _stream(state, rid, prompts[0], params[0], chat=False)
    scoring_only = body.echo and all(n == 1 and p.temperature == 0 for n, p in zip(limits, params, strict=True))
    scored = await wait(engine.score(prompts, body.logprobs or 1)) if body.echo else [None] * len(prompts)
    if scoring_only:
        gens = [None] * len(prompts)
    else:
        gens = await asyncio.gather(*(wait(engine.generate(p, gp).future) for p, gp in zip(prompts, params, strict=True)))
    choices, completion_tokens = [], 0
    for index, (ids, score, gen) in enumerate(zip(prompts, scored, gens, strict=True)):
        prompt_text = engine.tokenizer.decode(ids) if body.echo else ""
        if gen is None:  # scoring: the one generated token is the greedy one
            new_text, finish, completion_tokens = engine.token_text(score.tokens[-1]), "length", completion_tokens + 1
        else:
            new_text, finish, completion_tokens = gen.text, gen.finish_reason, completion_tokens + len(gen.tokens)
        logprobs = None
        if body.logprobs is not None:
            logprobs = logprobs_block(engine, score, gen)
        choices.append({"index": index, "text": prompt_text + new_text, "logprobs": logprobs, "finish_reason": finish})
    return {
        "id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()), "model": state.name,
        "choices": choices, "usage": _usage(sum(len(p) for p in prompts), completion_tokens),
    }


def chat_ids(state: _State, body: ChatRequest) -> list[int]:
    if not body.messages:
        raise ApiError(400, "'messages' is empty; send at least one message.", param="messages")
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in body.messages]
    if state.profile.system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": state.profile.system_prompt})
    tok = state.engine.tokenizer
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False).input_ids


async def chat_complete(state: _State, body: ChatRequest, rid: str):
    state.check_model(body.model)
    ids = chat_ids(state, body)
    stops = list(dict.fromkeys([*body.stops(), *state.profile.stop]))
    requested = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    top = (body.top_logprobs or 1) if body.logprobs else None
    params = state.params(body, state.max_tokens(requested, len(ids), param), stops, top)
    if body.stream:
        return _stream(state, rid, ids, params, chat=True)
    gen = await wait(state.engine.generate(ids, params).future)
    choice = {"index": 0, "message": {"role": "assistant", "content": gen.text}, "finish_reason": gen.finish_reason}
    if body.logprobs:
        choice["logprobs"] = {"content": [
            {"token": state.engine.token_text(t), "logprob": lp,
             "top_logprobs": [{"token": state.engine.token_text(k), "logprob": v} for k, v in top_.items()]}
            for t, lp, top_ in zip(gen.tokens, gen.token_logprobs, gen.top_logprobs, strict=False)
        ]}
    return {
        "id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(time.time()), "model": state.name,
        "choices": [choice], "usage": _usage(len(ids), len(gen.tokens)),
    }


def _stream(state: _State, rid: str, ids: list[int], params: GenParams, *, chat: bool):
    """Server-sent events: text deltas as the worker produces them, a final chunk with the reason, [DONE]."""
    from fastapi.responses import StreamingResponse

    loop = asyncio.get_running_loop()
    deltas: asyncio.Queue[str | None] = asyncio.Queue()
    job = state.engine.generate(ids, params, on_text=lambda text: loop.call_soon_threadsafe(deltas.put_nowait, text))
    job.future.add_done_callback(lambda _f: loop.call_soon_threadsafe(deltas.put_nowait, None))
    created = int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{rid}", "object": kind, "created": created, "model": state.name}

    def chunk(text: str | None, finish: str | None, first: bool = False) -> dict:
        if chat:
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return {**base, "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}

    async def events():
        try:
            if chat:
                yield sse(chunk(None, None, first=True))
            while (text := await deltas.get()) is not None:
                yield sse(chunk(text, None))
            try:
                gen = job.future.result()
                final = chunk(None, gen.finish_reason)
                final["usage"] = _usage(len(ids), len(gen.tokens))
                yield sse(final)
            except Exception as err:  # noqa: BLE001 - reported in-band: the status line is already sent
                yield sse({"error": {"message": f"generation failed: {err}", "type": "server_error"}, "request_id": rid})
            yield sse("[DONE]")
        finally:
            job.cancelled.set()  # a client that went away stops the generation

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
