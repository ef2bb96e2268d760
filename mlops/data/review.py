"""Human review of kept records (`mlops data review`): a seeded, domain-stratified sample of a snapshot's samples
for a person to judge, and the verdicts stored with the snapshot.

    mlops data review <snapshot> --n 200 [--seed 7] [--out FILE]   # draw: JSONL, one sample per line
    mlops data review <snapshot> --verdicts FILE                   # store: every line says ok, or bad + reason

A drawn line holds the sample as training reads it: the token ids decoded (`text`, chat template included) and
the part trained on (`trained_on`, the loss-masked tokens). PII was replaced before tokenization, so the text is
redacted as stored. Samples are allotted to domains in proportion to their size (largest remainder, at least one
per domain while n allows), drawn with numpy's generator seeded by (seed, domain); history samples of an earlier
snapshot are left out: they were reviewed with it.

A snapshot folder is immutable (every file is hashed in its manifest), so the review lives beside it, in
`<snapshots>/.reviews/<snapshot id>/`: the draw (`draw.json`), the verdicts (`verdicts.json`) and, when a build
asked for `data.accept.require_review`, the requirement (`required.json`). A review is complete when every drawn
sample has a verdict. `require_review` (called where training opens a snapshot) refuses a snapshot that requires
a review and has no complete one.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from mlops.data.format import SPLITS, SnapshotReader, read_manifest
from mlops.errors import MLOpsError
from mlops.files import atomic_write_json

REVIEWS = ".reviews"
VERDICTS = ("ok", "bad")


class ReviewError(MLOpsError):
    """A review file that does not fit the snapshot or its draw."""


class ReviewRequired(MLOpsError):
    """The snapshot requires a completed human review (data.accept.require_review) and has none."""


def review_dir(snapshot_dir: Path) -> Path:
    return snapshot_dir.parent / REVIEWS / snapshot_dir.name


def allot(sizes: dict[str, int], n: int) -> dict[str, int]:
    """n split over domains in proportion to their sizes (largest remainder); while n allows, every domain gets one,
    taken from the domain with the most."""
    total = sum(sizes.values())
    n = min(n, total)
    if not n:
        return {d: 0 for d in sizes}
    quota = {d: n * size / total for d, size in sizes.items()}
    take = {d: int(q) for d, q in quota.items()}
    for d in sorted(sizes, key=lambda d: (-(quota[d] - take[d]), d))[: n - sum(take.values())]:
        take[d] += 1
    present = [d for d in sorted(sizes) if sizes[d]]
    if n >= len(present):
        for d in present:
            if not take[d]:
                donor = max(sorted(take), key=lambda k: take[k])
                take[donor] -= 1
                take[d] = 1
    return take


def _positions(folder: Path) -> dict[str, list[tuple[str, int]]]:
    """(split, index) of every new (not history) sample, by domain, in snapshot order; of a preference pair only its
    chosen row (the item then shows the rejected row beside it)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for split in SPLITS:
        for index, meta in enumerate(SnapshotReader(folder, split).iter_meta()):
            if not meta.get("history") and meta.get("role") != "rejected":
                out.setdefault(meta.get("domain", ""), []).append((split, index))
    return out


def _decoder(manifest: dict):
    from tokenizers import Tokenizer

    from mlops.base_models import ensure_base_model

    model = ensure_base_model(manifest.get("base_model_ref") or manifest["base_model"]["name"])
    return Tokenizer.from_file(str(Path(model["path"]) / "tokenizer.json"))


def draw(folder: Path, n: int, seed: int, out: Path | None = None) -> tuple[Path, list[dict]]:
    """Draw the sample, store the draw beside the snapshot and write the JSONL for the reviewer."""
    manifest = read_manifest(folder)
    if n < 1:
        raise ReviewError(f"--n {n} draws nothing. Fix: pass --n 1 or more (the guides suggest a few hundred).")
    by_domain = _positions(folder)
    take = allot({d: len(p) for d, p in by_domain.items()}, n)
    chosen = []
    for domain in sorted(by_domain):
        rng = np.random.default_rng([seed, *domain.encode()])
        picks = rng.choice(len(by_domain[domain]), size=take[domain], replace=False) if take[domain] else []
        chosen += [(domain, *by_domain[domain][int(i)]) for i in sorted(picks)]
    tk = _decoder(manifest)
    readers = {s: SnapshotReader(folder, s) for s in SPLITS}
    items = []
    for number, (domain, split, index) in enumerate(chosen):
        sample, meta = readers[split].get(index), readers[split].meta(index)
        item = {
            "snapshot_id": folder.name, "item": number, "sample_id": sample.sample_id, "split": split,
            "domain": domain, "source": meta.get("source", ""), "records": meta.get("records", []),
            **_decoded(tk, sample), "verdict": "", "reason": "",
        }
        if meta.get("role") == "chosen":  # a pair is judged whole: its rejected row is the next one
            rejected = _decoded(tk, readers[split].get(index + 1))
            item |= {"rejected_text": rejected["text"], "rejected_trained_on": rejected["trained_on"]}
        items.append(item)
    where = review_dir(folder)
    where.mkdir(parents=True, exist_ok=True)
    atomic_write_json(where / "draw.json", {
        "snapshot_id": folder.name, "n": len(items), "asked": n, "seed": seed, "per_domain": take,
        "drawn_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sample_ids": [i["sample_id"] for i in items]})
    out = out or where / "sample.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items), encoding="utf-8")
    tmp.replace(out)
    return out, items


def _decoded(tk, sample) -> dict[str, str]:
    """The sample as training reads it: the whole text, and the part trained on (loss-masked tokens)."""
    real = sample.attention_mask.astype(bool)
    return {"text": tk.decode(sample.input_ids[real].tolist(), skip_special_tokens=False),
            "trained_on": tk.decode(sample.input_ids[real & sample.loss_mask.astype(bool)].tolist(),
                                    skip_special_tokens=False)}


def _read_verdicts(path: Path, snapshot_id: str) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ReviewError(f"review file '{path}' cannot be read ({err.strerror or err}). Fix: pass the JSONL file "
                          f"`mlops data review {snapshot_id} --n ...` wrote, with verdicts filled in.") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ReviewError(f"{path}:{number} is not JSON. Fix: keep one JSON object per line.") from None
        other = row.get("snapshot_id")
        if other != snapshot_id:
            raise ReviewError(
                f"review file '{path}' (line {number}) is for snapshot {other}, not {snapshot_id}. Fix: store it "
                f"with `mlops data review {other} --verdicts {path}`, or draw a sample of {snapshot_id} with "
                f"`mlops data review {snapshot_id} --n 200` and review that.")
        verdict, reason = str(row.get("verdict", "")).strip().lower(), str(row.get("reason", "")).strip()
        if verdict not in VERDICTS or (verdict == "bad" and not reason):
            raise ReviewError(
                f"{path}:{number} (sample {row.get('sample_id')}) has verdict {row.get('verdict')!r} and reason "
                f"{row.get('reason')!r}. Fix: set verdict to \"ok\", or to \"bad\" with a reason saying what is wrong.")
        rows.append({"sample_id": row.get("sample_id"), "verdict": verdict, "reason": reason})
    return rows


def store(folder: Path, path: Path, reviewer: str = "") -> dict:
    """Check a filled-in review file against the snapshot and its draw; store the verdicts beside the snapshot."""
    where = review_dir(folder)
    try:
        drawn = json.loads((where / "draw.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ReviewError(f"snapshot {folder.name} has no drawn review sample. Fix: draw one with "
                          f"`mlops data review {folder.name} --n 200`, fill in the verdicts, then store them.") from None
    rows = _read_verdicts(path, folder.name)
    expected = set(drawn["sample_ids"])
    unknown = [r["sample_id"] for r in rows if r["sample_id"] not in expected]
    if unknown:
        raise ReviewError(f"review file '{path}' judges samples that were not drawn for {folder.name} (e.g. "
                          f"{unknown[:3]}). Fix: review the file the latest draw wrote ({drawn['drawn_at']}).")
    judged = {r["sample_id"]: r for r in rows}
    bad = [r for r in judged.values() if r["verdict"] == "bad"]
    summary = {
        "snapshot_id": folder.name, "reviewed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "reviewer": reviewer, "drawn": len(expected), "judged": len(judged), "missing": len(expected - set(judged)),
        "complete": expected <= set(judged), "ok": len(judged) - len(bad), "bad": len(bad),
        "bad_share": round(len(bad) / len(judged), 4) if judged else 0.0,
        "bad_reasons": dict(Counter(r["reason"] for r in bad).most_common()), "file": str(path),
        "verdicts": sorted(judged.values(), key=lambda r: str(r["sample_id"])),
    }
    atomic_write_json(where / "verdicts.json", summary)
    return summary


def mark_required(snapshot_dir: Path) -> None:
    """A build asked for data.accept.require_review: the requirement holds for this snapshot from now on."""
    where = review_dir(snapshot_dir)
    if not (where / "required.json").exists():
        where.mkdir(parents=True, exist_ok=True)
        atomic_write_json(where / "required.json", {"snapshot_id": snapshot_dir.name, "required": True,
                                                    "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def review_status(snapshot_dir: Path) -> dict | None:
    try:
        return json.loads((review_dir(snapshot_dir) / "verdicts.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def require_review(snapshot_dir: Path, manifest: dict) -> None:
    """Refuse a snapshot that requires a completed review and has none (training calls this)."""
    if not _required(snapshot_dir, manifest):
        return
    status = review_status(snapshot_dir)
    if status and status.get("complete"):
        return
    sid = snapshot_dir.name
    state = (f"its review misses {status['missing']} of {status['drawn']} verdicts" if status
             else "it has no stored review")
    raise ReviewRequired(
        f"snapshot {sid} requires a completed human review (data.accept.require_review) and {state}. Fix: "
        f"`mlops data review {sid} --n 200`, judge every line (verdict ok, or bad with a reason), then "
        f"`mlops data review {sid} --verdicts <file>`; or train on a snapshot built without require_review.")


def _required(snapshot_dir: Path, manifest: dict) -> bool:
    asked = ((manifest.get("config") or {}).get("accept") or {}).get("require_review")
    return bool(asked) or (review_dir(snapshot_dir) / "required.json").exists()


def snapshot_review(snapshot_id: str | None, root: Path | None = None) -> dict:
    """The review of a snapshot named by id, for readers that know only the id (the app's pages, the release
    report): `found` is False when this project's snapshot store does not hold it (built elsewhere, deleted)."""
    from mlops.data.snapshot import resolve_snapshot

    empty = {"snapshot_id": snapshot_id, "found": False, "required": False, "status": None}
    if not snapshot_id:
        return empty
    try:
        folder = resolve_snapshot(snapshot_id, root)
    except MLOpsError:
        return empty
    manifest = read_manifest(folder) or {}
    return {"snapshot_id": folder.name, "found": True, "required": _required(folder, manifest),
            "status": review_status(folder)}


def describe_review(review: dict) -> str:
    """`snapshot_review`'s answer in one line: counts, the bad reasons, who and when."""
    status = review["status"]
    need = " (required before training)" if review["required"] else ""
    if not review["found"]:
        return f"unknown: snapshot {review['snapshot_id'] or '(none recorded)'} is not in this project's snapshot store"
    if not status:
        return f"none{need}"
    state = "complete" if status["complete"] else f"INCOMPLETE, {status['missing']} without a verdict"
    reasons = ", ".join(f"{k} {v}" for k, v in status["bad_reasons"].items())
    return (f"{status['judged']}/{status['drawn']} judged ({state}){need}: {status['ok']} ok, {status['bad']} bad "
            f"({status['bad_share']:.1%}){f'; bad: {reasons}' if reasons else ''}; by "
            f"{status.get('reviewer') or 'unnamed'} at {status['reviewed_at']}")


def review_line(snapshot_dir: Path, manifest: dict) -> str:
    """One line for `mlops data show`."""
    status = review_status(snapshot_dir)
    need = " (required before training)" if _required(snapshot_dir, manifest) else ""
    if not status:
        return f"review     none{need}"
    state = "complete" if status["complete"] else f"incomplete, {status['missing']} missing"
    return (f"review     {status['judged']}/{status['drawn']} judged ({state}){need}: {status['ok']} ok, "
            f"{status['bad']} bad ({status['bad_share']:.1%}), {status['reviewed_at']}")
