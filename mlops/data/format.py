"""The on-disk snapshot format: sharded, memory-mapped, fixed-length token sequences plus a manifest.

A snapshot is a folder `.mlops/snapshots/<snapshot_id>/`:

    manifest.json                         written last and atomically; without it the folder is no snapshot
    <split>/index.json                    {"count", "seq_len", "shards": [{"name", "start", "count"}]}
    <split>/shard-00000.input_ids.npy     int32 [count, seq_len]   (pad positions hold the pad id)
    <split>/shard-00000.attention_mask.npy uint8 [count, seq_len]  (1 = real token)
    <split>/shard-00000.loss_mask.npy     uint8 [count, seq_len]   (1 = trained on: assistant tokens)
    <split>/shard-00000.meta.jsonl        one line per sample: {"id", "domain", "source", "records"}

Splits are "train" and "validation". Reading API (what training builds on):

    resolve_snapshot(snapshot_id) -> Path            # mlops.data.snapshot; NotFoundError with "did you mean"
    verify_snapshot(snapshot_id_or_path) -> dict     # re-hash every file against the manifest
    reader = SnapshotReader(path, split="train")
    reader.manifest, reader.seq_len, len(reader)
    reader.get(i) -> Sample(input_ids, attention_mask, loss_mask, sample_id)
    reader.global_order(seed, start=0) -> Iterator[(global_index, sample_index)]
        # forever over epochs: epoch = g // n, permutation seeded by (seed, epoch); starting at any g
        # costs one permutation of n ints and never touches earlier samples

Writing: `ShardWriter` appends samples to a split and flushes a shard every `shard_size` samples, so memory
stays bounded. `write_snapshot({...})` writes a complete, valid snapshot straight from token sequences, for
tests and for training code that needs a snapshot without running the data pipeline.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlops.errors import MLOpsError
from mlops.files import atomic_write_json, atomic_write_text, file_sha256, pid_alive  # noqa: F401 - used here and re-exported

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
INDEX = "index.json"

# Preference snapshots (train.objective=dpo): the manifest says `"record_type": "preference"`, and each pair is two
# consecutive rows of one split, chosen first (even row), rejected second (odd row). Both rows hold the prompt then
# the answer, the loss mask on the answer only; their meta ids are `<pair id>/chosen` and `<pair id>/rejected`.
# A manifest without `record_type` is a chat snapshot (every snapshot built before pairs existed).
RECORD_TYPE_CHAT = "chat"
RECORD_TYPE_PREFERENCE = "preference"
PAIR_ROLES = ("chosen", "rejected")


def record_type(manifest: Mapping[str, Any] | None) -> str:
    """What a snapshot holds: `chat` (SFT rows) or `preference` (chosen/rejected row pairs)."""
    return str((manifest or {}).get("record_type") or RECORD_TYPE_CHAT)
SPLITS = ("train", "validation")
ARRAYS = ("input_ids", "attention_mask", "loss_mask")
DTYPES = {"input_ids": np.int32, "attention_mask": np.uint8, "loss_mask": np.uint8}
DEFAULT_SHARD_SIZE = 4096


@dataclass(frozen=True)
class Sample:
    input_ids: np.ndarray  # int32 [seq_len]
    attention_mask: np.ndarray  # uint8 [seq_len]
    loss_mask: np.ndarray  # uint8 [seq_len]
    sample_id: str


# --------------------------------------------------------------------------- atomic writes and hashing


def data_files(folder: Path) -> list[Path]:
    """Every file of a snapshot except the manifest, in a stable order."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST and not p.name.startswith("."))


def hash_files(folder: Path, known: Mapping[str, str] | None = None) -> dict[str, str]:
    """sha256 of every data file; `known` holds digests the writer took of files it wrote (a build's workers hash
    their own shards, so the driver does not read the snapshot's bytes again)."""
    known = known or {}
    out = {}
    for path in data_files(folder):
        name = path.relative_to(folder).as_posix()
        out[name] = known.get(name) or file_sha256(path)
    return out


def shard_files(folder: Path, split: str, shards: list[dict]) -> dict[str, str]:
    """{"<split>/<file>": sha256} of the files of these shards of a split (hashed where they were written)."""
    return {f"{split}/{s['name']}.{part}": file_sha256(folder / split / f"{s['name']}.{part}")
            for s in shards for part in (*(f"{a}.npy" for a in ARRAYS), "meta.jsonl")}


def content_hash(files: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0{files[name]}\n".encode())
    return digest.hexdigest()


def snapshot_id_for(files: Mapping[str, str], tokenizer_hash: str, config_hash: str) -> str:
    """The id: content hash of the shards (the split folders), the tokenizer hash and the pipeline config
    hash. Reports and quarantine files are verified but not part of the id."""
    shards = {k: v for k, v in files.items() if k.split("/", 1)[0] in SPLITS}
    blob = f"{content_hash(shards)}|{tokenizer_hash}|{config_hash}"
    return "snap-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- writing


def npy_from_raw(raw: Path, final: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """Turn a file of raw little-endian C-order values into a .npy file (header + the same bytes), by plain
    file copies: no array in memory and no mapped pages, however large the file."""
    expected = int(np.prod(shape)) * dtype.itemsize
    if raw.stat().st_size != expected:
        raise MLOpsError(f"'{raw}' holds {raw.stat().st_size} bytes, expected {expected} for {shape}; the build "
                         "was interrupted while writing. Fix: run the build again.")
    tmp = final.with_name(f".{final.name}.tmp")
    with tmp.open("wb") as out, raw.open("rb") as src:
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(out, header)
        shutil.copyfileobj(src, out, 1 << 20)
    os.replace(tmp, final)
    raw.unlink()


class ShardWriter:
    """Appends fixed-length samples to one split. Rows stream to raw files on disk and become a shard's
    .npy arrays every `shard_size` samples, so memory does not grow with the shard or the input."""

    def __init__(self, folder: Path, seq_len: int, pad_id: int, shard_size: int = DEFAULT_SHARD_SIZE,
                 prefix: str = "shard-") -> None:
        self.folder = folder
        self.seq_len = seq_len
        self.pad_id = pad_id
        self.shard_size = shard_size
        self.prefix = prefix  # several writers (a build's workers) share one split folder under their own prefixes
        self.shards: list[dict] = []
        self.count = 0  # samples in flushed shards
        self.pending = 0  # samples written since the last flush
        self._files: dict[str, Any] = {}
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def total(self) -> int:
        return self.count + self.pending

    def _raw(self, array: str) -> Path:
        return self.folder / f".pending.{self.prefix}{array}.raw"

    def _open(self) -> None:
        self._files = {a: self._raw(a).open("wb") for a in ARRAYS}
        self._files["meta"] = self._raw("meta").with_suffix(".jsonl").open("w", encoding="utf-8")

    def add(self, input_ids: Sequence[int], loss_mask: Sequence[int] | None, meta: Mapping[str, Any]) -> None:
        n = len(input_ids)
        if n == 0 or n > self.seq_len:
            raise MLOpsError(
                f"sample '{meta.get('id')}' has {n} tokens; a sample needs 1..{self.seq_len} (seq_len). "
                "Fix: drop or truncate it before writing, or raise data.seq_len."
            )
        if not self._files:
            self._open()
        ids = np.full(self.seq_len, self.pad_id, dtype=np.int32)
        ids[:n] = np.asarray(input_ids, dtype=np.int32)
        attn = np.zeros(self.seq_len, dtype=np.uint8)
        attn[:n] = 1
        loss = np.zeros(self.seq_len, dtype=np.uint8)
        loss[:n] = 1 if loss_mask is None else np.asarray(loss_mask, dtype=np.uint8)
        for array, row in zip(ARRAYS, (ids, attn, loss), strict=True):
            self._files[array].write(row.astype(np.dtype(DTYPES[array]).newbyteorder("<"), copy=False).tobytes())
        self._files["meta"].write(json.dumps(dict(meta), sort_keys=True, ensure_ascii=False) + "\n")
        self.pending += 1
        if self.pending >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        for fh in self._files.values():
            fh.close()
        self._files = {}
        name = f"{self.prefix}{len(self.shards):05d}"
        for array in ARRAYS:
            dtype = np.dtype(DTYPES[array]).newbyteorder("<")
            npy_from_raw(self._raw(array), self.folder / f"{name}.{array}.npy", dtype, (self.pending, self.seq_len))
        os.replace(self._raw("meta").with_suffix(".jsonl"), self.folder / f"{name}.meta.jsonl")
        self.shards.append({"name": name, "start": self.count, "count": self.pending})
        self.count += self.pending
        self.pending = 0

    def close(self) -> dict:
        self.flush()
        return write_index(self.folder, self.seq_len, self.pad_id, self.shards)


def write_index(folder: Path, seq_len: int, pad_id: int, shards: list[dict]) -> dict:
    """A split's index.json over shards in order ({"name", "count"}; starts are recomputed)."""
    start, listed = 0, []
    for shard in shards:
        listed.append({"name": shard["name"], "start": start, "count": shard["count"]})
        start += shard["count"]
    index = {"count": start, "seq_len": seq_len, "pad_id": pad_id, "shards": listed}
    atomic_write_json(folder / INDEX, index)
    return index


def verify_files(folder: Path, manifest: Mapping[str, Any]) -> list[str]:
    """What differs between a snapshot folder and its manifest: changed, missing or extra files."""
    expected: dict[str, str] = dict(manifest.get("files", {}))
    present = {p.relative_to(folder).as_posix(): p for p in data_files(folder)}
    problems = []
    for name, digest in sorted(expected.items()):
        path = present.get(name)
        if path is None:
            problems.append(f"'{name}' is missing")
        elif file_sha256(path) != digest:
            problems.append(f"'{name}' changed (sha256 differs from the manifest)")
    problems += [f"'{name}' is not in the manifest" for name in sorted(set(present) - set(expected))]
    return problems


def publish(staging: Path, root: Path, manifest: dict, *, replace_invalid: bool = False) -> Path:
    """Write the manifest last, then move the folder into place: a half-built snapshot is never visible.

    A complete snapshot of the same id is kept (same id, same content), unless `replace_invalid` and its files
    no longer match its manifest: then it is moved aside and replaced (`mlops data build --force`)."""
    snapshot_id = manifest["snapshot_id"]
    manifest = {**manifest, "complete": True, "format_version": FORMAT_VERSION}
    atomic_write_json(staging / MANIFEST, manifest)
    final = root / snapshot_id
    if is_complete(final):
        stale = read_manifest(final) or {}
        if not (replace_invalid and verify_files(final, stale)):
            shutil.rmtree(staging, ignore_errors=True)  # same id, same content: a rebuild changes nothing
            return final
        trash = root / f".trash-{snapshot_id}-{uuid.uuid4().hex[:8]}"
        os.replace(final, trash)  # readers holding the old folder open keep their files until they close them
        shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)  # a leftover without a complete manifest is garbage
    try:
        os.replace(staging, final)
    except OSError:
        if not is_complete(final):  # not a concurrent build of the same content that won the race
            raise
        shutil.rmtree(staging, ignore_errors=True)
    return final


def staging_dir(root: Path) -> Path:
    path = root / f".staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path


def sweep_stale_staging(root: Path) -> list[Path]:
    """Remove staging (and trash) folders whose builder process is gone: what a SIGKILLed build left behind.
    The pid in the folder name says whose it is; a live pid's folder is another build in progress."""
    removed = []
    for path in root.glob(".staging-*") if root.is_dir() else []:
        pid = path.name.split("-")[1] if path.name.count("-") >= 2 else ""
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    for path in root.glob(".trash-*") if root.is_dir() else []:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def write_snapshot(
    splits: Mapping[str, Sequence[Any]],
    *,
    seq_len: int,
    root: Path | None = None,
    pad_id: int = 0,
    tokenizer: Mapping[str, str] | None = None,
    config_hash: str = "direct",
    extra: Mapping[str, Any] | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
) -> Path:
    """Write a complete snapshot straight from token sequences; returns its folder.

    `splits` maps "train" / "validation" to samples, each a list of token ids, a pair
    `(input_ids, loss_mask)`, or a dict with `input_ids` and optional `loss_mask`, `id`, `domain`.
    Without a loss mask every token is trained on. The id follows the same rule as a pipeline build.
    """
    from mlops.paths import snapshots_dir

    root = root or snapshots_dir()
    unknown = set(splits) - set(SPLITS)
    if unknown:
        raise MLOpsError(f"unknown split(s) {sorted(unknown)}; splits are {list(SPLITS)}.")
    staging = staging_dir(root)
    try:
        counts = {}
        for split in SPLITS:
            writer = ShardWriter(staging / split, seq_len, pad_id, shard_size)
            for i, sample in enumerate(splits.get(split, [])):
                ids, mask, meta = _as_sample(sample, f"{split}-{i}")
                writer.add(ids, mask, meta)
            counts[split] = writer.close()["count"]
        tok = dict(tokenizer or {"name": "direct", "vocab_hash": "none", "chat_template_hash": "none"})
        tok_hash = tok.get("hash") or hashlib.sha256(json.dumps(tok, sort_keys=True).encode()).hexdigest()
        files = hash_files(staging)
        manifest = {
            "snapshot_id": snapshot_id_for(files, tok_hash, config_hash),
            "name": "direct",
            "seq_len": seq_len,
            "pad_id": pad_id,
            "tokenizer": {**tok, "hash": tok_hash},
            "config_hash": config_hash,
            "files": files,
            "counts": {"samples": counts},
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **dict(extra or {}),
        }
        return publish(staging, root, manifest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _as_sample(sample: Any, default_id: str) -> tuple[list[int], list[int] | None, dict]:
    if isinstance(sample, Mapping):
        meta = {"id": str(sample.get("id", default_id)), "domain": sample.get("domain", "general")}
        return list(sample["input_ids"]), sample.get("loss_mask"), meta
    if isinstance(sample, tuple) and len(sample) == 2:
        return list(sample[0]), list(sample[1]), {"id": default_id, "domain": "general"}
    return list(sample), None, {"id": default_id, "domain": "general"}


# --------------------------------------------------------------------------- reading


def read_manifest(folder: Path) -> dict | None:
    """The manifest of a complete snapshot folder, else None."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not manifest.get("complete") or manifest.get("snapshot_id") != folder.name:
        return None
    return manifest


def is_complete(folder: Path) -> bool:
    return folder.is_dir() and read_manifest(folder) is not None


class SnapshotReader:
    """Random access to one split of a snapshot; shards are memory-mapped on first use."""

    def __init__(self, snapshot_dir: Path | str, split: str = "train") -> None:
        self.folder = Path(snapshot_dir)
        manifest = read_manifest(self.folder)
        if manifest is None:
            raise MLOpsError(
                f"'{self.folder}' is not a complete snapshot (no valid manifest.json). "
                "Fix: pass a folder from `mlops data build`, or resolve an id with resolve_snapshot()."
            )
        if split not in SPLITS:
            raise MLOpsError(f"unknown split '{split}'. Fix: use one of {list(SPLITS)}.")
        self.manifest = manifest
        self.split = split
        index = json.loads((self.folder / split / INDEX).read_text())
        self.seq_len: int = int(index["seq_len"])
        self.pad_id: int = int(index.get("pad_id", 0))
        self._shards = index["shards"]
        self._starts = [s["start"] for s in self._shards]
        self._count = int(index["count"])
        self._arrays: dict[int, dict[str, np.ndarray]] = {}
        self._ids: dict[int, list[str]] = {}
        self._perm: tuple[int, int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self._count

    def _shard(self, pos: int) -> dict[str, np.ndarray]:
        if pos not in self._arrays:
            name = self._shards[pos]["name"]
            self._arrays[pos] = {
                a: np.load(self.folder / self.split / f"{name}.{a}.npy", mmap_mode="r") for a in ARRAYS
            }
        return self._arrays[pos]

    def _meta_ids(self, pos: int) -> list[str]:
        if pos not in self._ids:
            path = self.folder / self.split / f"{self._shards[pos]['name']}.meta.jsonl"
            self._ids[pos] = [json.loads(line)["id"] for line in path.read_text(encoding="utf-8").splitlines()]
        return self._ids[pos]

    def locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < self._count:
            raise IndexError(f"sample {index} is out of range for split '{self.split}' of {self._count} samples")
        pos = bisect.bisect_right(self._starts, index) - 1
        return pos, index - self._starts[pos]

    def get(self, index: int) -> Sample:
        pos, row = self.locate(index)
        arrays = self._shard(pos)
        return Sample(
            input_ids=np.array(arrays["input_ids"][row]),
            attention_mask=np.array(arrays["attention_mask"][row]),
            loss_mask=np.array(arrays["loss_mask"][row]),
            sample_id=self._meta_ids(pos)[row],
        )

    __getitem__ = get

    def meta(self, index: int) -> dict:
        pos, row = self.locate(index)
        path = self.folder / self.split / f"{self._shards[pos]['name']}.meta.jsonl"
        with path.open(encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if i == row:
                    return json.loads(line)
        raise IndexError(index)

    def iter_meta(self) -> Iterator[dict]:
        """Every sample's metadata in index order, read shard by shard."""
        for shard in self._shards:
            with (self.folder / self.split / f"{shard['name']}.meta.jsonl").open(encoding="utf-8") as fh:
                yield from (json.loads(line) for line in fh)

    def permutation(self, seed: int, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[:2] != (seed, epoch):
            rng = np.random.default_rng([seed, epoch])
            self._perm = (seed, epoch, rng.permutation(self._count))
        return self._perm[2]

    def global_order(self, seed: int, start: int = 0) -> Iterator[tuple[int, int]]:
        """(global_index, sample_index) forever; the same seed gives the same order from any start."""
        if self._count == 0:
            raise MLOpsError(f"split '{self.split}' of {self.folder.name} is empty; there is nothing to read.")
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        g = start
        while True:
            perm = self.permutation(seed, g // self._count)
            yield g, int(perm[g % self._count])
            g += 1
