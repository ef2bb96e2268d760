"""A preference snapshot read as pairs: row 2i is pair i's chosen answer, row 2i+1 its rejected one (the layout
`mlops.data.format` defines). Steps and data positions count pairs, so `train.micro_batch_size` is pairs per
micro step and a DPO forward runs twice as many sequences: the chosen rows first, then the rejected ones."""

from __future__ import annotations

from dataclasses import dataclass

from mlops.data.format import PAIR_ROLES, RECORD_TYPE_PREFERENCE, Sample, SnapshotReader, record_type
from mlops.errors import ConfigError, MLOpsError


@dataclass(frozen=True)
class Pair:
    index: int  # the pair's position in its split: the key of its precomputed reference log-probabilities
    chosen: Sample
    rejected: Sample
    sample_id: str  # the pair's id (its rows' ids without the /chosen, /rejected suffix)


class PairReader:
    """Random access to one split's pairs, with the same global order rule as `SnapshotReader` (over pairs)."""

    def __init__(self, rows: SnapshotReader) -> None:
        if len(rows) % 2:
            raise MLOpsError(f"split '{rows.split}' of preference snapshot {rows.folder.name} has {len(rows)} rows, "
                             "an odd number: its pairs are broken. Fix: rebuild the snapshot with `mlops data build`.")
        self.rows = rows
        self.folder, self.split, self.manifest, self.seq_len = rows.folder, rows.split, rows.manifest, rows.seq_len
        self._count = len(rows) // 2
        self._perm = None

    def __len__(self) -> int:
        return self._count

    def get(self, index: int) -> Pair:
        if not 0 <= index < self._count:
            raise IndexError(f"pair {index} is out of range for split '{self.split}' of {self._count} pairs")
        chosen, rejected = self.rows.get(2 * index), self.rows.get(2 * index + 1)
        pair_id, role = chosen.sample_id.rpartition("/")[::2]
        if (role, rejected.sample_id) != (PAIR_ROLES[0], f"{pair_id}/{PAIR_ROLES[1]}"):
            raise MLOpsError(f"rows {2 * index} and {2 * index + 1} of split '{self.split}' in {self.folder.name} are "
                             f"not one pair ({chosen.sample_id!r}, {rejected.sample_id!r}). Fix: rebuild the snapshot.")
        return Pair(index, chosen, rejected, pair_id)

    __getitem__ = get
    # One order rule for rows and pairs: both methods read only _count, _perm, split and folder.
    permutation = SnapshotReader.permutation
    global_order = SnapshotReader.global_order


def open_split(folder, split: str, objective: str):
    """The reader a run of `objective` trains or validates on; refuses a snapshot of the other record type."""
    rows = SnapshotReader(folder, split)
    check_record_type(rows.manifest, objective, rows.folder.name)
    return PairReader(rows) if objective == "dpo" else rows


def check_record_type(manifest: dict, objective: str, snapshot_id: str) -> None:
    """SFT trains on chat snapshots, DPO on preference snapshots: the other way round is refused before compute."""
    kind = record_type(manifest)
    wants = RECORD_TYPE_PREFERENCE if objective == "dpo" else "chat"
    if kind == wants:
        return
    if objective == "dpo":
        raise ConfigError(f"train.objective=dpo needs a preference snapshot (chosen/rejected pairs), and "
                          f"train.snapshot={snapshot_id} holds {kind} records. Fix: build one from pair records "
                          "(`mlops data build` over prompt/chosen/rejected rows, or `mlops data harvest --pairs`), "
                          "or train it with train.objective=sft.")
    raise ConfigError(f"train.objective={objective} trains on chat records, and train.snapshot={snapshot_id} is a "
                      f"{kind} snapshot (chosen/rejected pairs). Fix: set train.objective=dpo (or train.mode=dpo), "
                      "or name a chat snapshot.")


def to_pair_tensors(pairs: list[Pair], max_len: int | None = None):
    """One micro batch of 2m rows: the m chosen answers, then the m rejected ones (TRL's concatenated order)."""
    from training.data_loader import to_tensors

    mb = to_tensors([p.chosen for p in pairs] + [p.rejected for p in pairs], max_len)
    mb.sample_ids = [p.sample_id for p in pairs]
    mb.pair_indices = [p.index for p in pairs]
    return mb
