"""The errors a caller reports as they are: the store's, and a resume refused."""

from __future__ import annotations


class StoreError(Exception):
    """A store operation failed for a reason the caller should report."""


def unanswered(exc: BaseException) -> bool:
    """Whether ``exc`` is the store failing to answer (down, timed out, cut off), which a later
    try may get past; a subclass is an answer (no such run, an unreadable journal), which stays."""
    return type(exc) is StoreError


class StaleEpoch(StoreError):
    """The append carried an epoch older than the run's current lease: the caller lost ownership."""


class SeqConflict(StoreError):
    """A different record already stands at that sequence number."""


class SeqGap(StoreError):
    """The append would leave a gap in the run's sequence numbers."""


class UnknownRun(StoreError):
    """No run has that id."""


class UnreadableJournal(StoreError):
    """A stored journal entry reads as no entry (cut short, edited, written by a newer
    version): that run cannot be resumed until someone repairs it; the store itself works."""


class UnreadableRow(StoreError):
    """A run's or a request's stored row reads as none (edited, written by a newer version):
    reading it again gives the same answer; the store itself works."""


class ThreadBusy(StoreError):
    """A run of the same thread is still unfinished: a new one was not created."""


class ResumeRefused(Exception):
    """The run cannot be resumed as asked; the message says why and what to do."""


class CancelRefused(ResumeRefused):
    """The run cannot be cancelled now: it ended, or another process holds it (the message says
    who, and until when). Reported where a refused resume is, as one line."""


def already_ended(run_id: str, status: str, verb: str) -> str:
    """Why ``verb`` (cancel, resume) does nothing to a run that ended ``status``."""
    return f"run {run_id} already ended ({status}): nothing to {verb}"
