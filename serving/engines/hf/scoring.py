"""One padded forward pass that scores prompts token by token (lm-eval's loglikelihood contract)."""

from __future__ import annotations


def forward_score(engine, prompts: list[list[int]], top_k: int) -> list:
    """`Scored` per prompt: a logprob for every prompt token after the first, plus one greedy next token."""
    import torch

    from serving.engine_types import Scored

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), engine.pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        mask[row, : len(prompt)] = 1
    logits = engine.model(input_ids=ids, attention_mask=mask).logits
    out: list[Scored] = []
    lses: list[list[float]] = []
    for row, prompt in enumerate(prompts):
        n = len(prompt)
        # Logits at position t depend only on tokens[:t+1]: where this prompt shares a prefix with an
        # earlier one (the choices of one multiple-choice question do), reuse that row's normaliser and top
        # tokens instead of another pass over the vocabulary.
        src, shared = longest_shared_prefix(prompts[:row], prompt)
        rows = logits[row, shared:n].float()  # position t predicts token t+1
        lse_new = rows.logsumexp(dim=-1)
        if top_k > 1:
            top_vals, top_ids = rows.topk(top_k, dim=-1)
        else:
            top_vals, top_ids = rows.max(dim=-1, keepdim=True)
        top_vals = top_vals - lse_new.unsqueeze(1)
        tops = [dict(zip(i, v, strict=True)) for i, v in zip(top_ids.tolist(), top_vals.tolist(), strict=True)]
        lse = lses[src][:shared] + lse_new.tolist() if shared else lse_new.tolist()
        tops = out[src].top_logprobs[1 : shared + 1] + tops if shared else tops
        # token t+1's logprob: reused below the shared prefix, gathered from this row's logits from there on
        first = max(shared - 1, 0)
        target = torch.tensor(prompt[first + 1 :], dtype=torch.long)
        gathered = logits[row, first : n - 1].float().gather(1, target.unsqueeze(1)).squeeze(1)
        fresh = (gathered - torch.tensor(lse[first : n - 1])).tolist()
        token_lps = (out[src].token_logprobs[1 : first + 1] if first else []) + fresh
        next_id = next(iter(tops[-1]))
        lses.append(lse)
        out.append(Scored(tokens=[*prompt, next_id], token_logprobs=[None, *token_lps, tops[-1][next_id]],
                          top_logprobs=[None, *tops]))
    return out


def longest_shared_prefix(earlier: list[list[int]], prompt: list[int]) -> tuple[int, int]:
    """(index of the earlier prompt sharing the longest prefix with `prompt`, that length); (0, 0) if none."""
    best, length = 0, 0
    for i, other in enumerate(earlier):
        k = 0
        limit = min(len(other), len(prompt))
        while k < limit and other[k] == prompt[k]:
            k += 1
        if k > length:
            best, length = i, k
    return best, length
