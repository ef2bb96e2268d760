"""Token-by-token decoding for one or several generation requests at once, with a KV cache.

Rows that decode together form a `Batch`: their contexts are left-padded (as HF `generate` does) and one
forward pass per step serves every row. A row carries its whole decoding state (tokens so far, sampling
generator, text, what was streamed), so the engine can take it out of a batch between steps and put it into
another one later: the new batch re-reads the row's prompt plus its tokens in one prefill. That is what lets
a short request join or overtake a long one instead of waiting for it to finish.

A failure that belongs to one row (its sampling) ends that row only; a failing forward pass raises, and the
engine retries the rows one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.engine_types import Delta
from serving.engines.hf.detokenize import IncrementalText


@dataclass(eq=False)
class Row:
    job: object  # generation._Job: ids, params, on_text, cancelled, future
    generator: object
    stops: list[str]
    decoder: IncrementalText
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[dict[int, float]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # text length once token i is decoded
    text: str = ""
    emitted: int = 0  # characters of `text` streamed
    reported: int = 0  # tokens streamed
    finish: str | None = None
    cut: bool = False  # the text ends at a stop string
    error: BaseException | None = None

    @classmethod
    def start(cls, job, tokenizer) -> Row:
        import torch

        params = job.params
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        return cls(job, generator, [s for s in params.stop if s], IncrementalText(tokenizer))

    def context(self) -> list[int]:
        return [*self.job.ids, *self.tokens]

    def is_cancelled(self) -> bool:
        return self.job.cancelled.is_set() or self.job.future.cancelled()

    def fail(self, err: BaseException) -> None:
        self.error, self.finish = err, "error"

    def push(self, token: int, logprobs, eos_ids: set[int]) -> None:
        """Account one sampled token; sets `finish` when the row is done."""
        params = self.job.params
        if params.logprobs:
            vals, idx = logprobs.topk(params.logprobs)
            self.tops.append(dict(zip(idx.tolist(), vals.tolist(), strict=True)))
        if token in eos_ids:
            self.finish = "stop"
            return
        self.tokens.append(token)
        self.logprobs.append(float(logprobs[token].item()))
        before = len(self.text)
        self.text += self.decoder.push(token)
        self.ends.append(len(self.text))
        if params.stop and len(self.text) > before:
            # Only the new text and the stop's length before it can hold a stop string that was not there.
            window = max(0, before - max(len(s) for s in params.stop))
            hits = [i for s in params.stop if (i := self.text.find(s, window)) >= 0]
            if hits:
                self.text, self.finish, self.cut = self.text[: min(hits)], "stop", True
                return
        self._stream(len(self.text) - held_back(self.text, self.stops))
        if len(self.tokens) >= params.max_tokens:
            self.finish = "length"

    def _stream(self, safe: int, final: bool = False) -> None:
        """Send the text up to `safe` (held back: what could still become a stop string)."""
        if not self.job.on_text or (safe <= self.emitted and not final):
            return
        safe = max(safe, self.emitted)
        done = len(self.tokens) if final else sum(1 for end in self.ends if end <= safe)
        start = self.reported
        texts = [self.text[(self.ends[i - 1] if i else 0) : min(self.ends[i], len(self.text))]
                 for i in range(start, done)]
        tops = self.tops[start:done] if self.job.params.logprobs else []
        delta = Delta(self.text[self.emitted : safe], self.tokens[start:done], self.logprobs[start:done], tops, texts)
        self.emitted, self.reported = safe, done
        if delta.text or delta.tokens:
            self.job.on_text(delta)

    def result(self):
        from serving.engine_types import Generated

        if not self.cut:  # an incomplete character at the very end is kept as the decoder gives it
            self.text += self.decoder.flush()
        if self.ends:
            self.ends[-1] = max(self.ends[-1], len(self.text))
        self._stream(len(self.text), final=True)
        return Generated(self.text, self.tokens, self.logprobs, self.tops[: len(self.tokens)], self.finish or "length")


def held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` that could still become a stop string: the longest suffix that is a
    prefix of one. Only those wait; everything before streams at once."""
    keep = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), keep, -1):
            if text.endswith(stop[:k]):
                keep = k
                break
    return keep


def pick(logits, params, generator) -> int:
    """Greedy at temperature 0; otherwise sample in a numerically safe way for any positive temperature."""
    import torch

    if params.temperature <= 0:
        return int(torch.argmax(logits))
    # Subtracting the max first keeps every scaled logit <= 0: a tiny temperature sends the others to -inf
    # (probability 0), never to +inf or NaN, so it degrades to greedy instead of failing.
    scaled = (logits - logits.max()) / params.temperature
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, sorted_ids = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < params.top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(0, sorted_ids[keep], sorted_probs[keep])
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(probs, 1, generator=generator))


class Batch:
    """Rows decoding together: one prefill of their contexts, then one forward pass per step."""

    def __init__(self, model, rows: list[Row], pad_id: int) -> None:
        import torch

        self.model, self.rows, self.pad_id = model, rows, pad_id
        contexts = [row.context() for row in rows]
        width = max(len(c) for c in contexts)
        if len(rows) == 1:
            inputs, self.mask, self.positions = torch.tensor(contexts, dtype=torch.long), None, None
        else:
            inputs = torch.full((len(rows), width), pad_id, dtype=torch.long)
            self.mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, ctx in enumerate(contexts):
                inputs[i, width - len(ctx) :] = torch.tensor(ctx, dtype=torch.long)
                self.mask[i, width - len(ctx) :] = 1
            self.positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        self.tokens = sum(len(c) for c in contexts)
        self.cache = None
        self._forward(inputs)

    def _forward(self, inputs) -> None:
        out = self.model(input_ids=inputs, attention_mask=self.mask, position_ids=self.positions,
                         cache=self.cache, use_cache=True)
        self.cache = out.cache
        self.logits = out.logits[:, -1].float()

    def done(self) -> bool:
        return all(row.finish for row in self.rows)

    def step(self, eos_ids: set[int]) -> list[Row]:
        """Sample one token for every live row and advance; returns the rows that finished in this step."""
        import torch

        finished, next_ids = [], []
        for i, row in enumerate(self.rows):
            if row.finish is None and row.is_cancelled():
                row.finish = "cancelled"
                finished.append(row)
            if row.finish:
                next_ids.append(self.pad_id)  # finished rows ride along; their outputs are ignored
                continue
            try:
                token = pick(self.logits[i], row.job.params, row.generator)
                row.push(token, torch.log_softmax(self.logits[i], dim=-1), eos_ids)
            except Exception as err:  # noqa: BLE001 - this row's own failure; its neighbours go on
                row.fail(err)
                token = self.pad_id
            next_ids.append(token)
            if row.finish:
                finished.append(row)
        if not self.done():
            if self.mask is not None:
                self.mask = torch.cat([self.mask, torch.ones((len(self.rows), 1), dtype=torch.long)], dim=1)
                self.positions = self.positions[:, -1:] + 1
            self._forward(torch.tensor(next_ids, dtype=torch.long).unsqueeze(1))
        return finished
