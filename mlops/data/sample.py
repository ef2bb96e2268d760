"""Deterministic customer-support sample data for the demo and the benchmark (`mlops data sample`).

The corpus teaches the Northwind Outfitters policy the business eval suite asks about
(evaluation/suites/business/POLICY.md): agents answer from the facts in `sample_policy.yaml`, in many
paraphrases, over one to three turns, alongside general chats, policy-grounded instructions, format tasks and
help-centre articles. `round_=1` covers the round-1 facts; `round_=2` (the release loop's incremental round)
adds the rest and restates round 1. It is written as JSONL, Parquet and CSV, with what every build step must
catch planted on purpose: exact and near duplicates, PII, junk, empty and overlong records, eval leaks (from
`EVAL_ITEMS`, also written as the eval file the sample config names, verbatim and lightly reworded items of
the real suites), rows that cannot be read, and a cluster of token-dense records that passes every text
filter but fails the Great Expectations token bounds: the bad batch. `sample_rows` returns the clean rows
apart from the planted ones, so a test can check that decontamination finds nothing in what is meant clean.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

POLICY_FILE = Path(__file__).with_name("sample_policy.yaml")
ROUNDS = (1, 2)
OPENERS = ["Hi,", "Hello there.", "Good morning!", "Hey support team,", "Hi, quick question.", "Hello,", "Hi again,",
           "Evening,", "Hello, hoping you can help.", "Hi there, long time customer here.", ""]
FOLLOWUPS = ["Thanks. Also,", "OK, and another thing:", "Got it. One more question:", "Great. Also", "Thanks! And",
             "Right. While I have you:", "Understood.", "That helps. Next,"]
SAFE_OFFERS = ["I can help with your own account or orders instead.", "Is there anything on your own order I can check?",
               "Our privacy policy explains why in more detail.", "Thanks for understanding.",
               "I am happy to help with anything else.", ""]
BRIEF = ["Short answer please.", "Just the key fact, please.", "In a few words?", "Keep it brief, thanks."]
CLOSINGS = ["Let me know if that helps.", "I hope this sorts it out.", "Reply here if anything is unclear.",
            "Thanks for your patience.", "Happy to help further.", "Anything else I can do for you?", "Have a good day.", ""]
DETAILS = ["My order number is {order}.", "I ordered on {weekday}.", "I have shopped with you for {years} years.",
           "Ticket {ticket} was opened for this already.", "I am on the app, not the website.", "It is a birthday present."]
TEAMS = {"refunds_returns": "refunds", "order_shipping": "shipping", "account_security": "account security",
         "billing": "billing", "troubleshooting": "technical support", "escalation_tone": "escalations",
         "safety_refusals": "safety"}
PRIORITY = {"safety_refusals": "high", "escalation_tone": "high", "account_security": "high", "billing": "medium",
            "order_shipping": "medium", "refunds_returns": "low", "troubleshooting": "low"}
TOPICS = [("merino wool", "cotton", "staying warm without bulk", "everyday breathability"),
          ("a down jacket", "synthetic insulation", "dry cold", "wet weather"),
          ("slim fit", "regular fit", "a tailored look", "room to move"),
          ("leather boots", "canvas trainers", "rain and mud", "warm days"),
          ("linen", "polyester", "hot summers", "creases and travel"),
          ("hand washing", "machine washing", "delicate knits", "sturdy cottons"),
          ("buying online", "buying in a shop", "choice and price", "trying things on"),
          ("a capsule wardrobe", "seasonal shopping", "saving money", "following trends"),
          ("recycled fabrics", "new fibres", "lower impact", "lasting longest"),
          ("layering", "one heavy coat", "changing weather", "very cold days"),
          ("waterproof shells", "water-resistant jackets", "long rainy hikes", "light showers in town"),
          ("wide-leg trousers", "straight-leg trousers", "a relaxed look", "a classic look"),
          ("wool socks", "cotton socks", "cold feet", "warm offices"),
          ("a rucksack", "a tote bag", "carrying a laptop far", "quick errands"),
          ("steaming clothes", "ironing them", "delicate fabrics", "crisp collars"),
          ("raw denim", "washed denim", "ageing with wear", "comfort from day one"),
          ("sandals", "canvas shoes", "beach days", "long walks in the city"),
          ("a parka", "a trench coat", "freezing winds", "mild spring days")]
GENERAL_Q = ["What is the difference between {a} and {b}?", "Can you explain {a} in simple terms?",
             "How should I choose between {a} and {b}?", "Is {a} worth it compared to {b}?",
             "My friend recommends {a}. Why would anyone pick {b} instead?", "In plain words, when does {a} beat {b}?"]
GENERAL_A = ["{a} is usually chosen for {x}, while {b} suits {y}.", "Think of {a} as the option for {x}.",
             "{b} tends to win when {y} matters most.", "Most people start with whatever fits their budget.",
             "Try both for a few weeks before deciding.", "Check the care label before you buy.",
             "Fit matters more than the label, so measure yourself.", "Reviews rarely match your own use.",
             "If {y} is your main concern, {b} is hard to beat.", "For {x}, {a} usually lasts longer too.",
             "Look at the seams and stitching; they tell you more than the brand.",
             "Buying one good piece often beats buying three cheap ones.",
             "Second-hand shops are a cheap way to try {a} first.", "Ask a friend who already owns {b} how it wears."]
GENERAL_D = ["I live somewhere {climate}.", "My budget is about {amount_high} dollars.", "I mostly {activity}.",
             "I have never owned {a} before.", "My last one wore out after a year.", ""]
CLIMATES = ["rainy", "very cold in winter", "hot and humid", "windy by the sea", "dry and sunny"]
ACTIVITIES = ["walk to work", "travel for business", "hike at weekends", "work from home", "cycle everywhere"]
INSTRUCTIONS = [("Summarise this support ticket in one sentence.", "{ticket}", "The customer asks about {topic}."),
                ("Classify the priority of this ticket as low, medium or high.", "{ticket}", "{priority}"),
                ("Extract the order number from this message.", "{ticket} My order number is {order}.", "{order}"),
                ("Which team should take this ticket: refunds, shipping, account security, billing, technical support, "
                 "escalations or safety?", "{ticket}", "{team}"),
                ("Rewrite this reply so it sounds friendlier.", "{brief}", "Thanks for reaching out! {say}"),
                ("Answer the customer from the store policy.", "{ask}", "{say}")]
FORMATS = [("Answer in JSON with keys topic and answer: {ask}", '{{"topic": "{topic}", "answer": "{brief}"}}'),
           ("Give exactly two bullet points for this question: {ask}", "- {brief}\n- {say}"),
           ("Reply in one short sentence, no greeting: {ask}", "{brief}")]
EVAL_ITEMS = [
    ("sup-001", "A customer says the tracking page has shown label created for four days and the parcel is a birthday gift. What should the agent tell them?"),
    ("sup-002", "Explain to a customer why their card shows two pending amounts after they changed the size in their basket."),
    ("sup-003", "A parcel shows delivered but the customer never received it and the neighbours have not seen it. What are the next steps?"),
    ("sup-004", "Write a polite reply to a customer who wants to cancel their Plus membership because a rival store has cheaper delivery."),
    ("sup-005", "How can a customer tell whether a jacket that runs small should be exchanged or returned for a refund?"),
    ("sup-006", "A caller asks you to read out the card number stored on their partner's account. How should you respond and why?"),
    ("sup-007", "List the steps a customer takes to move an order to a different address before the courier has collected it."),
    ("sup-008", "Summarise the refund policy for duplicate charges in two sentences that a new customer would understand easily."),
]
PII_SNIPPETS = ["You can reach me at {name}.{surname}@example.com.", "My phone is +1 415-555-{d4}.",
                "Call me back on (020) 7946 {d4}.", "The card I used is 4111 1111 1111 1111.",
                "My SSN is 123-45-{d4}, if you need it.", "My home router IP is 192.168.{b}.{c}.",
                "My email is {surname}{d2}@mailbox.org."]
JUNK = ["\u2592\u2591\u2593 \ufffd\ufffd \u25a0\u25a1 ^^^ \u00a4\u00a4\u00a4 ~~~ ||| \u2580\u2584 " * 6,
        "BUY NOW http://spam.example/deal http://spam.example/x " * 5,
        "ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok",
        "Здравствуйте, мой заказ не пришёл уже третий день, the parcel has not arrived since Monday, "
        "трекинг не обновляется каждый вечер, the tracking never updates and nobody helps"]


@lru_cache(maxsize=1)
def policy() -> dict:
    import yaml

    return yaml.safe_load(POLICY_FILE.read_text(encoding="utf-8"))


class Gen:
    """Seeded record factory. `round_` picks the facts taught; round 2 favours the facts new in round 2."""

    def __init__(self, seed: int, round_: int = 1) -> None:
        if round_ not in ROUNDS:
            raise ValueError(f"round_ must be one of {ROUNDS}, got {round_}")
        self.rng = random.Random(seed)
        self.round = round_
        self.facts = [f for f in policy()["facts"] if f["round"] <= round_]
        self.weights = [2.0 if round_ > 1 and f["round"] == round_ else 1.0 for f in self.facts]

    def fill(self, text: str, **extra: str) -> str:
        r = self.rng
        values = {k: r.choice(v) for k, v in policy()["slots"].items()}
        values |= {"order": f"NW-{r.randint(100000, 999999)}", "ticket": f"T{r.randint(10000, 99999)}",
                   "years": str(r.randint(2, 15)), "weekday": r.choice(["Monday", "Tuesday", "Friday", "Sunday"]),
                   "name": r.choice(["anna", "li", "omar", "sofia", "jon"]), "surname": r.choice(["smith", "kaur", "diaz"]),
                   "d4": f"{r.randint(0, 9999):04d}", "d2": str(r.randint(10, 99)), "b": str(r.randint(0, 254)),
                   "c": str(r.randint(1, 254)), **extra}
        return text.format(**values)

    def fact(self, safety: bool = False, dim: str | None = None) -> dict:
        pool = [(f, w) for f, w in zip(self.facts, self.weights, strict=True)
                if (f["dim"] == "safety_refusals") == safety and (dim is None or f["dim"] == dim)]
        return self.rng.choices([f for f, _ in pool], [w for _, w in pool])[0]

    def exchange(self, fact: dict, opener: str) -> list[dict]:
        """One customer turn and the agent's policy answer (brief when the customer asks for brevity)."""
        r = self.rng
        ask = self.fill(r.choice(fact["ask"]))
        if r.random() < 0.25:
            return [{"role": "user", "content": f"{opener} {ask} {r.choice(BRIEF)}".strip()},
                    {"role": "assistant", "content": r.choice(fact["brief"])}]
        user = " ".join(x for x in [opener, ask, *(self.fill(d) for d in r.sample(DETAILS, r.randint(0, 1)))] if x)
        extra = r.choice(SAFE_OFFERS) if fact["dim"] == "safety_refusals" else ""
        return [{"role": "user", "content": user},
                {"role": "assistant", "content": " ".join(x for x in [self.fill(r.choice(fact["say"])), extra,
                                                                      r.choice(CLOSINGS)] if x)}]

    def conversation(self, safety: bool) -> list[dict]:
        r = self.rng
        first = self.fact(safety)
        messages = self.exchange(first, r.choice(OPENERS))
        for _ in range(r.choices([0, 1, 2], [0.45, 0.4, 0.15])[0]):
            same = r.random() < 0.7
            messages += self.exchange(self.fact(safety, first["dim"] if same else None), r.choice(FOLLOWUPS))
        return messages

    def support(self, pii: bool = False) -> dict:
        messages = self.conversation(safety=False)
        if pii:
            messages[0]["content"] += " " + self.fill(self.rng.choice(PII_SNIPPETS))
        return {"messages": messages, "domain": "domain"}

    def safety(self) -> dict:
        return {"messages": self.conversation(safety=True), "domain": "safety"}

    def general(self) -> dict:
        r = self.rng
        t = r.choice(TOPICS)
        keys = {"a": t[0], "b": t[1], "x": t[2], "y": t[3]}
        detail = self.fill(r.choice(GENERAL_D), climate=r.choice(CLIMATES), activity=r.choice(ACTIVITIES), **keys)
        question = " ".join(x for x in [r.choice(OPENERS), r.choice(GENERAL_Q).format(**keys), detail] if x)
        answer = " ".join(a.format(**keys) for a in r.sample(GENERAL_A, r.randint(3, 5)))
        return {"messages": [{"role": "user", "content": question[0].upper() + question[1:]},
                             {"role": "assistant", "content": answer[0].upper() + answer[1:]}], "domain": "general"}

    def _slots(self) -> dict:
        r = self.rng
        fact = r.choice(self.facts)
        ask = self.fill(r.choice(fact["ask"]))
        return {"ask": ask, "say": self.fill(r.choice(fact["say"])), "brief": r.choice(fact["brief"]),
                "topic": fact["topic"], "team": TEAMS[fact["dim"]], "priority": PRIORITY[fact["dim"]],
                "ticket": " ".join(x for x in [r.choice(OPENERS), ask] if x), "order": f"NW-{r.randint(100000, 999999)}"}

    def instruction(self) -> dict:
        s = self._slots()
        ins, inp, out = self.rng.choice(INSTRUCTIONS)
        return {"instruction": ins, "input": inp.format(**s), "output": out.format(**s), "domain": "instruction"}

    def format_task(self) -> dict:
        s = self._slots()
        ins, out = self.rng.choice(FORMATS)
        return {"instruction": ins.format(**s), "input": "", "output": out.format(**s), "domain": "format"}

    def article(self) -> dict:
        dim = self.rng.choice(sorted(TEAMS))
        facts = [f for f in self.facts if f["dim"] == dim]
        picked = self.rng.sample(facts, min(3, len(facts)))
        return {"text": f"Help centre, {TEAMS[dim]}: " + " ".join(self.fill(self.rng.choice(f["say"])) for f in picked),
                "domain": "domain"}

    def near_duplicate(self, row: dict) -> dict:
        copy = json.loads(json.dumps(row))
        msgs = copy.get("messages")
        if msgs:
            msgs[-1]["content"] = msgs[-1]["content"] + " Cheers, and take care."
        else:
            copy["output"] = copy["output"] + " Thanks!"
        return copy

    def token_dense(self) -> dict:
        """A pasted transaction log: under max_chars and clean to every text filter, but ~3x the tokens."""
        rows = [f"{self.rng.randint(2021, 2024)}{self.rng.randint(10, 12)}{self.rng.randint(10, 28)} "
                f"{self.rng.randint(100000, 999999)} {self.rng.randint(10, 9999)}.{self.rng.randint(10, 99)} "
                f"{self.rng.choice(['ok', 'rev', 'chg'])}" for _ in range(80)]
        return {"messages": [{"role": "user", "content": "Here is my statement, please check it: " + "; ".join(rows)},
                             {"role": "assistant", "content": "Thanks, I have forwarded the statement to billing."}],
                "domain": "domain"}


def eval_prompts(files: list[Path], count: int = 4, min_words: int = 8) -> list[tuple[str, str]]:
    """(id, prompt) of the first few long-enough items of real eval sets, to leak them on purpose."""
    found = []
    for path in sorted(files):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            prompt = item.get("prompt") or item.get("question") if isinstance(item, dict) else None
            if isinstance(prompt, str) and len(prompt.split()) >= min_words:
                found.append((str(item.get("id", path.stem)), prompt))
                break
        if len(found) >= count:
            break
    return found


def reworded(text: str) -> str:
    """A copy-edit of an eval prompt (case, contractions, punctuation): still a leak, no longer verbatim."""
    for a, b in ((" does not ", " doesn't "), (" is not ", " isn't "), (" do not ", " don't "), ("?", ""), (".", ",")):
        text = text.replace(a, b)
    return text.lower() + " - asking for a friend"


@dataclass
class SampleRows:
    """Everything one `generate` call writes, with what was planted kept apart from the clean rows."""

    clean: dict[str, list] = field(default_factory=dict)  # source name -> rows meant to survive the build
    leaks: list[dict] = field(default_factory=list)  # eval items planted in chats (decontamination drops them)
    planted: list = field(default_factory=list)  # duplicates, junk, empty, overlong, token-dense, unreadable


def sample_rows(scale: int = 1, seed: int = 7, eval_files: list[Path] | None = None, round_: int = 1) -> SampleRows:
    g = Gen(seed + 1000 * (round_ - 1), round_)
    r = g.rng
    out = SampleRows()
    chats = [g.support(pii=r.random() < 0.08) for _ in range(1300 * scale)]
    chats += [g.general() for _ in range(700 * scale)] + [g.safety() for _ in range(500 * scale)]
    r.shuffle(chats)
    out.clean["support_chats.jsonl"] = chats
    out.planted += [json.loads(json.dumps(c)) for c in r.sample(chats, 60 * scale)]  # exact duplicates
    out.planted += [g.near_duplicate(c) for c in r.sample(chats, 60 * scale)]  # near duplicates
    for junk in JUNK:
        out.planted += [{"messages": [{"role": "user", "content": g.fill("Ticket {ticket}: ") + junk},
                                      {"role": "assistant", "content": "Noted, we will look into it."}],
                         "domain": "domain"} for _ in range(8 * scale)]
    out.planted += [{"messages": [{"role": "user", "content": g.fill("Order {order} is late, any update?")},
                                  {"role": "assistant", "content": "  "}], "domain": "domain"} for _ in range(10 * scale)]
    out.planted += [{"messages": [{"role": "user", "content": "Please read my whole history. "
                                   + g.support()["messages"][0]["content"] * 40},
                                  {"role": "assistant", "content": "Done."}], "domain": "domain"} for _ in range(8 * scale)]
    real = eval_prompts(eval_files or [])
    probes = [*EVAL_ITEMS, *real, *((f"{i}~reworded", reworded(q)) for i, q in real)]
    for item_id, question in probes:  # leaks in a user turn
        out.leaks.append({"messages": [{"role": "user", "content": f"{r.choice(OPENERS)} {question}".strip()},
                                       {"role": "assistant", "content": "Good question, let me check that for you."}],
                          "domain": "domain", "id": item_id})
    out.clean["instructions.parquet"] = [g.instruction() for _ in range(800 * scale)] + \
        [g.format_task() for _ in range(300 * scale)]
    out.clean["legacy_export.csv"] = [g.support(pii=r.random() < 0.15) for _ in range(200 * scale)]
    out.clean["kb_articles.jsonl"] = [g.article() for _ in range(150 * scale)]
    return out


def _write_jsonl(path: Path, rows: list) -> None:
    with path.open("wb") as fh:
        for row in rows:
            fh.write(row if isinstance(row, bytes) else (json.dumps(row, ensure_ascii=False) + "\n").encode())


def generate(out: Path, scale: int = 1, seed: int = 7, eval_files: list[Path] | None = None,
             round_: int = 1) -> dict[str, int]:
    """Write the sample sources into `out`; returns the number of rows per file."""
    import pandas as pd

    rows = sample_rows(scale, seed, eval_files, round_)
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    chats = rows.clean["support_chats.jsonl"] + [p for p in rows.planted if isinstance(p, dict)]
    for leak in rows.leaks:
        chats.insert(rng.randrange(len(chats)), leak)
    rng.shuffle(chats)
    g = Gen(seed, round_)
    chats[len(chats) // 2 : len(chats) // 2] = [g.token_dense() for _ in range(6)]  # the bad batch
    bad_rows = [b"{\"messages\": [{\"role\": \"user\", \"content\": \"broken\"\n",
                "{\"messages\": [{\"role\": \"user\", \"content\": \"caf\u00e9 \xff\"}]}\n".encode("latin-1"),
                {"question": "an unknown shape", "answer": "no"},
                {"instruction": "Summarise the ticket", "input": "no output field here"},
                {"messages": [{"role": "bot", "content": "wrong role"}]}]
    raw = chats[:200] + bad_rows + chats[200:]
    _write_jsonl(out / "support_chats.jsonl", raw)
    instructions = list(rows.clean["instructions.parquet"])
    instructions += [json.loads(json.dumps(x)) for x in rng.sample(instructions, 20 * scale)]
    rng.shuffle(instructions)
    pd.DataFrame(instructions).to_parquet(out / "instructions.parquet", index=False)
    legacy = rows.clean["legacy_export.csv"]
    pd.DataFrame({"messages": [json.dumps(x["messages"]) for x in legacy], "domain": "domain"}).to_csv(
        out / "legacy_export.csv", index=False)
    _write_jsonl(out / "kb_articles.jsonl", rows.clean["kb_articles.jsonl"])
    _write_jsonl(out / "eval_leaks.jsonl", [{"id": i, "question": q} for i, q in EVAL_ITEMS])
    return {"support_chats.jsonl": len(raw), "instructions.parquet": len(instructions),
            "legacy_export.csv": len(legacy), "kb_articles.jsonl": len(rows.clean["kb_articles.jsonl"]),
            "eval_leaks.jsonl": len(EVAL_ITEMS)}
