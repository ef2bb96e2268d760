"""Token-by-token decoding for one or several generation requests at once, with a KV cache.

One request decodes unpadded. Several requests that wait together decode as one left-padded batch (as HF
`generate` does): one forward pass per step serves every row, which is what makes concurrent chat
requests cheaper than running them one after another. Each row keeps its own sampling generator, stop
strings, streaming callback and cancellation.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Row:
    job: object
    generator: object
    holdback: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[dict[int, float]] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    finish: str | None = None

    def push(self, token: int, logprobs, tokenizer, eos_ids: set[int]) -> None:
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
        self.text = tokenizer.decode(self.tokens, skip_special_tokens=True)
        hits = [self.text.find(s) for s in params.stop if s and s in self.text]
        if hits:
            self.text, self.finish = self.text[: min(hits)], "stop"
            return
        # Hold back what could still become a stop string or half of a multi-byte character.
        safe = len(self.text) - self.holdback
        if self.text.endswith("\ufffd"):
            safe = min(safe, len(self.text) - 1)
        if self.job.on_text and safe > self.emitted:
            self.job.on_text(self.text[self.emitted : safe])
            self.emitted = safe
        if len(self.tokens) >= params.max_tokens:
            self.finish = "length"

    def close(self):
        from evaluation.generation import Generated

        if self.job.on_text and len(self.text) > self.emitted:
            self.job.on_text(self.text[self.emitted :])
        return Generated(self.text, self.tokens, self.logprobs, self.tops[: len(self.tokens)], self.finish or "length")


def pick(logits, params, generator) -> int:
    import torch

    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, sorted_ids = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < params.top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter(0, sorted_ids[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=generator))


def generate_batch(model, tokenizer, eos_ids: set[int], pad_id: int, jobs: list) -> list:
    """Decode every job; returns one `Generated` per job, in order."""
    import torch

    rows = [
        _Row(job, torch.Generator().manual_seed(job.params.seed) if job.params.seed is not None else None,
             max((len(s) for s in job.params.stop), default=1) - 1)
        for job in jobs
    ]
    width = max(len(job.ids) for job in jobs)
    if len(jobs) == 1:
        inputs, mask, positions = torch.tensor([jobs[0].ids], dtype=torch.long), None, None
    else:
        inputs = torch.full((len(jobs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for i, job in enumerate(jobs):
            inputs[i, width - len(job.ids) :] = torch.tensor(job.ids, dtype=torch.long)
            mask[i, width - len(job.ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = None
    steps = max(job.params.max_tokens for job in jobs)
    for _ in range(steps):
        for row in rows:
            if row.finish is None and row.job.cancelled.is_set():
                row.finish = "cancelled"
        if all(row.finish for row in rows):
            break
        out = model(input_ids=inputs, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True)
        cache = out.cache
        logits = out.logits[:, -1].float()
        next_ids = []
        for i, row in enumerate(rows):
            if row.finish:
                next_ids.append(pad_id)  # finished rows ride along; their outputs are ignored
                continue
            token = pick(logits[i], row.job.params, row.generator)
            row.push(token, torch.log_softmax(logits[i], dim=-1), tokenizer, eos_ids)
            next_ids.append(token)
        inputs = torch.tensor(next_ids, dtype=torch.long).unsqueeze(1)
        if mask is not None:
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
    return [row.close() for row in rows]
