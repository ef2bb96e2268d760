"""Layer 4 (acts): the human spot-check: a person with domain knowledge compares challenger and champion answers, blind.

`create` draws a stratified sample of business prompts (suite items and served requests), has both models answer
in deployment form, and stores the items with a random A/B order each; which letter is the challenger stays in
the database. A reviewer (role with `spot_check`, never the version's trainer or registrar) says per item which
answer is better (`A`, `B` or `same`), which answers state a wrong fact, and may add a note. A first release
has no champion: the untuned base model it was trained from answers the other side (when this machine holds it;
else each item has one answer, `acceptable`/`unacceptable`), so the check asks whether it improves on that.
Verdicts are un-blinded on the way in: better / same / worse / wrong_fact, always relative to the champion. Creating a check and completing (or amending) its review are ledger
entries; the review entry carries a digest of the verdicts it covered, so a verdict edited behind the registry's
back is seen.

The gate (`judge`) reads the newest reviewed check of a version: it passes when the configured share of items
is at least "same", no wrong fact in the challenger is unexplained (a note says why it is acceptable or what
is wrong), the champion is still the one compared against, and nobody reviewed their own model. An explained
wrong fact still counts against the share.
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import uuid
from functools import partial
from pathlib import Path

from mlops.identities import Identity, require
from registry import spotcheck_store as store
from registry.transition import ConcurrentChangeError, Plan, RefusedError, run

PAIRED = ("A", "B", "same")
SINGLE = ("acceptable", "unacceptable")  # an item without a champion answer (the first release)


def _answerer():
    from mlops.errors import MLOpsError
    from mlops.stages import service

    found = service("spot_check_answers")
    if found is None:
        raise MLOpsError("no stage answers spot-checks (the serving stage provides it). Fix: install the project "
                         "with `make install`.")
    return found


def create(actor: Identity, model: str, version: str, *, n: int | None = None, seed: int | None = None,
           answer=None, policy=None, url: str | None = None) -> dict:
    """Draw, answer, store and ledger a spot-check of `version` against the current champion."""
    from registry.resolve import release_policy
    from registry.resolve import verified_state as model_state
    from registry.spotcheck_sample import draw, sample_digest, served_prompts, suite_folder, suite_prompts

    require(actor, "request")
    policy = policy or release_policy().spot_check
    version = str(version)
    state = model_state(model, url=url)
    vs = _version(state, version)
    champion = state.aliases.get("production")
    if champion == version:
        raise RefusedError(f"version {version} of '{model}' is the champion itself; a spot-check compares a "
                           "challenger with the production version. Fix: spot-check another version.")
    seed = secrets.randbits(48) if seed is None else int(seed)
    prompts = draw(suite_prompts(suite_folder(policy.suite)), served_prompts(model),
                   n or policy.sample_size, policy.served_share, seed)
    if not prompts:
        raise RefusedError(f"no prompt to spot-check '{model}' with: the suite {policy.suite} holds no items and no "
                           "served request is logged. Fix: set registry.spot_check.suite to a folder of JSONL items.")
    answer = answer or partial(_answerer(), max_tokens=policy.max_tokens)
    asked = [p.messages for p in prompts]
    mine = answer(f"models:/{model}/{version}", asked)
    baseline = None if champion else base_model_of(vs)
    other_ref = f"models:/{model}/{champion}" if champion else baseline["path"] if baseline else None
    theirs = answer(other_ref, asked) if other_ref else [None] * len(prompts)
    check_id = "sc-" + uuid.uuid4().hex[:12]
    blind = random.Random(seed ^ 0xB11D)  # the A/B order: reproducible from the seed, which reviewers never see
    items = []
    for no, (prompt, ours, other) in enumerate(zip(prompts, mine, theirs, strict=True), start=1):
        a_is = "challenger" if other is None or blind.random() < 0.5 else "champion"
        a, b = (ours, other) if a_is == "challenger" else (other, ours)
        items.append({"check_id": check_id, "item_no": no, "source": prompt.source, "stratum": prompt.stratum,
                      "messages": prompt.messages, "reference": prompt.reference, "answer_a": _shown(a),
                      "answer_b": None if b is None else _shown(b), "a_is": a_is,
                      "answers_meta": {"challenger": _meta(ours), "champion": _meta(other)}})
    strata: dict[str, int] = {}
    for p in prompts:
        strata[p.stratum] = strata.get(p.stratum, 0) + 1
    champ_state = state.versions.get(champion) if champion else None
    check = {"check_id": check_id, "model": model, "version": version, "challenger_content_id": vs.content_id,
             "challenger_profile_hash": vs.evidence.get("profile_hash"), "champion_version": champion,
             "champion_content_id": champ_state.content_id if champ_state else None,
             "champion_profile_hash": champ_state.evidence.get("profile_hash") if champ_state else None,
             "baseline": f"{baseline['name']} ({baseline['id']})" if baseline else None,
             "created_by": actor.name, "created_ts": _now(), "seed": seed, "items": len(items), "strata": strata}
    store.insert_check(check, items, url)

    def plan_for(now) -> Plan:
        _version(now, version)
        if now.aliases.get("production") != champion:
            raise ConcurrentChangeError(f"production of '{model}' moved from {champion or 'nothing'} to "
                                        f"{now.aliases.get('production') or 'nothing'} while the answers were made. "
                                        "Nothing was ledgered. Fix: run the spot-check again.")
        evidence = {"check_id": check_id, "items": len(items), "strata": strata, "champion": champion,
                    "baseline": check["baseline"],
                    "champion_content_id": check["champion_content_id"], "content_id": vs.content_id,
                    "sample_digest": sample_digest(prompts), "served_items": strata.get("served", 0)}
        return Plan(entries=[dict(actor=actor.name, action="spot_check", model=model, version=version,
                                  reason=f"{len(items)} items drawn for blind human review", evidence=evidence)])

    entry = run(model, plan_for, url=url, actor=actor)[0]
    store.set_create_seq(check_id, entry.seq, url)
    return summary(check_id, url=url)


def record(reviewer: Identity, check_id: str, item_no: int, preferred: str, wrong_fact=(), note: str = "", *,
           url: str | None = None) -> dict:
    """Record one verdict (see `record_many`)."""
    return record_many(reviewer, check_id, [{"item": item_no, "preferred": preferred, "wrong_fact": wrong_fact,
                                             "note": note}], url=url)


def record_many(reviewer: Identity, check_id: str, verdicts: list[dict], *, url: str | None = None) -> dict:
    """Record verdicts ({item, preferred, wrong_fact, note}); all are checked before any is written.

    When every item has a verdict, the review is ledgered (again, whenever a later verdict changes it).
    """
    from registry.resolve import verified_state as model_state

    check = _ledgered(check_id, url)
    may_review(reviewer, model_state(check["model"], url=url), check)
    items = {i["item_no"]: i for i in store.items_of(check_id, url)}
    rows = [_verdict_row(reviewer, check_id, items, v) for v in verdicts]
    for row in rows:
        store.insert_verdict(row, url)
    return _maybe_complete(reviewer, check, url)


def may_review(reviewer: Identity, state, check: dict) -> None:
    """Refuse (RefusedError, AuthError) a reviewer without the role, or one who trained or registered the version."""
    require(reviewer, "spot_check")
    vs = _version(state, check["version"])
    if reviewer.name in (vs.trainer, vs.registered_by):
        raise RefusedError(f"'{reviewer.name}' trained or registered version {check['version']} of "
                           f"'{check['model']}' and so may not review its spot-check. Nothing was recorded. Fix: ask "
                           "another reviewer.")


def pending(check_id: str, *, url: str | None = None) -> list[dict]:
    """Blind items still without a verdict (what the app shows a reviewer next)."""
    return [i for i in blind_items(check_id, url=url) if i["preferred"] is None]


def blind_items(check_id: str, *, url: str | None = None) -> list[dict]:
    """Every item as a reviewer may see it: prompt, reference, answers A and B, the current verdict; never who
    answered what."""
    _ledgered(check_id, url)
    current = store.current_verdicts(check_id, url)
    out = []
    for item in store.items_of(check_id, url):
        v = current.get(item["item_no"])
        out.append({"check_id": check_id, "item": item["item_no"], "stratum": item["stratum"],
                    "source": item["source"], "prompt": item["messages"], "reference": item["reference"],
                    "answer_a": item["answer_a"], "answer_b": item["answer_b"],
                    "choices": list(PAIRED if item["answer_b"] is not None else SINGLE),
                    "preferred": v["preferred"] if v else None,
                    "wrong_fact": list(v["wrong_fact"]) if v else [], "note": v["note"] if v else "",
                    "reviewer": v["reviewer"] if v else None})
    return out


def import_rows(reviewer: Identity, rows: list[tuple[int, dict]], *, url: str | None = None) -> dict:
    """The JSONL round trip back in: (line, row) pairs; rows without a verdict or unchanged are skipped."""
    by_check: dict[str, list[dict]] = {}
    for line, row in rows:
        if not isinstance(row, dict) or not row.get("check_id") or "item" not in row:
            raise RefusedError(f"line {line}: not a spot-check item (needs check_id and item). Fix: import the file "
                               "`mlops registry spot-check export` wrote, with only the verdict fields edited.")
        if row.get("preferred") in (None, ""):
            continue
        by_check.setdefault(row["check_id"], []).append({**row, "line": line})
    done = {}
    for check_id, verdicts in by_check.items():
        current = {i["item"]: i for i in blind_items(check_id, url=url)}
        changed = [v for v in verdicts if _changed(current.get(v["item"]), v)]
        done[check_id] = record_many(reviewer, check_id, changed, url=url) if changed else summary(check_id, url=url)
        done[check_id]["imported"] = len(changed)
    return done


def summary(check_id: str, *, url: str | None = None) -> dict:
    check = _ledgered(check_id, url)
    current = store.current_verdicts(check_id, url)
    return {**{k: check.get(k) for k in ("check_id", "model", "version", "champion_version", "baseline",
                                         "created_by", "created_ts", "items", "strata")},
            "reviewed": len(current), "complete": len(current) == check["items"], "tallies": tally(current)}


def tally(current: dict[int, dict]) -> dict:
    counts = dict.fromkeys(("better", "same", "worse", "wrong_fact"), 0)
    for v in current.values():
        counts[v["verdict"]] += 1
    reviewed = sum(counts.values())
    return {**counts, "reviewed": reviewed,
            "share_same_or_better": round((counts["better"] + counts["same"]) / reviewed, 4) if reviewed else 0.0,
            "unexplained_wrong_facts": sorted(n for n, v in current.items()
                                              if v["verdict"] == "wrong_fact" and not v["note"].strip()),
            "reviewers": sorted({v["reviewer"] for v in current.values()})}


def verdict_digest(current: dict[int, dict]) -> str:
    body = [[n, v["reviewer"], v["preferred"], v["wrong_fact"], v["note"], v["verdict"]]
            for n, v in sorted(current.items())]
    return hashlib.sha256(json.dumps(body, ensure_ascii=False).encode()).hexdigest()


def judge(state, version: str, policy, *, url: str | None = None) -> tuple[bool, str, dict]:
    """The spot-check gate: (passed, detail, evidence) from the newest ledgered review of `version`."""
    from registry import ledger

    own = state.entries or ledger.verified(url).of(state.model)  # a replayed state carries its verified entries
    reviews = [e for e in own if e.action == "spot_check_review" and e.version == str(version)]
    if not reviews:
        return False, (f"no reviewed spot-check of version {version}. Fix: `mlops registry spot-check {state.model} "
                       f"{version} --n {policy.sample_size}`, then a reviewer other than its trainer records a "
                       "verdict per item (app or export/import)"), {}
    last = reviews[-1]
    check = store.get_check(last.evidence["check_id"], url) or {}
    current = store.current_verdicts(check.get("check_id", ""), url)
    counts = tally(current)
    champion = state.versions.get(state.aliases.get("production", ""))
    evidence = {"check_id": check.get("check_id"), "review_seq": last.seq, "min_share": policy.min_share_same_or_better,
                "champion_in_check": check.get("champion_version"), **counts}
    vs = state.versions[str(version)]
    if champion is not None and champion.version == str(version):
        champion = None
    if check.get("champion_content_id") != (champion.content_id if champion else None):
        now = f"v{champion.version}" if champion else "no champion"
        return False, (f"spot-check {check.get('check_id')} compared against v{check.get('champion_version')}, but the "
                       f"champion now is {now}: it is stale. Run a new spot-check"), evidence
    if verdict_digest(current) != last.evidence.get("digest"):
        return False, (f"the verdicts of spot-check {check.get('check_id')} differ from those its review entry "
                       f"#{last.seq} ledgered: they were changed outside the registry"), evidence
    own = [r for r in counts["reviewers"] if r in (vs.trainer, vs.registered_by)]
    if own:
        return False, f"spot-check reviewed by {', '.join(own)}, who trained or registered the version", evidence
    if counts["unexplained_wrong_facts"]:
        return False, (f"items {counts['unexplained_wrong_facts']} mark a wrong fact in the challenger with no "
                       "note explaining it"), evidence
    if counts["share_same_or_better"] < policy.min_share_same_or_better:
        return False, (f"{counts['share_same_or_better']:.0%} of {counts['reviewed']} items are at least as good as "
                       f"the champion's; the policy needs {policy.min_share_same_or_better:.0%}"), evidence
    return True, (f"spot-check {check['check_id']}: {counts['share_same_or_better']:.0%} of {counts['reviewed']} "
                  f"items same or better, reviewed by {', '.join(counts['reviewers'])}"), evidence


# --------------------------------------------------------------------------- helpers


def _maybe_complete(reviewer: Identity, check: dict, url: str | None) -> dict:
    from registry import ledger

    current = store.current_verdicts(check["check_id"], url)
    if len(current) < check["items"]:
        return summary(check["check_id"], url=url)
    digest = verdict_digest(current)
    reviews = [e for e in ledger.verified(url).of(check["model"]) if e.action == "spot_check_review"
               and e.evidence.get("check_id") == check["check_id"]]
    if reviews and reviews[-1].evidence.get("digest") == digest:
        return summary(check["check_id"], url=url)
    counts = tally(current)
    evidence = {"check_id": check["check_id"], "digest": digest, "create_seq": check["create_seq"],
                "champion": check["champion_version"], **counts}
    what = "amended" if reviews else "completed"
    entry = dict(actor=reviewer.name, action="spot_check_review", model=check["model"], version=check["version"],
                 reason=f"spot-check {check['check_id']} review {what}: {counts['better']} better, {counts['same']} "
                        f"same, {counts['worse']} worse, {counts['wrong_fact']} wrong fact", evidence=evidence)
    run(check["model"], lambda _state: Plan(entries=[entry]), url=url, actor=reviewer)
    return summary(check["check_id"], url=url)


def _verdict_row(reviewer: Identity, check_id: str, items: dict[int, dict], v: dict) -> dict:
    where = f"line {v['line']}: " if v.get("line") else ""
    try:
        item = items[int(v.get("item"))]
    except (KeyError, TypeError, ValueError):
        raise RefusedError(f"{where}spot-check {check_id} has no item {v.get('item')!r} (items 1-{len(items)}). "
                           "Nothing was recorded.") from None
    paired = item["answer_b"] is not None
    choices = PAIRED if paired else SINGLE
    said = _choice(v.get("preferred"), choices)
    if said is None:
        raise RefusedError(f"{where}item {item['item_no']}: preferred={v.get('preferred')!r} is not one of "
                           f"{', '.join(choices)}. Nothing was recorded. Fix: say which answer is better, or same.")
    letters = _letters(v.get("wrong_fact"))
    shown = {"A", "B"} if paired else {"A"}
    if not set(letters) <= shown:
        raise RefusedError(f"{where}item {item['item_no']}: wrong_fact={v.get('wrong_fact')!r} may only name "
                           f"{sorted(shown)}. Nothing was recorded.")
    mine = "A" if item["a_is"] == "challenger" else "B"
    if mine in letters:
        verdict = "wrong_fact"
    elif said in ("same", "acceptable"):
        verdict = "same"
    elif said == "unacceptable":
        verdict = "worse"
    else:
        verdict = "better" if said == mine else "worse"
    return {"check_id": check_id, "item_no": item["item_no"], "reviewer": reviewer.name, "ts": _now(),
            "preferred": said, "wrong_fact": letters, "note": str(v.get("note") or "").strip(),
            "verdict": verdict}


def _choice(raw, choices: tuple[str, ...]) -> str | None:
    return {c.lower(): c for c in choices}.get(str(raw or "").strip().lower())


def _letters(raw) -> str:
    """wrong_fact as given ("A", "a,b", ["B"], null) in its stored form: "", "A", "B" or "AB"."""
    items = raw if isinstance(raw, list | tuple | set) else list(str(raw or ""))
    return "".join(sorted({str(x).strip().upper() for x in items} - {",", " ", ""}))


def _changed(current: dict | None, row: dict) -> bool:
    if current is None or current["preferred"] is None:
        return True
    said = _choice(row.get("preferred"), tuple(current["choices"])) or row.get("preferred")
    return (said, _letters(row.get("wrong_fact")), str(row.get("note") or "").strip()) != \
        (current["preferred"], "".join(current["wrong_fact"]), current["note"])


def _ledgered(check_id: str, url: str | None) -> dict:
    check = store.get_check(check_id, url)
    if check is None or check.get("create_seq") is None:
        raise RefusedError(f"spot-check '{check_id}' does not exist (or was never ledgered). Fix: list them with "
                           "`mlops registry spot-check list <model>`.")
    return check


def base_model_of(version_state) -> dict | None:
    """The untuned base model a version was trained from (catalog entry), when this machine holds it: a first
    release is compared with what it improves on. None when it is not here (the check is then single-answer)."""
    from mlops.base_models import catalog
    from mlops.lineage import Tag

    lineage = version_state.evidence.get("lineage") or {}
    wanted = lineage.get(str(Tag.BASE_MODEL_ID))
    for entry in catalog().values():
        if wanted and entry.get("id") == wanted and Path(entry.get("path", "")).is_dir():
            return entry
    return None


def _version(state, version: str):
    vs = state.versions.get(str(version))
    if vs is None:
        raise RefusedError(f"'{state.model}' has no version {version} in the ledger. Fix: pass a registered version.")
    return vs


def _shown(answer: dict) -> str:
    return answer["text"] if not answer.get("error") else f"[no answer: {answer['error']}]"


def _meta(answer: dict | None) -> dict | None:
    return None if answer is None else {k: answer.get(k) for k in ("latency_ms", "tokens", "error")}


def _now() -> str:
    from registry.ledger import utc_now

    return utc_now()
