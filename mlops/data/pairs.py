"""Preference pairs (`data.record_type: preference`): reading a pair record's parts and checking it alone.

A pair record (kind `pair`, mlops.data.records) holds its prompt turns, then `{"role": "chosen", ...}` and
`{"role": "rejected", ...}` as its last two messages, so PII scrubbing, decontamination and quarantine excerpts
see all three parts without knowing about pairs. What differs from a chat record:

  * checks of the pair itself, before the quality filters: nothing asked (`empty_prompt`), an empty answer
    (`empty_chosen`, `empty_rejected`),
    the same answer on both sides (`identical_pair`, after trimming spaces), a side over `filters.max_chars`
    (`too_long`: a side is the prompt plus its answer);
  * the quality filters judge the chosen side (prompt + chosen as the assistant turn): it is what the model is
    pulled towards. The rejected answer is meant to be worse, so it is judged only by the pair checks, the
    blocklist (run on all three parts), PII scrubbing and decontamination;
  * dedup keys on the prompt and the chosen answer (the text of the chat record they make): two pairs that only
    differ in what they reject teach the same thing;
  * tokenization renders each side with the chat template and trains on its answer only (mlops.data.checks);
    a side over seq_len sets the pair aside (`record.too_many_tokens`), never truncated.
"""

from __future__ import annotations

from typing import Any

from mlops.data.records import PAIR_ROLES, MixedRecordTypes, Record

RECORD_TYPES = ("chat", "preference")
Verdict = tuple[bool, str]
OK: Verdict = (True, "")


def is_pair(record: Record) -> bool:
    return record.kind == "pair"


def parts(record: Record) -> tuple[list[dict[str, str]], str, str]:
    """(prompt turns, chosen answer, rejected answer) of a pair record."""
    *prompt, chosen, rejected = record.messages
    if (chosen["role"], rejected["role"]) != PAIR_ROLES:
        raise ValueError(f"record {record.record_id} is not a pair record (its last roles are "
                         f"{chosen['role']}, {rejected['role']})")
    return prompt, chosen["content"], rejected["content"]


def side(record: Record, role: str) -> list[dict[str, str]]:
    """One side as the chat the trainer sees: the prompt turns, then the answer as the assistant turn."""
    prompt, chosen, rejected = parts(record)
    return [*prompt, {"role": "assistant", "content": chosen if role == "chosen" else rejected}]


def chosen_view(record: Record) -> Record:
    """The chosen side as a chat record (same id and place), for the quality filters."""
    return Record(record.record_id, record.source, record.line, record.domain, "chat", side(record, "chosen"))


def dedup_text(record: Record) -> str:
    """What exact and near dedup compare: for a pair the prompt and the chosen answer (the text of the chat record
    they make, so a pair also meets that chat record in an earlier snapshot's index); else the whole text."""
    if not is_pair(record):
        return record.text
    return "\n".join(m["content"] for m in side(record, "chosen"))


def side_chars(record: Record) -> int:
    """Characters of the longer side (prompt plus answer); for any other record its whole text."""
    if not is_pair(record):
        return sum(len(m["content"]) for m in record.messages)
    prompt, chosen, rejected = parts(record)
    return sum(len(m["content"]) for m in prompt) + max(len(chosen), len(rejected))


def check_pair(record: Record) -> Verdict:
    """What makes a pair no pair: nothing asked, an empty side, or the same answer on both sides."""
    prompt, chosen, rejected = parts(record)
    if not any(m["content"].strip() for m in prompt if m["role"] == "user"):
        return False, "empty_prompt"
    if not chosen.strip():
        return False, "empty_chosen"
    if not rejected.strip():
        return False, "empty_rejected"
    if chosen.strip() == rejected.strip():
        return False, "identical_pair"
    return OK


def filter_pair(record: Record, cfg: Any) -> Verdict:
    """The pair checks, the side length, the blocklist on all three parts, then the quality filters (`cfg` is
    data.filters) on the chosen side; the first failure decides."""
    from mlops.data.filters import FILTERS, run_filters

    ok, reason = check_pair(record)
    if not ok:
        return ok, reason
    if "length" in cfg.steps and side_chars(record) > cfg.max_chars:
        return False, "too_long"
    ok, reason = FILTERS.get("blocklist")(record, cfg)
    if not ok:
        return ok, reason
    return run_filters(chosen_view(record), cfg)


def require_type(record: Record, record_type: str) -> None:
    """A pair in a chat build, or anything but a pair in a preference build, stops the build: one snapshot holds
    one record type (the trainer reads a preference snapshot as row pairs)."""
    if is_pair(record) == (record_type == "preference"):
        return
    where = f"{record.source}, line {record.line}"
    if is_pair(record):
        raise MixedRecordTypes(
            f"{where}: a preference pair (chosen/rejected) in a chat build (data.record_type=chat). Fix: set "
            "data.record_type: preference to build a pair snapshot, and keep chat records in a build of their own."
        )
    raise MixedRecordTypes(
        f"{where}: a {record.kind} record in a preference build (data.record_type=preference); a pair snapshot "
        "holds only pairs (`prompt` or `messages`, with `chosen` and `rejected`). Fix: move chat records to a "
        "source of a chat build (data.record_type: chat), or write this row as a pair."
    )


def same_after_normalising(chosen: str, rejected: str) -> bool:
    """The answers say the same words (case, punctuation and spacing aside): the gate's `identical` column."""
    from mlops.data.dedup import normalise

    return normalise(chosen) == normalise(rejected)


def length_ratio(chosen: str, rejected: str) -> float:
    """Characters of chosen over rejected (rejected counted as at least 1): the gate's `length_ratio` column."""
    return round(len(chosen) / max(1, len(rejected)), 6)
