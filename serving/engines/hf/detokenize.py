"""Token ids to text, one token at a time, without splitting multi-byte characters.

A byte-level BPE token can hold half of a UTF-8 character ('日' is two tokens in SmolLM2's vocabulary), so
decoding tokens one by one yields U+FFFD. `IncrementalText` decodes a short window of recent tokens and only
emits text once a character is complete: the token that completes a character carries it, earlier partial
tokens carry "", and the pieces always join to the decoded whole.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalText:
    """Text of a growing token sequence; `push` returns the new text each token completes."""

    def __init__(self, tokenizer, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        self._prefix = 0  # window start: enough context for the decoder's spacing rules
        self._read = 0  # tokens before this index are in `text`

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, token: int) -> str:
        self.ids.append(int(token))
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            delta = after[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still pending (an incomplete character at the very end decodes as it is)."""
        if self._read == len(self.ids):
            return ""
        before = self._decode(self.ids[self._prefix : self._read])
        delta = self._decode(self.ids[self._prefix :])[len(before) :]
        self._prefix = self._read = len(self.ids)
        self.text += delta
        return delta


def token_texts(tokenizer, ids: list[int], *, skip_special_tokens: bool = False) -> list[str]:
    """One string per token that joins to the decoded sequence; multi-byte characters stay whole."""
    decoder = IncrementalText(tokenizer, skip_special_tokens=skip_special_tokens)
    pieces = [decoder.push(i) for i in ids]
    if pieces:
        pieces[-1] += decoder.flush()
    return pieces


def token_label(tokenizer, token_id: int) -> str:
    """A token on its own (keys of `top_logprobs`): its text, or `bytes:\\xNN...` for part of a character.

    Partial tokens are spelled by their bytes, as OpenAI does, so two different partial tokens never collide
    under the same U+FFFD key.
    """
    text = tokenizer.decode([token_id])
    if REPLACEMENT not in text:
        return text
    raw = token_bytes(tokenizer, token_id)
    if raw is None:
        return text
    return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def token_bytes(tokenizer, token_id: int) -> bytes | None:
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    if piece is None:
        return None
    if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:  # sentencepiece byte fallback
        return bytes([int(piece[3:5], 16)])
    table = _byte_decoder()
    if all(ch in table for ch in piece):  # GPT-2 style byte-level BPE
        return bytes(table[ch] for ch in piece)
    return None


_BYTE_DECODER: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    """GPT-2's reversible byte <-> printable-character map, inverted."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
            range(ord("®"), ord("ÿ") + 1))
        chars = printable[:]
        extra = 0
        for b in range(256):
            if b not in printable:
                printable.append(b)
                chars.append(256 + extra)
                extra += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(printable, chars, strict=True)}
    return _BYTE_DECODER
