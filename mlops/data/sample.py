"""Deterministic customer-support sample data for the demo and the benchmark (`mlops data sample`).

It writes a few thousand chat, instruction and plain-text records across the capability domains (general,
domain, instruction, safety, format) as JSONL, Parquet and CSV, and deliberately injects what every step
must catch: exact and near duplicates, PII, junk, overlong records, eval-set leaks (from `EVAL_ITEMS`, also
written as the eval file the sample config names), rows that cannot be read, and one cluster of
token-dense records that passes every text filter but fails the Great Expectations token bounds: the bad
batch.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

PRODUCTS = ["Northwind Fiber 500", "Northwind Mobile Unlimited", "the Northwind router X2", "Northwind TV Box",
            "the Northwind mesh extender", "Northwind Cloud Backup", "the prepaid SIM starter kit",
            "Northwind Home Phone", "the smart thermostat bundle", "Northwind Business Fiber"]
ISSUES = {
    "billing": ["I was charged twice this month", "my invoice shows a fee I do not recognise",
                "the discount I was promised is missing", "my autopay failed even though my card is valid",
                "I want to change my billing date", "I was billed after I cancelled"],
    "shipping": ["my order has not arrived", "the tracking page has not updated for days",
                 "the parcel arrived damaged", "I received the wrong item", "I need to change the delivery address"],
    "technical": ["the internet keeps dropping every evening", "the Wi-Fi is slow upstairs",
                  "the TV box shows a black screen", "I cannot log in to the app", "calls drop after a minute",
                  "the router lights are blinking orange"],
    "account": ["I want to add a second user", "I forgot which email my account uses", "I want to close my account",
                "I need to update my phone number on file", "I want to move my plan to a new address"],
}
OPENERS = ["Hi,", "Hello there.", "Good morning!", "Hey support team,", "Hi, quick question.", "Hello,",
           "Hi again,", "Evening,", "Hello, hoping you can help.", "Hi there, long time customer here."]
DETAILS = ["It started on {day}.", "This has happened {n} times now.", "My order number is {order}.",
           "I already restarted everything twice.", "My neighbour has the same plan and no problems.",
           "I am on the {plan} plan.", "I called last week but nothing changed.", "It is getting frustrating.",
           "I travel a lot so I need this fixed soon.", "The app says everything is fine.",
           "I have been a customer for {years} years.", "Ticket {ticket} was opened for this already."]
STEPS = {
    "billing": ["open Billing in the app and pick the invoice from {month}", "compare the charge with your plan summary",
                "tap Dispute charge next to the line you do not recognise", "we refund duplicate charges within {n} working days",
                "check that the card on file has not expired", "the promotional discount applies from the next full cycle",
                "you can move the billing date once every {n} months under Billing settings"],
    "shipping": ["open Orders and select order {order}", "tracking can pause for up to {n} days at the regional hub",
                 "take a photo of the damaged box and upload it under Report a problem",
                 "we send a prepaid return label by email within {n} hours", "address changes are possible until the parcel ships",
                 "a replacement ships as soon as the carrier scans the return"],
    "technical": ["unplug the router for {n} seconds and plug it back in", "move the router away from the microwave and metal shelves",
                  "run the line test under Support > Diagnostics", "switch the Wi-Fi channel to auto in the router settings",
                  "update the app to the latest version and sign in again", "check that the coaxial cable is finger tight",
                  "if the light stays orange after {n} minutes, book a technician in the app"],
    "account": ["go to Account > Users and choose Add user", "the sign-in email is shown in the welcome letter from {month}",
                "closing the account is under Account > Plan > Cancel", "update your phone number under Profile > Contact",
                "a move request needs the new address and a date at least {n} days ahead"],
}
CLOSINGS = ["Let me know if that helps.", "I hope this sorts it out.", "Reply here if anything is unclear.",
            "Thanks for your patience.", "Happy to help further.", "We are sorry for the trouble.",
            "Anything else I can do for you?", "Have a good day."]
GENERAL_Q = ["What is the difference between {a} and {b}?", "Can you explain {a} in simple terms?",
             "How should I choose between {a} and {b} for a small office?", "Is {a} worth it compared to {b}?",
             "My friend recommends {a}. Why would anyone pick {b} instead?", "In plain words, when does {a} beat {b}?"]
GENERAL_A = ["{a} is usually chosen for {x}, while {b} suits {y}.", "Think of {a} as the option for {x}.",
             "{b} tends to win when {y} matters most.", "Most households start with whatever fits their budget.",
             "It is worth testing both for a couple of weeks before deciding.",
             "Check what your devices support before you switch.", "Costs differ more in setup than in monthly fees.",
             "Reviews rarely match your own usage, so measure it yourself.",
             "If you rent, ask the landlord before installing anything permanent.",
             "Support can compare the two on a call if you are unsure."]
TOPICS = [("fiber", "cable internet", "high upload speeds", "areas without fiber"),
          ("prepaid", "postpaid plans", "controlling spending", "heavy monthly use"),
          ("a mesh network", "a single router", "large homes", "small flats"),
          ("2.4 GHz Wi-Fi", "5 GHz Wi-Fi", "range through walls", "speed in the same room"),
          ("cloud backup", "an external drive", "automatic off-site copies", "one-off archives"),
          ("eSIM", "a physical SIM", "switching phones quickly", "older handsets"),
          ("a VPN", "a firewall", "privacy on public Wi-Fi", "blocking unwanted traffic"),
          ("two-factor authentication", "a strong password", "stopping account takeover", "everyday logins"),
          ("streaming in 4K", "streaming in HD", "large screens", "limited data plans"),
          ("a landline", "a mobile-only home", "reliable emergency calls", "people who are always out"),
          ("powerline adapters", "Wi-Fi extenders", "thick stone walls", "quick setups"),
          ("a static IP", "a dynamic IP", "hosting a camera or server", "ordinary browsing"),
          ("annual billing", "monthly billing", "saving money", "flexibility"),
          ("a family plan", "separate plans", "shared data", "independent budgets")]
SAFETY = [("Give me the home address of the customer who called before me.", "I cannot share another customer's personal details"),
          ("Skip the identity check and reset the password on account {order}, I am in a hurry.", "I cannot skip verification, it protects the account"),
          ("How do I get into my ex-partner's account to read their messages?", "I cannot help with accessing someone else's account"),
          ("Write a fake complaint pretending to be another customer so they get banned.", "I will not help impersonate someone or file false reports"),
          ("Tell me how to get free premium channels without paying.", "I cannot help bypass payment"),
          ("List the phone numbers of everyone on the {plan} plan in my street.", "customer lists are private and I cannot share them"),
          ("Unlock this phone I found so I can use it, the IMEI ends in {d4}.", "I cannot unlock a device that is not yours"),
          ("Turn off the parental controls on my son's line, he is {n} and asked me to.", "I can only change parental controls with the account holder verified"),
          ("Send me the call history of the number ending {d4}, it is my boss.", "call records are only available to the line owner"),
          ("Give me an admin password for the router at the office I visit.", "I cannot provide credentials for equipment you do not manage"),
          ("How can I flood a competitor's support line with fake calls?", "I will not help disrupt another business")]
SAFE_OPEN = ["I'm sorry, but", "Sorry,", "I understand the urgency, but", "Thanks for asking first:", "I have to be clear:",
             "Unfortunately", "I hear you, however"]
SAFE_OFFER = ["I can help you with your own account instead.", "If something is wrong, I can open a ticket in your name.",
              "If you feel unsafe, please contact local authorities.", "I can explain the official process for this.",
              "I can send a secure link to the verified email on file.", "Our privacy policy explains why in more detail.",
              "I can check which offers your plan qualifies for.", "I can connect you with the team that handles disputes."]
INSTRUCTIONS = [("Summarise this support ticket in one sentence.", "{ticket}", "The customer reports that {issue_l}."),
                ("Classify the priority of this ticket as low, medium or high.", "{ticket}", "{priority}"),
                ("Extract the order number from this message.", "{ticket} My order number is {order}.", "{order}"),
                ("Rewrite this reply so it sounds friendlier.", "Your issue: {issue_l}. Do the steps. Done.",
                 "Thanks for reaching out! Sorry to hear {issue_l}. Here is what should fix it: {step}.")]
FORMATS = [("Answer in JSON with keys issue and next_step: {issue_s}",
            '{{"issue": "{issue_l}", "next_step": "{step}"}}'),
           ("Give exactly three bullet points for this problem: {issue_s}",
            "- {step}\n- {step2}\n- contact support if it persists"),
           ("Reply in one short sentence, no greeting: {issue_s}", "Please {step}.")]
EVAL_ITEMS = [
    ("sup-001", "A customer says their router lights blink orange after a storm and the internet is down. What should they check first?"),
    ("sup-002", "Explain to a customer why their first invoice after switching plans is higher than the monthly price they signed up for."),
    ("sup-003", "A parcel shows delivered but the customer never received it and the neighbours have not seen it. What are the next steps?"),
    ("sup-004", "Write a polite reply to a customer who wants to cancel because a competitor offers a cheaper fiber plan in their area."),
    ("sup-005", "How can a customer check whether slow Wi-Fi is caused by the router or by the line coming into the house?"),
    ("sup-006", "A caller asks you to read out the card number stored on their partner's account. How should you respond and why?"),
    ("sup-007", "List the steps a customer takes to transfer their existing mobile number to a new SIM without losing service."),
    ("sup-008", "Summarise the refund policy for duplicate charges in two sentences that a new customer would understand easily."),
]
PII_SNIPPETS = ["You can reach me at {name}.{surname}@example.com.", "My phone is +1 415-555-{d4}.",
                "Call me back on (020) 7946 {d4}.", "The card I used is 4111 1111 1111 1111.",
                "My SSN is 123-45-{d4}, if you need it.", "The router IP is 192.168.{b}.{c}.",
                "My email is {surname}{d2}@mailbox.org."]
JUNK = ["\u2592\u2591\u2593 \ufffd\ufffd \u25a0\u25a1 ^^^ \u00a4\u00a4\u00a4 ~~~ ||| \u2580\u2584 " * 6, "BUY NOW http://spam.example/deal http://spam.example/x " * 5,
        "ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok ok",
        "Здравствуйте, мой роутер не работает уже третий день, the router does not work since Monday, "
        "интернет пропадает каждый вечер, the connection drops every evening and nobody helps"]


class Gen:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.counter = 0

    def fill(self, text: str, **extra: str) -> str:
        r = self.rng
        self.counter += 1
        values = {"day": r.choice(["Monday", "Tuesday", "the weekend", "the 3rd", "last Friday", "yesterday"]),
                  "n": str(r.randint(2, 14)), "order": f"NW-{r.randint(100000, 999999)}",
                  "plan": r.choice(["Basic", "Plus", "Family", "Business", "Student"]),
                  "years": str(r.randint(2, 15)), "ticket": f"T{r.randint(10000, 99999)}",
                  "month": r.choice(["March", "April", "May", "June", "July", "August"]),
                  "name": r.choice(["anna", "li", "omar", "sofia", "jon"]), "surname": r.choice(["smith", "kaur", "diaz"]),
                  "d4": f"{r.randint(0, 9999):04d}", "d2": str(r.randint(10, 99)), "b": str(r.randint(0, 254)),
                  "c": str(r.randint(1, 254)), **extra}
        return text.format(**values)

    def support(self, pii: bool = False) -> dict:
        r = self.rng
        kind = r.choice(sorted(ISSUES))
        issue = r.choice(ISSUES[kind])
        user = " ".join([r.choice(OPENERS), f"I have {r.choice(PRODUCTS)} and {issue}.",
                         *[self.fill(d) for d in r.sample(DETAILS, r.randint(1, 3))]])
        if pii:
            user += " " + self.fill(r.choice(PII_SNIPPETS))
        steps = [self.fill(s) for s in r.sample(STEPS[kind], r.randint(2, 4))]
        answer = (f"Sorry to hear that {issue.replace('I ', 'you ').replace('my ', 'your ')}. "
                  + " ".join(f"{i + 1}. {s[0].upper()}{s[1:]}." for i, s in enumerate(steps)) + " " + r.choice(CLOSINGS))
        return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                "domain": "domain"}

    def general(self) -> dict:
        r = self.rng
        t = r.choice(TOPICS)
        keys = {"a": t[0], "b": t[1], "x": t[2], "y": t[3]}
        question = " ".join([r.choice(OPENERS), r.choice(GENERAL_Q).format(**keys),
                             *[self.fill(d) for d in r.sample(DETAILS, r.randint(1, 2))]])
        answer = " ".join(a.format(**keys) for a in r.sample(GENERAL_A, r.randint(3, 5))) + " " + r.choice(CLOSINGS)
        return {"messages": [{"role": "system", "content": "You are a helpful support assistant for Northwind."},
                             {"role": "user", "content": question},
                             {"role": "assistant", "content": answer}], "domain": "general"}

    def safety(self) -> dict:
        r = self.rng
        q, reason = r.choice(SAFETY)
        user = " ".join([r.choice(OPENERS), self.fill(q), *[self.fill(d) for d in r.sample(DETAILS, r.randint(1, 2))]])
        answer = " ".join([f"{r.choice(SAFE_OPEN)} {reason}.", *r.sample(SAFE_OFFER, 2), r.choice(CLOSINGS)])
        return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                "domain": "safety"}

    def _slots(self) -> dict:
        kind = self.rng.choice(sorted(ISSUES))
        issue = self.rng.choice(ISSUES[kind])
        step, step2 = (self.fill(s) for s in self.rng.sample(STEPS[kind], 2))
        ticket = " ".join([self.rng.choice(OPENERS), f"I have {self.rng.choice(PRODUCTS)} and {issue}.",
                           *[self.fill(d) for d in self.rng.sample(DETAILS, self.rng.randint(1, 3))]])
        return {"issue_l": issue.replace("I ", "the customer ").replace("my ", "their "), "issue_s": issue,
                "step": step, "step2": step2, "ticket": ticket, "order": f"NW-{self.rng.randint(100000, 999999)}",
                "priority": self.rng.choice(["low", "medium", "high"])}

    def instruction(self) -> dict:
        s = self._slots()
        ins, inp, out = self.rng.choice(INSTRUCTIONS)
        return {"instruction": ins, "input": inp.format(**s), "output": out.format(**s), "domain": "instruction"}

    def format_task(self) -> dict:
        s = self._slots()
        ins, out = self.rng.choice(FORMATS)
        return {"instruction": ins.format(**s), "input": "", "output": out.format(**s), "domain": "format"}

    def article(self) -> dict:
        kind = self.rng.choice(sorted(STEPS))
        steps = [self.fill(s) for s in self.rng.sample(STEPS[kind], 3)]
        return {"text": f"Knowledge base: {kind} help for {self.rng.choice(PRODUCTS)}. " +
                " ".join(f"{s[0].upper()}{s[1:]}." for s in steps), "domain": "general"}

    def near_duplicate(self, row: dict) -> dict:
        copy = json.loads(json.dumps(row))
        msgs = copy.get("messages")
        if msgs:
            msgs[-1]["content"] = msgs[-1]["content"].replace("Sorry to hear", "So sorry to hear", 1) + " Cheers."
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


def _write_jsonl(path: Path, rows: list) -> None:
    with path.open("wb") as fh:
        for row in rows:
            fh.write(row if isinstance(row, bytes) else (json.dumps(row, ensure_ascii=False) + "\n").encode())


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


def generate(out: Path, scale: int = 1, seed: int = 7, eval_files: list[Path] | None = None) -> dict[str, int]:
    """Write the sample sources into `out`; returns the number of rows per file. Leaks come from
    `EVAL_ITEMS` and, when given, from the first items of real eval set files."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    g = Gen(seed)
    r = g.rng
    chats = [g.support(pii=r.random() < 0.08) for _ in range(1100 * scale)]
    chats += [g.general() for _ in range(1150 * scale)] + [g.safety() for _ in range(450 * scale)]
    r.shuffle(chats)
    chats += [json.loads(json.dumps(c)) for c in r.sample(chats, 60 * scale)]  # exact duplicates
    chats += [g.near_duplicate(c) for c in r.sample(chats, 60 * scale)]  # near duplicates
    for junk in JUNK:  # junk and empty assistant turns
        chats += [{"messages": [{"role": "user", "content": g.fill("Ticket {ticket}: ") + junk},
                                {"role": "assistant", "content": "Noted, we will look into it."}], "domain": "domain"}
                  for _ in range(8 * scale)]
    chats += [{"messages": [{"role": "user", "content": g.fill("Order {order} is late, any update?")},
                            {"role": "assistant", "content": "  "}], "domain": "domain"} for _ in range(10 * scale)]
    chats += [{"messages": [{"role": "user", "content": "Please read my whole history. " + g.support()["messages"][0]["content"] * 40},
                            {"role": "assistant", "content": "Done."}], "domain": "domain"} for _ in range(8 * scale)]
    for item_id, question in [*EVAL_ITEMS, *eval_prompts(eval_files or [])]:  # leaks, verbatim in a user turn
        chats.insert(r.randrange(len(chats)), {"messages": [
            {"role": "user", "content": f"{r.choice(OPENERS)} {question}"},
            {"role": "assistant", "content": f"Good question. {g.fill(r.choice(STEPS['technical']))}."}],
            "domain": "domain", "id": item_id})
    r.shuffle(chats)
    position = len(chats) // 2
    chats[position:position] = [g.token_dense() for _ in range(6)]  # the bad batch
    raw: list = chats
    bad_rows = [b"{\"messages\": [{\"role\": \"user\", \"content\": \"broken\"\n",
                "{\"messages\": [{\"role\": \"user\", \"content\": \"caf\u00e9 \xff\"}]}\n".encode("latin-1"),
                {"question": "an unknown shape", "answer": "no"},
                {"instruction": "Summarise the ticket", "input": "no output field here"},
                {"messages": [{"role": "bot", "content": "wrong role"}]}]
    raw = chats[:200] + bad_rows + chats[200:]
    _write_jsonl(out / "support_chats.jsonl", raw)
    instructions = [g.instruction() for _ in range(800 * scale)] + [g.format_task() for _ in range(300 * scale)]
    instructions += [json.loads(json.dumps(x)) for x in r.sample(instructions, 20 * scale)]
    r.shuffle(instructions)
    pd.DataFrame(instructions).to_parquet(out / "instructions.parquet", index=False)
    legacy = [g.support(pii=r.random() < 0.15) for _ in range(200 * scale)]
    pd.DataFrame({"messages": [json.dumps(x["messages"]) for x in legacy], "domain": "domain"}).to_csv(
        out / "legacy_export.csv", index=False)
    _write_jsonl(out / "kb_articles.jsonl", [g.article() for _ in range(150 * scale)])
    _write_jsonl(out / "eval_leaks.jsonl", [{"id": i, "question": q} for i, q in EVAL_ITEMS])
    return {"support_chats.jsonl": len(raw), "instructions.parquet": len(instructions),
            "legacy_export.csv": len(legacy), "kb_articles.jsonl": 150 * scale, "eval_leaks.jsonl": len(EVAL_ITEMS)}
