"""How Kestrel's thread messages look in Slack, and where a Slack session's messages go."""

from __future__ import annotations

from datetime import datetime

from adapters.slack.answers import answer_continuations, answer_message
from adapters.slack.cards import ClosedCard, request_card
from adapters.slack.ids import SlackThread, parse_thread_session
from adapters.slack.mrkdwn import principal
from adapters.slack.target import SlackTarget
from bot.chat.links import RunLink
from bot.chat.outbox import Target
from bot.chat.service import RequestView
from bot.chat.threads import Body
from bot.domain import RequestStatus, Session, TerminalResult


class SlackLook:
    """Block Kit bodies for the outbox; a target is a thread (channel, thread_ts, team).

    With ``link``, cards and answers end with a "View run" link to the run's page.
    """

    platform = "slack"

    def __init__(self, link: RunLink | None = None) -> None:
        self._link = link

    def target(self, session: Session) -> SlackTarget | None:
        """The thread a Slack session lives in; None for another platform's session."""
        thread = parse_thread_session(session.id)
        if thread is None:
            return None
        return SlackTarget(thread.team, thread.channel, thread.thread_ts)

    def card(self, view: RequestView) -> Body:
        """The request's card: open with its buttons, or closed with who decided."""
        closed = None
        if view.status is not RequestStatus.OPEN:
            closed = ClosedCard(view.status, view.decision, view.approvers)
        message = request_card(
            view.request, reason=view.reason, may_answer=view.may_answer, closed=closed
        )
        return self._linked(message.body(), view.request.run_id, view.request.created_at)

    def answer(self, result: TerminalResult, run_id: str, at: datetime) -> list[Body]:
        """The answer with its feedback buttons, then what did not fit in one message."""
        first = self._linked(answer_message(result, run_id=run_id).body(), run_id, at)
        return [first, *(more.body() for more in answer_continuations(result))]

    def _linked(self, body: Body, run_id: str, issued: datetime) -> Body:
        if self._link is None:
            return body
        url = self._link(run_id, issued)
        view = {"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{url}|View run>"}]}
        return {**body, "blocks": [*body.get("blocks", []), view]}

    def reminder(self, view: RequestView) -> Body:
        """A reminder naming who may answer."""
        who = ", ".join(principal(p) for p in view.may_answer) or "someone allowed to answer"
        return {
            "text": f"Reminder: the request for `{view.request.tool}` above still waits on {who}."
        }


def thread_of(target: Target) -> SlackThread:
    """The Slack thread an outbox target names."""
    slack = SlackTarget.of(target)
    return SlackThread(slack.team, slack.channel, slack.thread_ts)
