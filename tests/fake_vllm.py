"""A stand-in for vLLM's OpenAI server, speaking its documented formats, answered by the real `hf` engine.

What the `vllm` engine relies on, as vLLM documents it: token-id prompts; `echo` + `logprobs` returning prompt
logprobs with a null first entry; `return_tokens_as_token_ids` naming tokens `token_id:<id>` (keys of
`top_logprobs` too); SSE streaming ending in `data: [DONE]`; `/tokenize` with a prompt or chat `messages`
(`add_generation_prompt`) answering `{count, max_model_len, tokens, token_strs}`; `/detokenize` answering
`{prompt}`; `/tokenizer_info`; `/v1/models`; `/health`. Aborted streams are counted (vLLM aborts the request).
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' `Request` annotations at runtime.

import asyncio
import json

from serving.engine import GenParams


def fake_vllm_app(engine, served_name: str = "support-bot-lora", max_model_len: int = 512):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    app = FastAPI()
    app.state.requests, app.state.aborted = [], 0
    label = "token_id:{}".format

    def block(ids, lps, tops) -> dict:
        return {"tokens": [label(i) for i in ids], "token_logprobs": lps, "text_offset": [0] * len(ids),
                "top_logprobs": [None if t is None else {label(k): v for k, v in t.items()} for t in tops]}

    @app.get("/health")
    async def health():
        return {}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served_name, "object": "model", "max_model_len": max_model_len}]}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        info = engine.tokenizer_info()
        return {"tokenizer_class": info.tokenizer_class, "eos_token": info.eos_token, "bos_token": info.bos_token,
                "pad_token": info.pad_token, "chat_template": engine.chat_template(), "model_max_length": max_model_len}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        if "messages" in body:
            assert body["add_generation_prompt"] is True
            ids = engine.chat_prompt(body["messages"])
        else:
            ids = engine.tokenize(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))
        return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        return {"prompt": engine.detokenize((await request.json())["tokens"])}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        app.state.requests.append(body)
        if body.get("model") != served_name:
            return JSONResponse({"object": "error", "message": f"The model `{body.get('model')}` does not exist.",
                                 "type": "NotFoundError", "code": 404}, status_code=404)
        assert body["return_tokens_as_token_ids"] is True
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        if body.get("echo"):
            scored = await run_in_threadpool(lambda: engine.score(prompts, body["logprobs"]).result(60))
            choices = [{"index": i, "text": engine.detokenize(s.tokens), "finish_reason": "length", "stop_reason": None,
                        "logprobs": block(s.tokens, s.token_logprobs, s.top_logprobs)} for i, s in enumerate(scored)]
            return {"id": "cmpl-x", "object": "text_completion", "model": served_name, "choices": choices}
        params = GenParams(max_tokens=body["max_tokens"], temperature=body["temperature"], top_p=body["top_p"],
                           seed=body.get("seed"), stop=body.get("stop") or [], logprobs=body.get("logprobs"))
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        handle = engine.generate(prompts[0], params, on_text=lambda d: loop.call_soon_threadsafe(queue.put_nowait, d))
        handle.future.add_done_callback(lambda _f: loop.call_soon_threadsafe(queue.put_nowait, None))

        async def events():
            try:
                while (delta := await queue.get()) is not None:
                    choice = {"index": 0, "text": delta.text, "finish_reason": None,
                              "logprobs": block(delta.tokens, delta.logprobs, delta.top_logprobs or [None] * len(delta.tokens))}
                    yield f"data: {json.dumps({'id': 'cmpl-x', 'object': 'text_completion', 'choices': [choice]})}\n\n"
                done = handle.future.result()
                final = {"index": 0, "text": "", "logprobs": None, "finish_reason": done.finish_reason}
                yield f"data: {json.dumps({'id': 'cmpl-x', 'object': 'text_completion', 'choices': [final]})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                if not handle.future.done():
                    app.state.aborted += 1
                    handle.cancel()

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
