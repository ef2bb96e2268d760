"""A labelled paraphrase set for semantic dedup: support-log questions asked many ways.

Each intent ("how do I reset my password") has several phrasings that a customer might type (synonyms,
reordering, a statement instead of a question) and a few canned answers an agent might paste. A case is one chat:
a phrasing, wrapped in a politeness prefix and a sign-off, and one of the intent's answers. Cases of one intent are
paraphrases of each other (duplicates to drop); cases of different intents are not, and many intents come in
look-alike pairs that share most of their words (upgrade / downgrade, cancel / pause, add / remove a user) as hard
negatives. Word shingles barely overlap between paraphrases, so MinHash at 0.7 keeps nearly all of them.

`paraphrase_cases(groups, per_group, seed)` is deterministic. `score(groups, decisions)` gives precision and recall
of the drops: a drop is right when it names a record of its own intent; recall counts every record but one per
intent as a drop to make.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PREFIXES = ["", "Hi, ", "Hello! ", "Hey there, ", "Sorry to bother you, but ", "Quick question: ",
            "Good morning, ", "Could you help me? ", "Hi team, ", "Excuse me, "]
SUFFIXES = ["", " Thanks!", " Thank you in advance.", " Cheers.", " Many thanks.", " Appreciate it."]
ANSWER_OPENERS = ["", "Sure! ", "Happy to help. ", "Of course. ", "No problem. "]

# (phrasings, canned answers) per intent; neighbours in this list are often look-alikes of each other.
INTENTS: list[tuple[list[str], list[str]]] = [
    (["How do I reset my password?", "How can I reset my password?", "What is the way to reset my password?",
      "I forgot my password, how do I reset it?", "Where do I go to reset the password on my account?",
      "Can you tell me how to reset my account password?", "My password needs a reset, how do I do that?",
      "How do I get a new password, I cannot remember mine?"],
     ["Open the sign-in page, choose Forgot password and follow the link we email you.",
      "Click Forgot password on the login screen; a reset link arrives by email within minutes."]),
    (["How do I change the email address on my account?", "Can I update the email linked to my account?",
      "I want to use a different email for my account, how?", "Where can I edit my account email?",
      "How can I switch my login email to a new one?", "What are the steps to change my account's email?",
      "My email address changed, how do I update it here?", "Is it possible to replace the email on my profile?"],
     ["Go to Profile, then Contact details, enter the new address and confirm the code we send to it.",
      "Under Profile > Contact details you can type a new email; confirm it with the code we send."]),
    (["How do I upgrade my plan?", "Can I move to a bigger plan?", "I would like to upgrade my subscription.",
      "What do I do to switch to a higher plan?", "How can I upgrade to the premium plan?",
      "Is there a way to get more data by upgrading my plan?", "I want a larger plan, how do I upgrade?",
      "Where can I upgrade my current plan?"],
     ["Open Plans in the app, pick the larger plan and confirm; it starts right away and the bill is prorated.",
      "In the app go to Plans, choose the new plan and press Confirm: the upgrade is immediate, billed pro rata."]),
    (["How do I downgrade my plan?", "Can I move to a smaller plan?", "I would like to downgrade my subscription.",
      "What do I do to switch to a cheaper plan?", "How can I go down to the basic plan?",
      "Is there a way to pay less by downgrading my plan?", "I want a smaller plan, how do I downgrade?",
      "Where can I downgrade my current plan?"],
     ["Pick the smaller plan under Plans; the downgrade starts at your next billing date.",
      "You can choose a cheaper plan in Plans, and it takes effect from the next bill."]),
    (["How do I cancel my subscription?", "I want to cancel my contract, how?", "Can you cancel my subscription?",
      "What are the steps to end my subscription?", "How can I terminate my plan for good?",
      "I would like to stop my subscription permanently.", "Where do I cancel my account subscription?",
      "Please tell me how to cancel the service."],
     ["Go to Account, choose Cancel subscription and confirm; service runs until the end of the paid period.",
      "Cancel under Account > Subscription. You keep access until the period you paid for ends."]),
    (["Can I pause my subscription for a month?", "How do I put my subscription on hold?",
      "Is it possible to freeze my plan while I travel?", "I want to suspend my service temporarily.",
      "How can I pause the plan for a few weeks?", "Can my subscription be paused while I am abroad?",
      "What do I do to temporarily stop my plan and resume later?", "Is there a way to pause billing for a while?"],
     ["Under Account > Subscription choose Pause; you can pause for up to three months and resume any time.",
      "Pick Pause in the subscription settings, for up to 90 days; nothing is billed while paused."]),
    (["Where is my order?", "How can I track my order?", "My package has not arrived yet, where is it?",
      "Can you tell me the status of my delivery?", "How do I see where my parcel is?",
      "When will my order be delivered?", "I am still waiting for my order, can you check it?",
      "Is there a tracking link for my shipment?"],
     ["Open Orders in your account and tap Track: the carrier's live status and delivery date are there.",
      "Your order's tracking page is under Orders > Track; it shows the carrier and the expected day."]),
    (["How do I return an item?", "I want to send back something I bought.", "What is the return process?",
      "Can I return my order for a refund?", "How can I send a product back?",
      "Where do I start a return for my purchase?", "The item does not fit, how do I return it?",
      "What do I need to do to return a product?"],
     ["Start a return under Orders > Return item, print the label and drop the parcel at any post office.",
      "Choose Return item on the order, print the free label and hand the parcel in at a post office."]),
    (["Why was I charged twice?", "I see two payments for the same bill.", "There is a double charge on my card.",
      "My card was billed twice this month, why?", "Why do I have a duplicate charge?",
      "You took the payment two times, can you fix it?", "I was billed twice for one invoice.",
      "Can you explain why there are two identical charges?"],
     ["A duplicate charge is usually a pending authorisation that drops off in three days; if not, we refund it.",
      "The second charge is most likely a hold that disappears within three working days, otherwise we refund."]),
    (["How do I update my payment card?", "Can I change the card you charge?", "I have a new credit card, how do "
      "I add it?", "Where can I replace my payment method?", "How can I switch the card used for my bills?",
      "My card expired, how do I put in the new one?", "What are the steps to change my billing card?",
      "Can I use a different card for payments from now on?"],
     ["Go to Billing > Payment method, add the new card and set it as default.",
      "Add the new card under Billing > Payment method and mark it as the default one."]),
    (["How do I add a user to my account?", "Can I give my colleague access to our account?",
      "I want to invite a new team member.", "How can I add another person to the account?",
      "Where do I create a login for a new employee?", "What do I do to add a second user?",
      "Can someone else get access to my account, how?", "How do I invite a coworker to the account?"],
     ["Under Team, choose Invite user and enter their email; they get a link to set a password.",
      "Invite them from the Team page with their email address; the link lets them create a password."]),
    (["How do I remove a user from my account?", "Can I take away a colleague's access?",
      "I want to delete a team member's login.", "How can I remove someone from the account?",
      "Where do I revoke access for an employee who left?", "What do I do to remove a second user?",
      "Can I stop someone else from using my account, how?", "How do I delete a coworker from the account?"],
     ["On the Team page open the user, choose Remove and confirm; their sessions end at once.",
      "Open the person on the Team page and press Remove: access stops immediately."]),
    (["My internet keeps dropping, what can I do?", "The connection cuts out all the time.",
      "Why does my Wi-Fi keep disconnecting?", "My broadband drops every few minutes, help.",
      "The internet goes off and on all day, can you fix it?", "How do I stop my connection from dropping?",
      "My router loses the connection again and again.", "What should I do if my internet disconnects often?"],
     ["Restart the router, move it away from other electronics and run the line test in the app.",
      "Please power-cycle the router, keep it clear of other devices and run the app's line test."]),
    (["How do I set up voicemail?", "Can you help me turn on voicemail?", "Where do I activate my voicemail?",
      "I want to record a voicemail greeting, how?", "How can I enable the voicemail on my phone?",
      "What are the steps to configure voicemail?", "My voicemail is not set up, how do I do it?",
      "Is there a way to switch on voicemail for my number?"],
     ["Call 123 from your phone and follow the prompts to set a PIN and record your greeting.",
      "Dial 123 and the menu walks you through the PIN and the greeting."]),
    (["Can I keep my number if I switch to you?", "How do I transfer my phone number to your network?",
      "I want to bring my old number with me.", "Is it possible to port my number?",
      "What do I need to move my existing number over?", "Can my current number come with me when I join?",
      "How does number porting work with you?", "I am switching providers, can I keep my mobile number?"],
     ["Yes: get the PAC code from your old provider and enter it when you order; the move takes one working day.",
      "Ask your current provider for a PAC code and add it to your order; your number moves in a day."]),
    (["How do I turn on roaming?", "Will my phone work abroad?", "I am travelling next week, how do I enable "
      "roaming?", "Can I use my plan in another country?", "How can I activate international roaming?",
      "What do I do to get my phone working overseas?", "Is roaming included, and how do I switch it on?",
      "Where do I enable data roaming for my trip?"],
     ["Roaming is in Settings > Roaming in the app; switch it on before you leave and check the daily rate.",
      "Turn on roaming in the app under Settings > Roaming before you travel; the daily price is shown there."]),
]


@dataclass
class Case:
    record: dict[str, Any]
    group: int  # the intent: records of one group are paraphrases of each other

    @property
    def text(self) -> str:
        return "\n".join(m["content"] for m in self.record["messages"])


def _chat(user: str, assistant: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
            "domain": "support"}


def paraphrase_cases(groups: int | None = None, per_group: int = 6, seed: int = 1) -> list[Case]:
    """`per_group` distinct paraphrases of each of the first `groups` intents (all by default), shuffled."""
    r = random.Random(seed)
    cases: list[Case] = []
    for group, (phrasings, answers) in enumerate(INTENTS[: groups or len(INTENTS)]):
        seen: set[tuple] = set()
        while len(seen) < per_group:
            pick = (r.choice(phrasings), r.choice(PREFIXES), r.choice(SUFFIXES), r.choice(answers),
                    r.choice(ANSWER_OPENERS))
            if pick in seen:
                continue
            seen.add(pick)
            phrase, prefix, suffix, answer, opener = pick
            mid_sentence = prefix.endswith(", ") and not phrase.startswith(("I ", "I'"))
            question = prefix + (phrase[0].lower() + phrase[1:] if mid_sentence else phrase)
            cases.append(Case(_chat(question + suffix, opener + answer), group))
    r.shuffle(cases)
    return cases


def flood(question: int = 0, copies: int = 30, seed: int = 2) -> list[Case]:
    """One intent asked `copies` times in different words (a paraphrase flood), beside one case of every other."""
    r = random.Random(seed)
    flooded = [c for c in paraphrase_cases(per_group=copies, seed=seed) if c.group == question]
    others = [c for c in paraphrase_cases(per_group=1, seed=seed) if c.group != question]
    cases = flooded + others
    r.shuffle(cases)
    return cases


def score(groups: Sequence[int], decisions: Sequence[Any]) -> dict[str, float]:
    """Precision and recall of drops ({kept, duplicate_of} per record, in the cases' order) against the groups."""
    drops = [d for d in decisions if not d.kept]
    right = sum(groups[d.index] == groups[d.duplicate_of] for d in drops)
    expected = len(groups) - len(set(groups))
    return {"records": len(groups), "groups": len(set(groups)), "drops": len(drops), "right": right,
            "precision": right / len(drops) if drops else 1.0, "recall": right / expected if expected else 1.0}
