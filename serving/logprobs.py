"""OpenAI `logprobs` blocks (completions and chat) from engine results, multi-byte characters kept whole."""

from __future__ import annotations

from serving.engine import REPLACEMENT


def sequence_texts(engine, ids: list[int]) -> list[str]:
    """One string per token of a sequence, joining to its text.

    Most tokens decode on their own (cached per id); a run of tokens that each hold part of a character
    (U+FFFD on their own) is decoded together and its text given to the run's last token.
    """
    texts = [engine.token_piece(i) for i in ids]
    i = 0
    while i < len(texts):
        if REPLACEMENT not in texts[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(texts) and REPLACEMENT in texts[j + 1]:
            j += 1
        texts[i : j + 1] = [""] * (j - i) + [engine.detokenize(ids[i : j + 1])]
        i = j + 1
    return texts


def completion_logprobs(engine, scored, gen, offset0: int = 0) -> dict:
    """Echoed prompt tokens first (when scored), then the generated ones."""
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
    texts = sequence_texts(engine, ids)
    return {"tokens": texts, "token_logprobs": lps, "top_logprobs": top_dicts(engine, tops),
            "text_offset": offsets(texts, offset0)}


def top_dicts(engine, tops: list) -> list:
    return [None if t is None else {engine.token_text(k): v for k, v in t.items()} for t in tops]


def offsets(texts: list[str], start: int = 0) -> list[int]:
    out, pos = [], start
    for piece in texts:
        out.append(pos)
        pos += len(piece)
    return out


def chat_logprobs(engine, tokens: list[int], lps: list[float], tops: list, texts: list[str] | None = None) -> list:
    """`choices[].logprobs.content` entries of a chat completion (or of one streamed chunk)."""
    texts = texts if texts is not None else sequence_texts(engine, tokens)
    entries = []
    for k, (lp, text) in enumerate(zip(lps, texts, strict=True)):
        top = tops[k] if k < len(tops) and tops[k] else {}
        entries.append({
            "token": text, "logprob": lp, "bytes": list(text.encode("utf-8")),
            "top_logprobs": [{"token": engine.token_text(i), "logprob": v, "bytes": engine.token_bytes(i)}
                             for i, v in top.items()],
        })
    return entries
