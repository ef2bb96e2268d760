"""The demo's production server and its users: `mlops serve --follow --shadow @candidate` in the background,
customers asking questions (some rating an answer down with an agent's correction), and a scripted stand-in for
the approver's spot-check review. Everything it learns it reads from HTTP headers, /metrics and the request log."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

TRAFFIC = Path("data/generated-round2/support_chats.jsonl")  # customers' questions with an agent's answer


class DemoServer:
    def __init__(self, model: str, *, log: Path, shadow_share: float = 1.0) -> None:
        self.model, self.log, self.shadow_share = model, log, shadow_share
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.answered = 0

    def __enter__(self) -> DemoServer:
        from mlops.files import free_port

        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = ["mlops", "serve", "--model", f"models:/{self.model}@production", "--follow", "--poll-interval", "1",
               "--shadow", f"models:/{self.model}@candidate", "--shadow-share", str(self.shadow_share),
               "--name", self.model, "--no-auth", "--port", str(port)]
        print("$ " + " ".join(cmd) + f"   (log: {self.log})", flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("a"), stderr=subprocess.STDOUT)
        self._until(lambda: self._get("/ready") is not None, 300, "the server to be ready")
        print(f"serving models:/{self.model}@production at {self.url}/v1, version {self.serving_version()}")
        return self

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # drains running requests, exits 0
            code = self.proc.wait(timeout=120)
            print(f"server stopped (exit {code}) after answering {self.answered} demo requests")

    # ------------------------------------------------------------------ traffic

    def ask(self, messages: list[dict], max_tokens: int) -> tuple[str, str, str]:
        """(request id, version that answered, answer) for one chat request."""
        body = json.dumps({"model": self.model, "messages": messages, "max_tokens": max_tokens}).encode()
        req = urllib.request.Request(f"{self.url}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as resp:
            answer = json.load(resp)["choices"][0]["message"]["content"]
            self.answered += 1
            return resp.headers["X-Request-ID"], resp.headers["X-Model-Version"], answer

    def send(self, prompts: list[dict], *, max_tokens: int, feedback: bool = False) -> list[str]:
        """Ask each prompt; with `feedback`, every third answer gets a thumbs-down and the agent's answer as its
        correction (what a support agent fixing the bot's reply would send)."""
        ids = []
        for n, item in enumerate(prompts):
            request_id, version, answer = self.ask(item["messages"], max_tokens)
            ids.append(request_id)
            print(f"  v{version} answered {request_id}: {answer[:70]!r}")
            if feedback and n % 3 == 0:
                self.feedback(request_id, -1, item["correction"])
        return ids

    def feedback(self, request_id: str, rating: int, correction: str | None) -> None:
        body = json.dumps({"request_id": request_id, "rating": rating, "correction": correction}).encode()
        req = urllib.request.Request(f"{self.url}/v1/feedback", data=body, headers={"Content-Type":
                                                                                       "application/json"})

        def sent() -> bool:  # 404: the answer's trace is not known yet; 503: the store is busy. Both pass.
            try:
                with urllib.request.urlopen(req, timeout=30):
                    return True
            except urllib.error.HTTPError as err:
                if err.code not in (404, 503):
                    raise
                return False
        self._until(sent, 60, f"feedback on {request_id} to be taken")
        print(f"  feedback on {request_id}: thumbs down, with a correction")

    def served_before(self) -> bool:
        from mlops.requestlog import read_requests

        return any(r["status"] == 200 for r in read_requests(model=self.model, role="user"))

    # ------------------------------------------------------------------ waiting on the registry

    def serving_version(self) -> str | None:
        text = self._get("/metrics") or ""
        found = re.search(r'mlops_serve_model_info\{[^}]*version="([^"]+)"[^}]*\} 1\.0', text)
        return found.group(1) if found else None

    def wait_for_version(self, version: str, *, max_tokens: int) -> None:
        """Until users get `version`: the follower polls the ledger each second and swaps the model in."""
        start = time.monotonic()
        self._until(lambda: self.serving_version() == version, 300, f"the server to serve v{version}")
        request_id, answered_by, _ = self.ask([{"role": "user", "content": "Hi, are you there?"}], max_tokens)
        print(f"the server switched to v{version} in {time.monotonic() - start:.1f} s; {request_id} was answered "
              f"by v{answered_by}")

    def wait_for_shadow(self, version: str) -> None:
        """Until the shadow slot holds `version` (its follower loads the newest candidate)."""
        def loaded() -> bool:
            self.ask([{"role": "user", "content": "Hello"}], 4)
            return _shadow_rows(self.model, version) > 0
        self._until(loaded, 300, f"the shadow to load v{version}", pause=3)

    def wait_for_shadow_rows(self, version: str, count: int) -> None:
        self._until(lambda: _shadow_rows(self.model, version) >= count, 600,
                    f"{count} shadow answers of v{version} in the request log", pause=2)
        print(f"v{version} answered {_shadow_rows(self.model, version)} shadowed requests in the background")

    # ------------------------------------------------------------------ helpers

    def _get(self, path: str) -> str | None:
        if self.proc and self.proc.poll() is not None:
            raise SystemExit(f"demo stopped: the server exited {self.proc.returncode}; see {self.log}")
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None

    def _until(self, ready, timeout: float, what: str, pause: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise SystemExit(f"demo stopped: waited {timeout:.0f} s for {what}; see {self.log}")
            time.sleep(pause)


def _shadow_rows(model: str, version: str) -> int:
    from mlops.requestlog import read_requests

    return len(read_requests(model=model, version=version, role="shadow"))


def traffic_prompts(n: int, offset: int = 0) -> list[dict]:
    """Customers' first questions from the round-2 sample, each with the agent's answer as a correction."""
    out = []
    for line in TRAFFIC.read_bytes().splitlines():  # the sample plants broken rows; customers skip them
        try:
            messages = json.loads(line.decode("utf-8")).get("messages") or []
        except (UnicodeDecodeError, ValueError, AttributeError):
            continue
        if isinstance(messages, list) and len(messages) >= 2 and all(isinstance(m, dict) for m in messages[:2]) \
                and messages[0].get("role") == "user" and messages[1].get("role") == "assistant" \
                and isinstance(messages[0].get("content"), str) and isinstance(messages[1].get("content"), str):
            out.append({"messages": messages[:1], "correction": messages[1]["content"]})
    return out[offset:offset + n]


# --------------------------------------------------------------------------- the approver's review, scripted


# Words that carry no fact: an answer sharing only these with the reference shares nothing with it.
STOPWORDS = set("a an the and or but if of to in on at by for with from as is are was were be been it its this that "
                "these those you your we our i me my he she they them their his her do does did can could will would "
                "should may might not no yes so than then there here what which who how when where why all any".split())


def _words(text: str | None) -> list[str]:
    return [w for w in re.findall(r"[a-z0-9]+", (text or "").lower()) if w not in STOPWORDS]


def overlap(answer: str | None, reference: str | None) -> float:
    """Token F1 of an answer against the reference over content words (SQuAD's definition, stopwords removed)."""
    a, r = _words(answer), _words(reference)
    common = sum(min(a.count(w), r.count(w)) for w in set(a))
    if not a or not r or not common:
        return 0.0
    precision, recall = common / len(a), common / len(r)
    return 2 * precision * recall / (precision + recall)


def review(item: dict) -> dict:
    """A stand-in for grace reading one blind item (a person does this in the app's Spot-check page): the answer
    clearly closer to the reference (token F1 ahead by more than 0.15) is better, otherwise `same`; without a
    champion, an answer is acceptable unless it is empty or shares nothing with the reference. Served requests
    have no reference: `same`."""
    a, b, ref = item.get("answer_a"), item.get("answer_b"), item.get("reference")
    if "acceptable" in item["choices"]:
        ok = bool((a or "").strip()) and (not ref or overlap(a, ref) > 0)
        verdict = "acceptable" if ok else "unacceptable"
    else:
        gap = overlap(a, ref) - overlap(b, ref) if ref else 0.0
        verdict = "A" if gap > 0.15 else "B" if gap < -0.15 else "same"
    note = f"demo review (scripted by {os.environ.get('MLOPS_USER', '?')}): reference overlap"
    return {**item, "preferred": verdict, "wrong_fact": [], "note": note}
