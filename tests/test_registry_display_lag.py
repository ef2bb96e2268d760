"""A display copy that could not be written is reported to the act's own caller, once, and to nobody else."""

from __future__ import annotations

import contextlib
import threading

import pytest

from registry import transition
from registry.transition import DisplayLagError, Plan, flush_display


@pytest.fixture
def failing_copies(monkeypatch, mlops_home):
    def fail(model, plan, written, store=None):
        raise DisplayLagError(f"the aliases of {model} lag behind the ledger")

    monkeypatch.setattr(transition, "_write_aliases", fail)
    yield
    flush_display()
    transition.unreported_lags().clear()


def act(model: str) -> None:
    """What an act does after its ledger commit: hand its display copies to the writer thread."""
    transition._write_display_later(model, Plan(aliases={"champion": (None, "1")}), [], contextlib.ExitStack())


def test_a_display_lag_is_reported_to_the_acting_thread_once(failing_copies):
    act("support-bot")
    with pytest.raises(DisplayLagError, match="support-bot"):
        flush_display(report=True)
    flush_display(report=True)  # told once: nothing left to report


def test_a_lag_left_unreported_by_an_ended_thread_is_not_told_to_a_later_one(failing_copies):
    """Thread idents are reused: a lag keyed by ident reached the next app session on a recycled thread."""
    idents, told = [], []

    def session(do_act: bool) -> None:
        idents.append(threading.get_ident())
        if do_act:
            act("earlier-session-model")
            flush_display()  # its copies were written (and failed), but this session never asked for the report
            return
        try:
            flush_display(report=True)
        except DisplayLagError as err:
            told.append(str(err))

    first = threading.Thread(target=session, args=(True,))
    first.start()
    first.join()
    for _ in range(20):  # later threads, one at a time: on Linux one usually gets the ended thread's ident
        later = threading.Thread(target=session, args=(False,))
        later.start()
        later.join()
    assert told == [], f"a later thread was told of an earlier one's lag (ident reused: {idents[0] in idents[1:]})"
