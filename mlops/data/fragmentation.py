"""Does the base tokenizer cut the corpus's words into pieces? Tokens per word on the kept records against a
small general-text baseline shipped with the package (`general_baseline.jsonl`, plain English prose), and the
frequent corpus words (absent from the baseline: the domain's terms) that split into the most pieces.

The measure runs on a fixed-size sample of kept records: the SAMPLE_RECORDS with the smallest hash of their
record id (bottom-k), so the sample is the same whatever order or executor the results came in, and memory stays
flat however large the corpus. Tokens per word is the text's token count over its word count (`\\w+` runs),
so templates and special tokens play no part; a script without spaces (Chinese) counts a run of characters as one
word, which makes the figure meaningful only against a baseline in the same script.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import re
from collections import Counter
from pathlib import Path

SAMPLE_RECORDS = 2000
TOP_TERMS = 10
MIN_TERM_COUNT = 3
WORD_RE = re.compile(r"\w+")
TERM_RE = re.compile(r"[^\W\d_]{3,}")  # letters only, 3+: what a domain term looks like
BASELINE = Path(__file__).with_name("general_baseline.jsonl")


class TextSample:
    """Bottom-k sample of kept texts by sha256 of the record id."""

    def __init__(self, size: int = SAMPLE_RECORDS) -> None:
        self.size = size
        self._heap: list[tuple[int, str, str]] = []  # (-hash, record id, text): the root is the largest hash

    def offer(self, record_id: str, text: str) -> None:
        h = int.from_bytes(hashlib.sha256(record_id.encode()).digest()[:8], "big")
        if len(self._heap) < self.size:
            heapq.heappush(self._heap, (-h, record_id, text))
        elif h < -self._heap[0][0]:
            heapq.heapreplace(self._heap, (-h, record_id, text))

    def texts(self) -> list[str]:
        return [text for _, _, text in sorted(self._heap, reverse=True)]


def baseline_texts() -> list[str]:
    return [json.loads(line)["text"] for line in BASELINE.read_text(encoding="utf-8").splitlines() if line.strip()]


def tokens_per_word(tk, texts: list[str]) -> tuple[float, int]:
    words = sum(len(WORD_RE.findall(t)) for t in texts)
    tokens = sum(len(e.ids) for e in tk.encode_batch(texts, add_special_tokens=False)) if texts else 0
    return (round(tokens / words, 3) if words else 0.0), words


def pieces(tk, word: str) -> int:
    """Tokens of a word as it stands in running text (after a space), or alone, whichever is fewer: byte-level
    BPE marks the leading space, SentencePiece adds its own."""
    return min(len(tk.encode(word, add_special_tokens=False).ids),
               len(tk.encode(" " + word, add_special_tokens=False).ids))


def fragmentation(texts: list[str], model_path: str | Path) -> dict:
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(Path(model_path) / "tokenizer.json"))
    base = baseline_texts()
    corpus_tpw, words = tokens_per_word(tk, texts)
    base_tpw, _ = tokens_per_word(tk, base)
    general = {w.casefold() for t in base for w in WORD_RE.findall(t)}
    counts = Counter(w.casefold() for t in texts for w in TERM_RE.findall(t))
    terms = [(w, n) for w, n in counts.items() if n >= MIN_TERM_COUNT and w not in general]
    split = sorted(((pieces(tk, w), n, w) for w, n in terms), key=lambda x: (-x[0], -x[1], x[2]))[:TOP_TERMS]
    return {
        "records_sampled": len(texts), "words_sampled": words,
        "tokens_per_word": corpus_tpw, "baseline_tokens_per_word": base_tpw,
        "ratio_to_baseline": round(corpus_tpw / base_tpw, 3) if base_tpw else 0.0,
        "baseline": BASELINE.name,
        "most_split_terms": [{"term": w, "count": n, "tokens": p} for p, n, w in split],
    }
