"""Preference pairs from production (`mlops data harvest --pairs`): the same loop back as mlops.data.harvest, with
pairs instead of corrected chats, reviewed the same way (`accepted: null` for a person to set true or false).

    harvest_pairs(since, out, spotchecks=[...])  -> pairs.jsonl: one candidate pair per row (re-running merges and
                                                   keeps every review)
    review_pair(out, pair_id, accepted, ...)      -> set one row's decision (and optionally its chosen answer)
    accept_pairs(out)                             -> accepted-pairs.jsonl: pair records for a preference build, plus
                                                   its .provenance.json naming the requests, traces, feedback and
                                                   spot-check items they came from
    pairs_config(cfg, out)                        -> the config of a preference snapshot built from that source

Where pairs come from (every one names its origin in `provenance`, which the build carries into the snapshot):

  * corrections: a served answer that got a correction; chosen = the correction, rejected = the served answer;
  * spot-checks: verdicts of `mlops registry spot-check export <check>` files (the registry's public export; this
    module never imports the registry); chosen = the answer the reviewer preferred, rejected = the other. Ties
    (`same`), single-answer items, unjudged items, a preferred answer marked as stating a wrong fact and answers
    that are errors are dropped;
  * shadow traffic: a served answer rated down (newest rating < 0) whose request a shadow model also answered;
    chosen = the shadow's answer, rejected = the served one. The shadow's answer was never rated, only not rated
    worse, which is why a person confirms each pair before it is accepted. Failed or empty shadow answers, and
    ones that say what the served answer said, are dropped.

Texts come from the request log (scrubbed when stored) and the spot-check store; the build scrubs again.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from mlops.data.harvest import (
    PROVENANCE_SUFFIX,
    HarvestError,
    _iso,
    _requests,
    _write_rows,
    parse_since,
    read_reviewed_rows,
)

PAIRS = "pairs.jsonl"
PAIRS_META = "pairs.json"
ACCEPTED_PAIRS = "accepted-pairs.jsonl"
KINDS = ("correction", "spotcheck", "shadow")
NO_ANSWER = re.compile(r"^\[no answer: .*\]$", re.DOTALL)  # how a spot-check shows an answer that failed
_SPACE = re.compile(r"\s+")


def _same(a: str, b: str) -> bool:
    return _SPACE.sub(" ", (a or "").strip()) == _SPACE.sub(" ", (b or "").strip())


def _prompt(messages: Any) -> list[dict] | None:
    """The prompt turns (system, user, assistant) ending in a user turn, or None when there is none to answer."""
    turns = [{"role": m["role"], "content": m["content"]} for m in messages or []
             if isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
             and isinstance(m.get("content"), str)]
    return turns if turns and turns[-1]["role"] == "user" else None


def _row(pair_id: str, kind: str, prompt: list[dict], chosen: str, rejected: str, provenance: dict,
         **extra: Any) -> dict:
    return {"pair_id": pair_id, "kind": kind, "messages": prompt, "chosen": chosen, "rejected": rejected,
            "provenance": {"kind": kind, **provenance}, "accepted": None, "note": "", **extra}


# --------------------------------------------------------------------------- the three origins (pure)


def correction_pairs(feedback: dict[str, list[dict]], requests: dict[str, dict], dropped: Counter) -> list[dict]:
    """Pairs from corrections: `feedback` by request id (oldest first), `requests` the user-facing logged rows."""
    from mlops.requestlog import trace_id_of

    out = []
    for rid, fbs in sorted(feedback.items()):
        corrections = [f["correction"].strip() for f in fbs if (f.get("correction") or "").strip()]
        if not corrections:
            continue
        req, prompt = requests.get(rid), None
        if req is not None:
            prompt = _prompt(req["messages"])
        if req is None or prompt is None or not (req.get("response") or "").strip():
            dropped["correction.no_request" if req is None else "correction.no_prompt_or_answer"] += 1
            continue
        if _same(corrections[-1], req["response"]):
            dropped["correction.same_as_answer"] += 1
            continue
        out.append(_row(f"correction:{rid}", "correction", prompt, corrections[-1], req["response"],
                        {"request_id": rid, "trace_id": trace_id_of(rid),
                         "feedback_ids": [f["feedback_id"] for f in fbs]},
                        model=req["model"], version=req["version"], ts=_iso(req["ts"])))
    return out


def shadow_pairs(feedback: dict[str, list[dict]], requests: dict[str, dict], shadows: list[dict],
                 dropped: Counter) -> list[dict]:
    """Pairs from shadow traffic: a served answer rated down (its newest rating) against the shadow's answer to the
    same request (`shadows`: request log rows of role shadow whose parent_id is the served request)."""
    from mlops.requestlog import trace_id_of

    out = []
    for shadow in sorted(shadows, key=lambda r: (r["ts"], r["request_id"])):
        rid = shadow.get("parent_id")
        fbs, req = feedback.get(rid or ""), requests.get(rid or "")
        if not fbs or fbs[-1]["rating"] >= 0 or req is None:
            continue  # only a served answer rated down is the rejected side of a shadow pair
        prompt = _prompt(req["messages"])
        answer = (shadow.get("response") or "").strip()
        if shadow.get("status", 200) >= 400 or shadow.get("error") or not answer or prompt is None:
            dropped["shadow.no_answer"] += 1
            continue
        if _same(answer, req.get("response") or ""):
            dropped["shadow.same_as_answer"] += 1
            continue
        out.append(_row(f"shadow:{shadow['request_id']}", "shadow", prompt, answer, req.get("response") or "",
                        {"request_id": rid, "trace_id": trace_id_of(rid), "shadow_request_id": shadow["request_id"],
                         "shadow_trace_id": trace_id_of(shadow["request_id"]), "shadow_version": shadow.get("version"),
                         "feedback_ids": [f["feedback_id"] for f in fbs]},
                        model=req["model"], version=req["version"], ts=_iso(req["ts"])))
    return out


def _letters(raw: Any) -> set[str]:
    """wrong_fact as the export writes it or a person types it ("A", "a,b", ["B"], null)."""
    items = raw if isinstance(raw, list | tuple | set) else list(str(raw or ""))
    return {str(x).strip().upper() for x in items} - {",", " ", ""}


def spotcheck_pairs(items: list[tuple[str, int, dict]], dropped: Counter) -> list[dict]:
    """Pairs from spot-check verdicts: (file, line, exported item) rows; see the module docstring for what drops."""
    from mlops.requestlog import trace_id_of

    out = []
    for where, line, item in items:
        if not isinstance(item, dict) or not item.get("check_id") or "item" not in item:
            raise HarvestError(f"{where}, line {line}: not a spot-check item (needs check_id and item). Fix: pass "
                               "the file `mlops registry spot-check export <check id>` wrote, with verdicts filled in.")
        preferred = str(item.get("preferred") or "").strip().upper()
        answers = {"A": item.get("answer_a"), "B": item.get("answer_b")}
        reason = ("unjudged" if not preferred else "tie" if preferred == "SAME"
                  else "single_answer" if preferred not in answers or answers["B"] is None
                  else "preferred_wrong_fact" if preferred in _letters(item.get("wrong_fact")) else "")
        if not reason:
            chosen, rejected = answers[preferred], answers["B" if preferred == "A" else "A"]
            prompt = _prompt(item.get("prompt"))
            reason = ("no_answer" if not all(isinstance(a, str) and a.strip() and not NO_ANSWER.match(a.strip())
                                             for a in (chosen, rejected))
                      else "no_prompt" if prompt is None else "same_answers" if _same(chosen, rejected) else "")
        if reason:
            dropped[f"spotcheck.{reason}"] += 1
            continue
        provenance = {"spotcheck_id": item["check_id"], "item": item["item"], "prompt_source": item.get("source")}
        source = str(item.get("source") or "")
        if source.startswith("request:"):  # a served request the spot-check drew
            provenance |= {"request_id": source[len("request:"):], "trace_id": trace_id_of(source[len("request:"):])}
        out.append(_row(f"spotcheck:{item['check_id']}#{item['item']}", "spotcheck", prompt, chosen.strip(),
                        rejected.strip(), provenance, ts=""))
    return out


def read_spotchecks(paths: list[Path | str]) -> list[tuple[str, int, dict]]:
    rows = []
    for path in map(Path, paths):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise HarvestError(f"spot-check file '{path}' cannot be read ({err.strerror or err}). Fix: write it with "
                               "`mlops registry spot-check export <check id> > FILE`.") from None
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append((str(path), number, json.loads(line)))
                except ValueError as err:
                    raise HarvestError(f"{path}, line {number}: not valid JSON ({err}). Fix: keep one JSON object per "
                                       "line as the export wrote it.") from None
    return rows


# --------------------------------------------------------------------------- harvest, review, accept


def collect_pairs(since: float | None, *, model: str | None = None, url: str | None = None,
                  spotchecks: list[Path | str] = ()) -> tuple[list[dict], Counter]:
    """(candidate pairs, dropped counts by reason) from the request log since `since` (None: skip it) and the
    spot-check files."""
    dropped: Counter = Counter()
    rows = spotcheck_pairs(read_spotchecks(list(spotchecks)), dropped)
    if since is not None:
        from mlops.requestlog import read_feedback, read_requests

        feedback: dict[str, list[dict]] = {}
        for fb in read_feedback(since=since, url=url):
            feedback.setdefault(fb["request_id"], []).append(fb)
        down = sorted(rid for rid, fbs in feedback.items() if fbs[-1]["rating"] < 0)
        shadows = read_requests(parent_ids=down, url=url) if down else []
        requests = {rid: req for rid, req in _requests(sorted(feedback), url).items()
                    if not model or req["model"] == model}
        rows += correction_pairs(feedback, requests, dropped) + shadow_pairs(feedback, requests, shadows, dropped)
    return rows, dropped


def harvest_pairs(since: str | None, out: Path | str, *, model: str | None = None, url: str | None = None,
                  spotchecks: list[Path | str] = ()) -> dict:
    """Write (or extend) `out`/pairs.jsonl; rows already there keep their review."""
    from mlops.files import atomic_write_json

    if since is None and not spotchecks:
        raise HarvestError("`mlops data harvest --pairs` needs --since <ISO time> (corrections and shadow pairs from "
                           "the request log) and/or --spotchecks FILE (reviewed spot-check exports).")
    out = Path(out)
    rows, dropped = collect_pairs(parse_since(since) if since else None, model=model, url=url, spotchecks=spotchecks)
    existing = {r["pair_id"]: r for _, r in read_pairs(out)} if (out / PAIRS).exists() else {}
    added = [r for r in rows if r["pair_id"] not in existing]
    merged = sorted([*existing.values(), *added], key=lambda r: (r.get("ts") or "", r["pair_id"]))
    out.mkdir(parents=True, exist_ok=True)
    _write_rows(out / PAIRS, merged)
    meta = {"since": _iso(parse_since(since)) if since else None, "model": model,
            "spotcheck_files": [str(p) for p in spotchecks], "harvested_at": _iso(time.time()), "rows": len(merged),
            "added": len(added), "by_kind": dict(sorted(Counter(r["kind"] for r in added).items())),
            "dropped": dict(sorted(dropped.items()))}
    atomic_write_json(out / PAIRS_META, meta)
    return {**meta, "path": str(out / PAIRS), "pending": sum(r.get("accepted") is None for r in merged)}


def read_pairs(out: Path | str) -> list[tuple[int, dict]]:
    return read_reviewed_rows(Path(out) / PAIRS, key="pair_id", editable="accepted, note and chosen",
                              missing=f"run `mlops data harvest --pairs --since <time> --out {out}` (and/or "
                              "--spotchecks FILE)")


def review_pair(out: Path | str, pair_id: str, accepted: bool | None, *, note: str = "",
                chosen: str | None = None) -> dict:
    """Set one pair's decision (and optionally rewrite its chosen answer); returns the row."""
    rows = read_pairs(out)
    for _, row in rows:
        if row["pair_id"] == pair_id:
            row.update(accepted=accepted, note=note, **({"chosen": chosen} if chosen is not None else {}))
            _write_rows(Path(out) / PAIRS, [r for _, r in rows])
            return row
    raise HarvestError(f"pair '{pair_id}' is not in {Path(out) / PAIRS}. Fix: pick a pair_id from that file.")


def accept_pairs(out: Path | str) -> dict:
    """Write the accepted pairs as a preference source and its provenance; undecided rows wait."""
    from mlops.files import atomic_write_json

    out = Path(out)
    records, decided = [], {"accepted": [], "rejected": [], "pending": []}
    for number, row in read_pairs(out):
        state = row.get("accepted")
        if state not in (True, False, None):
            raise HarvestError(f"{out / PAIRS}, line {number}: accepted={state!r}; it must be true, false or null. "
                               "Nothing was written.")
        if state is True:
            records.append(_pair_record(row, f"{out / PAIRS}, line {number}"))
        decided["accepted" if state else "pending" if state is None else "rejected"].append(row["pair_id"])
    if not records:
        raise HarvestError(f"no pair of {out / PAIRS} is accepted ({len(decided['pending'])} pending, "
                           f"{len(decided['rejected'])} rejected). Fix: set \"accepted\": true on the pairs to learn "
                           "from.")
    _write_rows(out / ACCEPTED_PAIRS, records)
    origins = [r["provenance"] for r in records]
    provenance = {"kind": "harvest_pairs", "pairs": decided["accepted"],
                  "requests": sorted({o["request_id"] for o in origins if o.get("request_id")}),
                  "traces": sorted({o["trace_id"] for o in origins if o.get("trace_id")}),
                  "feedback": [f for o in origins for f in o.get("feedback_ids") or []],
                  "spotchecks": [f"{o['spotcheck_id']}#{o['item']}" for o in origins if o.get("spotcheck_id")],
                  "by_kind": dict(sorted(Counter(o["kind"] for o in origins).items()))}
    atomic_write_json(out / (ACCEPTED_PAIRS + PROVENANCE_SUFFIX), provenance)
    return {"path": str(out / ACCEPTED_PAIRS), "accepted": len(records), "rejected": len(decided["rejected"]),
            "pending": len(decided["pending"]), "by_kind": provenance["by_kind"]}


def _pair_record(row: dict, where: str) -> dict:
    chosen, rejected = row.get("chosen"), row.get("rejected")
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(value, str) or not value.strip():
            raise HarvestError(f"{where}: pair {row['pair_id']} is accepted but its {name} answer is empty. Nothing "
                               f"was written. Fix: write the {name} answer, or set \"accepted\": false.")
    if _same(chosen, rejected):
        raise HarvestError(f"{where}: pair {row['pair_id']} is accepted but its chosen and rejected answers are the "
                           "same. Nothing was written. Fix: edit \"chosen\", or set \"accepted\": false.")
    prompt = _prompt(row.get("messages"))
    if prompt is None:
        raise HarvestError(f"{where}: pair {row['pair_id']} has no user turn to answer. Nothing was written. Fix: set "
                           "\"accepted\": false.")
    return {"messages": prompt, "chosen": chosen.strip(), "rejected": rejected.strip(),
            "provenance": {"pair_id": row["pair_id"], **(row.get("provenance") or {})}}


def pairs_config(cfg: Any, out: Path | str, *, domain: str | None = None) -> Any:
    """`cfg` with the accepted pairs as its only source, as a preference build (natural domain mix); validated."""
    from mlops.config import require_section, validate_config

    data = require_section(cfg, "data").model_dump(mode="json")
    source = Path(out) / ACCEPTED_PAIRS
    if not source.is_file():
        raise HarvestError(f"'{out}' holds no {ACCEPTED_PAIRS}. Fix: review {PAIRS}, then `mlops data harvest accept "
                           f"{out} --pairs`.")
    data["sources"] = [{"path": str(source.resolve()), **({"domain": domain} if domain else {})}]
    data["record_type"] = "preference"
    data["mix"]["ratios"] = {}  # a handful of pairs comes in whatever domains it comes in
    data["mix"]["history"] = None  # history mixing samples rows one by one: it would split pairs
    if data.get("shard_size", 2) % 2:
        data["shard_size"] += 1
    data["pack"] = False
    return validate_config({**cfg.model_dump(mode="json"), "data": data}, source="harvest --pairs")
