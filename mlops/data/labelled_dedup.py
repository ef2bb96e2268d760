"""A labelled near-duplicate set: many distinct support conversations written from shared templates (so
distinct ones overlap the way real support chats do and LSH proposes them as candidates), plus light edits of
some of them (a greeting, a sign-off, a changed word or number, a typo, punctuation) that are the near
duplicates. Every record carries its group: records of one group are duplicates of each other, records of
different groups are not.

`dedup_cases(n, seed)` is deterministic. `evaluate(cases, index)` replays records through a near-dup index in
order and reports precision and recall of the drops against the groups (and against exact shingle Jaccard).
Tests also use `conversations()` as plain good records.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

CUSTOMERS = ["I", "My partner", "My mother", "Our office", "My flatmate", "My son", "We", "The whole family"]
PRODUCTS = ["fiber plan", "mobile plan", "router", "TV box", "mesh extender", "cloud backup", "home phone",
            "prepaid SIM", "thermostat", "business line", "tablet contract", "smart speaker", "VPN add-on"]
PROBLEMS = ["keeps dropping the connection", "was billed twice", "shows a fee nobody explained", "stopped working",
            "is much slower than promised", "never arrived", "arrived damaged", "cannot be activated",
            "lost every setting after the update", "blinks orange all night", "refuses the new password",
            "charges roaming at home", "was cancelled without notice", "shows the wrong address"]
SINCE = ["since Monday", "after the storm", "since the last update", "for three weeks", "since we moved",
         "after the engineer visit", "since the price change", "every evening around eight", "since my holiday",
         "after I changed banks", "since the outage", "whenever it rains"]
TRIED = ["restarting it twice", "resetting it to factory settings", "calling the hotline", "checking every cable",
         "updating the app", "moving it to another room", "waiting a full day", "reading the help pages",
         "asking a neighbour", "switching the Wi-Fi channel", "replacing the batteries", "logging out and back in"]
ASKS = ["Can you fix it", "What should I do next", "Can someone call me", "Is there an outage", "Can I get a refund",
        "How long will this take", "Can you send a technician", "Should I return it", "Can you explain the charge"]
STEPS = ["unplug the device for thirty seconds", "open Settings and pick Network", "run the line test in the app",
         "compare the invoice with the plan summary", "send us a photo of the label", "check the card on file",
         "book a technician for a morning slot", "switch to the five gigahertz band", "reinstall the app",
         "confirm the delivery address", "reset the PIN from the account page", "wait for the overnight sync",
         "disable the VPN for a moment", "move the box away from the microwave", "tap Dispute next to the charge"]
WHEN = ["today", "within two working days", "before Friday", "by tomorrow morning", "within a week", "tonight"]
CLOSE = ["Let me know if that helps.", "Sorry for the trouble.", "Reply here if it happens again.",
         "Thanks for your patience.", "We are here if you need more help.", "Have a good evening."]
GREETINGS = ["Hi,", "Hello there,", "Good morning,", "Hey,", "Hi again,", "Hello,"]
SIGNOFFS = ["Thanks!", "Cheers.", "Many thanks in advance.", "Kind regards.", "Thank you so much."]
SWAPS = {"twice": "two times", "evening": "night", "cannot": "can't", "full": "whole", "photo": "picture",
         "again": "once more", "help": "assist", "keeps": "continues", "since": "ever since", "next": "now"}


def conversation(r: random.Random) -> list[dict[str, str]]:
    order = r.randint(100000, 999999)
    user = (f"{r.choice(CUSTOMERS)} have a problem: the {r.choice(PRODUCTS)} {r.choice(PROBLEMS)} "
            f"{r.choice(SINCE)}. We already tried {r.choice(TRIED)} and {r.choice(TRIED)}, and order {order} "
            f"is still open. {r.choice(ASKS)}?")
    steps = r.sample(STEPS, 3)
    answer = (f"Thanks for the details on order {order}. First {steps[0]}, then {steps[1]}. If that does not "
              f"solve it, {steps[2]} and we will follow up {r.choice(WHEN)}. {r.choice(CLOSE)}")
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def conversations(n: int, seed: int = 1, domain: str = "general") -> list[dict]:
    r = random.Random(seed)
    return [{"messages": conversation(r), "domain": domain} for _ in range(n)]


def light_edit(messages: list[dict[str, str]], r: random.Random) -> list[dict[str, str]]:
    """One or two small edits people make when they send the same message again."""
    out = [dict(m) for m in messages]
    for _ in range(r.randint(1, 2)):
        m = out[r.randrange(len(out))]
        kind = r.choice(["greet", "signoff", "swap", "typo", "punct", "case"])
        text = m["content"]
        if kind == "greet":
            text = f"{r.choice(GREETINGS)} {text}"
        elif kind == "signoff":
            text = f"{text} {r.choice(SIGNOFFS)}"
        elif kind == "swap":
            present = [w for w in SWAPS if f" {w} " in text]
            text = text.replace(f" {r.choice(present)} ", f" {SWAPS[r.choice(present)]} ", 1) if present else text + " ok"
        elif kind == "typo":
            words = text.split()
            i = r.randrange(len(words))
            w = words[i]
            words[i] = w[:-1] if len(w) > 3 else w + w[-1]
            text = " ".join(words)
        elif kind == "punct":
            text = text.replace(".", "!", 1).replace(",", "", 1)
        else:
            text = text.lower()
        m["content"] = text
    return out


@dataclass
class DedupCase:
    record_id: str
    group: int
    messages: list[dict[str, str]]

    @property
    def text(self) -> str:
        return "\n".join(m["content"] for m in self.messages)


def dedup_cases(n: int, seed: int = 7, dup_share: float = 0.1) -> list[DedupCase]:
    """`n` records: distinct conversations, and about `dup_share` of them light edits of an earlier one."""
    r = random.Random(seed)
    cases: list[DedupCase] = []
    for i in range(n):
        if cases and r.random() < dup_share:
            source = r.choice(cases)
            cases.append(DedupCase(f"r-{i:016x}", source.group, light_edit(source.messages, r)))
        else:
            cases.append(DedupCase(f"r-{i:016x}", i, conversation(r)))
    return cases


def exact_jaccard(a: str, b: str, k: int = 3) -> float:
    from mlops.data.dedup import shingles

    sa, sb = set(shingles(a, k)), set(shingles(b, k))
    return len(sa & sb) / len(sa | sb) if sa | sb else 1.0


def signatures(cases: list[DedupCase], num_perm: int = 128, shingle: int = 3) -> list:
    from mlops.data.dedup import signature

    return [signature(c.text, num_perm, shingle) for c in cases]


def evaluate(cases: list[DedupCase], index, sigs: list | None = None, shingle: int = 3, threshold: float = 0.7) -> dict:
    """Replay the records in order through `index.check_add(sig, key)` (exact duplicates never occur here)."""
    sigs = sigs if sigs is not None else signatures(cases, index.num_perm, shingle)
    by_id = {c.record_id: c for c in cases}
    drops = right = right_by_rule = 0
    for case, sig in zip(cases, sigs, strict=True):
        match = index.check_add(sig, case.record_id)
        if match is None:
            continue
        earlier = match[0] if isinstance(match, tuple) else match
        drops += 1
        right += by_id[earlier].group == case.group
        right_by_rule += exact_jaccard(by_id[earlier].text, case.text, shingle) >= threshold
    # A record is a findable duplicate when an earlier record of its group exists.
    seen: set[int] = set()
    expected = 0
    for case in cases:
        expected += case.group in seen
        seen.add(case.group)
    return {"records": len(cases), "drops": drops, "wrong_drops": drops - right,
            "precision": right / drops if drops else 1.0, "precision_by_rule": right_by_rule / drops if drops else 1.0,
            "recall": right / expected if expected else 1.0, "duplicates": expected}
