"""Who is acting: a Slack user as the policy sees them (user id, groups, workspace)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.policy import Actor

log = logging.getLogger("kestrel.slack")

CACHE_SECONDS = 60.0


class Identities:
    """Builds ``Actor``s: group memberships from ``usergroups.users.list`` and a user's home
    workspace from ``users.info``, each cached briefly."""

    def __init__(
        self,
        client: AsyncWebClient,
        home_team: str,
        groups_named: Callable[[], frozenset[str]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._home_team = home_team
        self._groups_named = groups_named
        self._clock = clock
        self._members: dict[str, tuple[float, frozenset[str]]] = {}
        self._teams: dict[str, tuple[float, str]] = {}

    async def actor(self, user: str, *, channel: str = "", team: str = "") -> Actor:
        """The actor for ``user``; ``team``: their own workspace when the payload says it.

        Someone whose workspace cannot be told (``users.info`` refused) is taken for a guest:
        only their own user id in the policy lets them act.
        """
        team = team or await self._team_of(user)
        groups = frozenset([g for g in self._groups_named() if user in await self._group(g)])
        return Actor(user, groups, channel, external=team != self._home_team)

    async def _group(self, group: str) -> frozenset[str]:
        cached = self._members.get(group)
        if cached and self._clock() - cached[0] < CACHE_SECONDS:
            return cached[1]
        try:
            reply = await self._client.usergroups_users_list(usergroup=group)
            members = frozenset(str(u) for u in reply.get("users") or [])
        except SlackApiError as exc:
            # Fail closed: nobody is in a group we cannot read.
            log.warning("slack: cannot read user group %s: %s", group, exc.response.get("error"))
            members = frozenset()
        self._members[group] = (self._clock(), members)
        return members

    async def _team_of(self, user: str) -> str:
        cached = self._teams.get(user)
        if cached and self._clock() - cached[0] < CACHE_SECONDS:
            return cached[1]
        try:
            reply = await self._client.users_info(user=user)
        except SlackApiError as exc:
            log.warning("slack: cannot look up user %s: %s", user, exc.response.get("error"))
            return ""
        info = reply.get("user") or {}
        team = str(info.get("team_id") or "")
        self._teams[user] = (self._clock(), team)
        return team
