"""The words every platform says alike, as plain text: why a run stopped, its status and budget
lines, which option a click chose, and the link to a session's thread. Each adapter adds only
its markup (escaping, bold, code spans) around them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from bot.kinds import StopReason
from bot.place import Place
from bot.text import invisibles_named

_REASONS: Final[dict[StopReason, str]] = {
    StopReason.ANSWERED: "answered",
    StopReason.ITERATION_LIMIT: "iteration limit reached",
    StopReason.TOOL_CALL_LIMIT: "tool call limit reached",
    StopReason.TOKEN_BUDGET: "token budget exhausted",
    StopReason.DEADLINE: "deadline passed",
    StopReason.NO_PROGRESS: "no progress (the same calls kept returning the same results)",
    StopReason.CANCELLED: "cancelled",
    StopReason.MODEL_ERROR: "model error",
    StopReason.TRUNCATED: "the model's reply was cut off",
    StopReason.POLICY: "refused by the policy",
    StopReason.TAKEN_OVER: "taken over by another process",
    StopReason.PANIC: "stopped by the panic switch",
    StopReason.UNCERTAIN_EFFECT: "an effect's outcome is uncertain",
    StopReason.HOOK_ABORT: "aborted by a hook",
    StopReason.SETUP_ERROR: "could not be set up",
    StopReason.SUSPEND_REQUESTED: "suspended on request",
    StopReason.INTERRUPTED: "interrupted",
    StopReason.HANDED_BACK: "handed back by a stopping replica",
    StopReason.WAITING: "waiting for people",
}

# What a click on an option that the question does not have gets, on every platform.
NOT_AN_OPTION: Final = "That is not one of the options."
# What a command gets when the store failed under it: the store's own error names its host.
STORE_DOWN: Final = "Kestrel's store did not answer: try again in a moment."
# What a click gets when the store failed under it: the platform never sends it again.
NOT_RECORDED: Final = (
    "Kestrel's store did not answer: that click may not have counted. Click again in a moment."
)


def cancel_not_counted(run_id: str) -> str:
    """What a cancel gets when the store failed under it (before the run was stopped here):
    nothing stopped the run, and the cancel may not be recorded."""
    return (
        f"Kestrel's store did not answer: the cancel of run {run_id} may not have counted, and"
        " the run may go on. Cancel it again in a moment."
    )


# The longest run id quoted back as typed: the core's are far shorter, and a platform's
# message is not (Discord takes a command's option of 6000 characters, a message of 2000).
RUN_ID_SHOWN = 100


def unseen_run(run_id: str) -> str:
    """What someone told of a run that does not exist or that they may not see: the same
    words for both, so that a refusal tells nothing of others' runs. What was typed is cut
    past ``RUN_ID_SHOWN`` characters, so that the answer fits any platform's message."""
    if len(run_id) > RUN_ID_SHOWN:
        run_id = run_id[: RUN_ID_SHOWN - 1] + "…"
    return f"There is no run {run_id} that you can see."


def stop_reason_words(value: StopReason | str) -> str:
    """Why a run stopped, for people ("token budget exhausted"); an unknown reason as it is."""
    try:
        return _REASONS[StopReason(value)]
    except ValueError:
        return str(value).replace("_", " ")


# A run handed back by a stopping replica: who goes on with it depends on the store.
HANDED_ON: Final = "Paused: the replica running it is stopping; another replica goes on with it."
HANDED_TO_RESTART: Final = "Paused: Kestrel is stopping; it goes on when Kestrel is started again."

_PAUSES: Final = {
    StopReason.HANDED_BACK: HANDED_TO_RESTART,
    StopReason.INTERRUPTED: "Paused: stopped where it ran. Mention me with `resume` to go on.",
    StopReason.SUSPEND_REQUESTED: "Paused on request. Mention me with `resume` to go on.",
}


def suspended_words(
    reason: StopReason, *, waiting: bool, shared: bool = False, cut: Sequence[str] = ()
) -> str:
    """The last line of a thread's status when its run suspends: whom or what it waits for
    (``waiting``: a request is open, whatever else stopped it); handed back, who goes on
    with it (``shared``: other replicas share the store) and the commands the stop killed
    (``cut``), whose outcome on-call settles."""
    if waiting:
        return "Waiting on people."
    said = paused_words(reason, shared=shared) or "Waiting on people."
    if not cut:
        return said
    names = " and ".join(f"`{name}`" for name in dict.fromkeys(cut))
    return (
        f"{said} The stop killed {names} under way: whether it took effect is uncertain,"
        " and on-call will be asked to settle it."
    )


def paused_words(reason: StopReason | str, *, shared: bool = False) -> str:
    """What a run suspended by a stop rather than a request waits for (``resume``, another
    replica with a ``shared`` store, a restart without one), as its thread's status says it;
    empty for any other reason."""
    try:
        found = StopReason(reason)
    except ValueError:
        return ""
    if found is StopReason.HANDED_BACK and shared:
        return HANDED_ON
    return _PAUSES.get(found, "")


def status_words(status: str, reason: StopReason | str) -> str:
    """``Run failed: token budget exhausted``; just ``Run completed`` where the reason says
    no more than the status (or there is none)."""
    words = stop_reason_words(reason) if reason else ""
    return f"Run {status}" if not words or words == status else f"Run {status}: {words}"


def number_words(value: float) -> str:
    """A count as people read it: ``12,345``; one decimal when it is not whole."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"


def budget_words(used: Mapping[str, tuple[float, float]]) -> str:
    """``iterations 2/10, tokens 1,234/200,000``: each budget used, over its limit if any."""
    parts = []
    for name, (count, limit) in used.items():
        label = name.replace("_", " ")
        shown = number_words(count) if not limit else f"{number_words(count)}/{number_words(limit)}"
        parts.append(f"{label} {shown}")
    return ", ".join(parts)


def chosen_option(options: Sequence[str], index: int | None) -> str | None:
    """The option a click's index picks; None when the question has no such option."""
    if index is None or not 0 <= index < len(options):
        return None
    return options[index]


# --- a session's thread ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Thread:
    """The chat thread a run belongs to: a label, and a link when the platform has one."""

    platform: str
    label: str
    url: str | None = None


def thread_of(session_id: str) -> Thread:
    """The thread a session id names: ``slack:TEAM:CHANNEL:THREAD_TS`` and
    ``discord:GUILD:THREAD`` become links; anything else (a console session) is a label."""
    parts = session_id.split(":")
    if len(parts) == 4 and parts[0] == "slack":
        _, team, channel, ts = parts
        url = Place("slack", team, channel, ts).link()
        if url is not None:
            return Thread("slack", f"Slack {channel}, thread {ts}", url)
    if len(parts) == 3 and parts[0] == "discord":
        _, guild, thread = parts
        url = Place("discord", guild, "", thread).link()
        if url is not None:
            return Thread("discord", f"Discord thread {thread}", url)
    return Thread("", session_id)


# The heading of a card's origins.
ORIGINS_TITLE: Final = "Taken from tool output"
# Said beside an origin whose tool output holds instruction-like text (``bot.text``).
INSTRUCTION_MARK: Final = "its output holds instruction-like text"


def origin_words(argument: str, value: str, tool: str, line: int, excerpt: str) -> str:
    """Where an argument came from, for people: "unit = payments-db came from read_log output,
    line 3: …" (plain text; an adapter adds code spans)."""
    return f"{argument} = {value} came from {tool} output, line {line}: {excerpt}"


class Origin(Protocol):
    """Where one argument came from (an ``ArgumentOrigin``, or as a fast read holds it)."""

    @property
    def argument(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def tool(self) -> str: ...
    @property
    def call_id(self) -> str: ...
    @property
    def line(self) -> int: ...
    @property
    def excerpt(self) -> str: ...
    @property
    def instruction_like(self) -> bool: ...


def origin_lines(
    origins: Sequence[Origin], code: Callable[[str], str] = str, warn: Callable[[str], str] = str
) -> list[str]:
    """Each origin in words, its argument, value, tool and excerpt marked up by ``code``, and
    an output with instruction-like text said so (marked up by ``warn``). Invisible characters
    in the pieces are named, as in the arguments they came into."""

    def piece(text: str) -> str:
        return code(invisibles_named(text))

    return [
        origin_words(piece(o.argument), piece(o.value), piece(o.tool), o.line, piece(o.excerpt))
        + (f" {warn(f'⚠ {INSTRUCTION_MARK}')}" if o.instruction_like else "")
        for o in origins
    ]
