"""Offline tokenization with the base model's tokenizer and chat template, and assistant-only loss masks.

A chat is rendered once with the chat template; each assistant turn's character span is found by
rendering the prefix before it (with the generation prompt) and the prefix through it (the whole chat, for the
last turn), so the mask is right for any prefix-stable template. Tokens whose first character lies in a span are trained on.
Plain-text records are trained on every token and end with EOS.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from mlops.data.records import Record
from mlops.errors import MLOpsError

_STATE: dict = {}


class TemplateFailure(MLOpsError):
    """The chat template cannot render this record (or not prefix by prefix): the record is set aside alone."""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def tokenizer_info(model_path: str | Path, name: str = "", model_id: str = "") -> dict:
    """Name, vocab hash, chat template hash and ids of a tokenizer folder, read without transformers."""
    from tokenizers import Tokenizer

    folder = Path(model_path)
    tk = Tokenizer.from_file(str(folder / "tokenizer.json"))
    vocab = sorted(tk.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    config = json.loads((folder / "tokenizer_config.json").read_text()) if (folder / "tokenizer_config.json").exists() else {}
    template_file = folder / "chat_template.jinja"
    template = template_file.read_text() if template_file.exists() else config.get("chat_template") or ""
    vocab_hash = _sha(json.dumps(vocab, ensure_ascii=False))
    template_hash = _sha(template)
    tokenizer_json_hash = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()

    def token_id(key: str) -> int | None:
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        return tk.token_to_id(token) if token else None

    eos_id = token_id("eos_token")
    pad_id = token_id("pad_token")
    return {
        "name": name or folder.name,
        "base_model_id": model_id,
        "vocab_size": len(vocab),
        "vocab_hash": vocab_hash,
        "chat_template_hash": template_hash,
        "tokenizer_json_hash": tokenizer_json_hash,
        "hash": _sha(f"{vocab_hash}|{template_hash}|{tokenizer_json_hash}"),
        "eos_id": eos_id,
        "pad_id": pad_id if pad_id is not None else (eos_id or 0),
    }


class ChatTokenizer:
    def __init__(self, model_path: str | Path) -> None:
        from tokenizers import Tokenizer

        self.path = Path(model_path)
        self._tok = None
        info = tokenizer_info(self.path)
        if info["chat_template_hash"] == _sha(""):
            raise MLOpsError(
                f"the tokenizer at {model_path} has no chat template, so chat records cannot be rendered. "
                "Fix: use a base model with a chat template (tiny or smollm2)."
            )
        # The Rust tokenizer of tokenizer.json (the file the snapshot's tokenizer hash covers), called directly: the
        # same ids and offsets without the Python wrapper, which cost more per record than the tokenization itself.
        # transformers (seconds to import and load) is only needed to render chat templates: text-only builds
        # never load it.
        self.backend = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        self.eos_id = info["eos_id"]

    @property
    def tok(self):
        """transformers' tokenizer, loaded on first use (it renders the chat template)."""
        if self._tok is None:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(str(self.path), trust_remote_code=False)
            backend = getattr(self._tok, "backend_tokenizer", None)
            if backend is None or backend.to_str() != self.backend.to_str():
                raise MLOpsError(f"transformers' tokenizer for {self.path} is not its tokenizer.json (it changed the "
                                 "pre-tokenizer, normaliser or vocabulary on load), so token ids would depend on which "
                                 "one encoded a record. Fix: save the tokenizer again with save_pretrained.")
        return self._tok

    def _render(self, messages: list[dict], generation: bool = False) -> str:
        from jinja2 import TemplateError

        if not messages:
            return ""  # an empty prefix renders as nothing; templates raise on it
        try:
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
        except (TemplateError, ValueError, TypeError, KeyError, IndexError) as err:
            raise TemplateFailure(f"the chat template cannot render this conversation ({type(err).__name__})") from None

    def spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
        full = self._render(messages)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self._render(messages[:i], generation=True)
            through = full if i == len(messages) - 1 else self._render(messages[: i + 1])  # the usual last turn
            if not through.startswith(before) or not full.startswith(through):
                raise TemplateFailure(
                    "the chat template is not prefix-stable (rendering a conversation prefix does not yield a "
                    "prefix of the whole), so assistant tokens cannot be located. Fix: use a ChatML-style "
                    "template such as the one of the tiny or smollm2 base models."
                )
            spans.append((len(before), len(through)))
        return full, spans

    def ids_and_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Content token ids (no special tokens added) and their character offsets."""
        enc = self.backend.encode(text, add_special_tokens=False)
        return enc.ids, enc.offsets

    def count(self, texts: list[str]) -> list[int]:
        """Content tokens per text."""
        return [len(enc.ids) for enc in self.backend.encode_batch(texts, add_special_tokens=False)]

    def encode(self, record: Record) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids int32, loss_mask uint8) for one record."""
        if record.kind == "text":
            ids, _ = self.ids_and_offsets(record.text)
            if self.eos_id is not None:
                ids = [*ids, self.eos_id]
            return np.asarray(ids, dtype=np.int32), np.ones(len(ids), dtype=np.uint8)
        text, spans = self.spans(record.messages)
        return self._masked(text, spans)

    def encode_answer(self, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, loss_mask) of a prompt and its answer (the last message, an assistant turn), trained on the
        answer only: assistant turns inside the prompt are masked too (one side of a preference pair)."""
        text, spans = self.spans(messages)
        return self._masked(text, spans[-1:])

    def _masked(self, text: str, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        token_ids, offsets = self.ids_and_offsets(text)
        ids = np.asarray(token_ids, dtype=np.int32)
        starts = np.asarray([start for start, _ in offsets], dtype=np.int64)
        mask = np.zeros(len(ids), dtype=np.uint8)
        for lo, hi in spans:
            mask[(starts >= lo) & (starts < hi)] = 1
        return ids, mask


WEIGHTS = {".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".h5", ".msgpack", ".ckpt"}
PORTABLE_MAX_BYTES = 64 * 2**20


def portable(model_path: str | Path) -> dict:
    """A model folder's tokenizer files (everything but weights) as bytes, for workers on machines that lack the
    folder (data.executor=ray): `init_worker` accepts this in place of a path."""
    folder = Path(model_path)
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())
             if p.is_file() and p.suffix not in WEIGHTS and p.stat().st_size <= PORTABLE_MAX_BYTES}
    digest = hashlib.sha256()
    for name, blob in files.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(blob).digest())
    return {"path": str(folder), "files": files, "hash": digest.hexdigest()[:16]}


def _materialise(source: dict) -> str:
    """The portable files in a folder of this machine's temp dir (the same bytes on every node)."""
    import tempfile

    folder = Path(tempfile.gettempdir()) / f"mlops-tokenizer-{source['hash']}"
    if not folder.is_dir():
        partial = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        for name, blob in source["files"].items():
            (partial / name).write_bytes(blob)
        try:
            partial.rename(folder)
        except OSError:  # another worker on this node got there first: same bytes
            import shutil

            shutil.rmtree(partial, ignore_errors=True)
    return str(folder)


def init_worker(model_path: str | dict) -> None:
    if isinstance(model_path, dict):
        model_path = _materialise(model_path)
    if _STATE.get("path") != model_path:
        _STATE.update(path=model_path, tok=ChatTokenizer(model_path))


def preload(model_path: str) -> None:
    """Load in the parent before forking, so workers share it instead of loading it again."""
    init_worker(model_path)


def tokenizer() -> ChatTokenizer:
    """This process's tokenizer (init_worker or preload first)."""
    return _STATE["tok"]
