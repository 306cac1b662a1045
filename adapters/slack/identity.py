"""Who is acting: a Slack user as the policy sees them (user id, workspace, place), and what
Slack tells about them when a check needs it (user groups, channel membership)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.chat.contract import Actor, Place

log = logging.getLogger("kestrel.slack")

# How long a group's or a channel's members, as Slack said them, stand: Slack tells of a change
# as it happens (``forget``, from ``subteam_members_changed``, ``subteam_updated``,
# ``member_left_channel``, ``member_joined_channel``), and this bounds what an event lost, or
# delivered to another replica, leaves standing. Asking afresh at every click met Slack's limit
# on ``usergroups.users.list`` (Tier 2, about 20 a minute) in an incident; 10 s keeps a burst of
# clicks to one call a group while a removal Slack told another replica counts within seconds.
CACHE_SECONDS = 10.0
# What one person's action may spend asking Slack, all its lookups together (a card's
# approvers may name several groups): a lookup past it is a no, and the click or form is
# still answered within Slack's 3 s, with time left for the store. A listing, answered
# through a response URL or the Home tab, gives each lookup this long.
LOOKUP_SECONDS = 2.0
MEMBERS_PAGE = 1000

T = TypeVar("T")
U = TypeVar("U", bool, str)


class Identities:
    """Builds ``Actor``s and answers the policy's questions about them (``Directory``): who is
    in a user group (``usergroups.users.list``), who is in a channel (``conversations.members``)
    and a user's own workspace (``users.info``). A group's or a channel's members are kept until
    Slack says they changed (``forget``) or for ``CACHE_SECONDS`` at most, and one lookup at a
    time is made of each, whoever waits on it: clicks of several approvers at once do not each
    spend one of the few calls a minute Slack allows. A failure or a time-out is a no, for that
    check alone, and an action that is not a listing spends at most ``timeout`` seconds asking,
    whatever it asks."""

    def __init__(
        self,
        client: AsyncWebClient,
        home_team: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        timeout: float = LOOKUP_SECONDS,
        org: str = "",
    ) -> None:
        self._client = client
        self._home_team = home_team
        self._org = org  # the Enterprise Grid organisation of our workspace ("" for none)
        self._clock = clock
        self._timeout = timeout
        self._groups: dict[str, tuple[float, frozenset[str]]] = {}
        self._channels: dict[str, tuple[float, frozenset[str]]] = {}
        self._teams: dict[str, tuple[float, str]] = {}
        # The lookup each group or channel is asked by, shared by all who act at once; one
        # Slack said was out of date (``forget``) is dropped here, its answer never kept.
        self._asking: dict[tuple[str, str], asyncio.Task[frozenset[str]]] = {}
        self._lookups: set[asyncio.Task[frozenset[str]]] = set()  # all under way, for ``close``

    async def actor(
        self, user: str, place: Place, *, team: str = "", listing: bool = False
    ) -> Actor:
        """``user`` acting from ``place``; ``team``: their own workspace when the payload says
        it. Someone whose workspace cannot be told is taken for a guest: only their own user id
        in the policy lets them act. ``listing``: only to read what waits (``/kestrel runs``,
        the Home tab), where no lookup is bounded by the action's time."""
        deadline = None if listing else self._clock() + self._timeout
        directory = _Acting(self, user, place, deadline)
        if not team or (self._org and team == self._org):
            # No team, or our Enterprise Grid org's id (``user_team``, ``user.team_id`` may
            # name the org): which workspace they are of, Slack's users.info says.
            said = await self._team_of(user, deadline)
            team = directory.told(said, f"which workspace {user} is of") or ""
        external = team != self._home_team
        return Actor(user, place=place, external=external, directory=directory)

    def forget(self, *, group: str = "", channel: str = "") -> None:
        """Slack said the members of ``group`` or ``channel`` changed: ask it again."""
        for kind, key, cache in (
            ("group", group, self._groups),
            ("channel", channel, self._channels),
        ):
            if key:
                cache.pop(key, None)
                self._asking.pop((kind, key), None)

    async def close(self) -> None:
        """Stop the lookups still under way (nobody waits on them any more)."""
        lookups = list(self._lookups)
        self._asking.clear()
        for task in lookups:
            task.cancel()
        await asyncio.gather(*lookups, return_exceptions=True)

    async def in_group(
        self, user: str, group: str, *, deadline: float | None = None
    ) -> bool | None:
        """Whether ``user`` is in the user group ``group``; None when Slack did not say
        (``deadline``: when the action stops asking Slack)."""
        lookup = partial(self._group_members, group)
        members = await self._members("group", self._groups, group, lookup, deadline)
        return None if members is None else user in members

    async def sees(self, user: str, place: Place, *, deadline: float | None = None) -> bool | None:
        """Whether ``user`` is a member of the channel of ``place`` (of our workspace); None
        when Slack did not say (``deadline`` as for ``in_group``)."""
        if place.platform != "slack" or place.workspace != self._home_team or not place.channel:
            return False
        lookup = partial(self._channel_members, place.channel)
        members = await self._members("channel", self._channels, place.channel, lookup, deadline)
        return None if members is None else user in members

    async def _members(
        self,
        kind: str,
        cache: dict[str, tuple[float, frozenset[str]]],
        key: str,
        fetch: Callable[[], Awaitable[frozenset[str]]],
        deadline: float | None,
    ) -> frozenset[str] | None:
        """The members of ``key`` as kept, else as Slack says now (one lookup for everyone
        waiting on it); None for a no."""
        hit = cache.get(key)
        if hit and self._clock() - hit[0] < CACHE_SECONDS:
            return hit[1]
        what = f"{'user group' if kind == 'group' else 'channel members'} of {key}"
        if self._time_left(deadline) <= 0:
            log.warning("slack: %s not asked: the action's %.0f s were spent", what, self._timeout)
            return None
        asking = self._asking.get((kind, key))
        if asking is None:
            asking = self._asking[(kind, key)] = asyncio.create_task(
                self._kept(kind, cache, key, fetch)
            )
            self._lookups.add(asking)
            asking.add_done_callback(partial(self._asked, (kind, key)))
        return await self._bounded(partial(asyncio.shield, asking), what, deadline)

    async def _kept(
        self,
        kind: str,
        cache: dict[str, tuple[float, frozenset[str]]],
        key: str,
        fetch: Callable[[], Awaitable[frozenset[str]]],
    ) -> frozenset[str]:
        """Slack's answer, kept unless Slack said the members changed while it was asked. It
        is given ``timeout`` at most, what one person waits: a rate-limited call waited out
        past that would ask again for nobody, spending a call of Slack's next window."""
        asked_at = self._clock()
        found = await asyncio.wait_for(fetch(), self._timeout)
        if self._asking.get((kind, key)) is asyncio.current_task():
            cache[key] = (asked_at, found)
        return found

    def _asked(self, key: tuple[str, str], done: asyncio.Task[frozenset[str]]) -> None:
        self._lookups.discard(done)
        if self._asking.get(key) is done:
            del self._asking[key]
        if not done.cancelled():
            done.exception()  # said by whoever waited for it; no "never retrieved" warning

    async def _bounded(
        self, lookup: Callable[[], Awaitable[T]], what: str, deadline: float | None
    ) -> T | None:
        """``lookup``'s answer within the time left (``deadline``), else None, said in a line."""
        left = self._time_left(deadline)
        if left <= 0:
            log.warning("slack: %s not asked: the action's %.0f s were spent", what, self._timeout)
            return None
        try:
            return await asyncio.wait_for(lookup(), left)
        except TimeoutError:
            log.warning("slack: %s took over %.1f s: taken as no", what, left)
        except SlackApiError as exc:
            log.warning("slack: %s refused: %s", what, exc.response.get("error"))
        except Exception as exc:  # a broken connection or reply: a no, said in one line
            log.warning("slack: %s failed: %s", what, exc)
        return None

    def _time_left(self, deadline: float | None) -> float:
        """How long a lookup may take: ``timeout``, or what is left of the action's time."""
        return self._timeout if deadline is None else min(self._timeout, deadline - self._clock())

    async def _group_members(self, group: str) -> frozenset[str]:
        reply = await self._client.usergroups_users_list(usergroup=group)
        return frozenset(str(u) for u in reply.get("users") or [])

    async def _channel_members(self, channel: str) -> frozenset[str]:
        members: set[str] = set()
        cursor = ""
        while True:
            reply = await self._client.conversations_members(
                channel=channel, limit=MEMBERS_PAGE, cursor=cursor or None
            )
            members.update(str(u) for u in reply.get("members") or [])
            cursor = str(_dict(reply.get("response_metadata")).get("next_cursor") or "")
            if not cursor:
                return frozenset(members)

    async def _team_of(self, user: str, deadline: float | None) -> str | None:
        """``user``'s own workspace as Slack's users.info says it; None when it did not say."""
        hit = self._teams.get(user)
        if hit and self._clock() - hit[0] < CACHE_SECONDS:
            return hit[1]
        ask = partial(self._client.users_info, user=user)
        reply = await self._bounded(ask, f"users.info of {user}", deadline)
        if reply is None:
            return None
        found = _dict(reply.get("user"))
        team = str(found.get("team_id") or "")
        # On Enterprise Grid a person may be of several workspaces of the org: ours among them
        # makes them one of ours.
        if self._home_team in (_dict(found.get("enterprise_user")).get("teams") or []):
            team = self._home_team
        self._teams[user] = (self._clock(), team)
        return team


@dataclass
class _Acting:
    """The directory as one person acting from one place asks it. A Slack thread shows to
    everyone in its channel, so a person acting from a run's channel (a slash command names no
    thread) sees the run: Slack is asked about other channels only, where a busy workspace's
    rate limit would be a no. A group or a channel is asked once per action (a plan's steps
    may name a group several times, a listing a channel per run)."""

    identities: Identities
    user: str
    acted_from: Place
    deadline: float | None = None  # when the action stops asking Slack (None: a listing)
    _groups: dict[tuple[str, str], bool] = field(default_factory=dict)
    _channels: dict[tuple[str, str], bool] = field(default_factory=dict)
    _untold: list[str] = field(default_factory=list)  # what Slack did not say, in words

    async def in_group(self, user: str, group: str) -> bool:
        """Whether ``user`` is in the user group ``group``."""
        known = self._groups.get((user, group))
        if known is None:
            ask = self.identities.in_group
            said = await ask(user, group, deadline=self.deadline)
            known = self._groups[(user, group)] = bool(self.told(said, f"who is in group:{group}"))
        return known

    async def sees(self, user: str, place: Place) -> bool:
        """Whether ``user`` sees the channel of ``place``: from it, at once."""
        channel = Place(place.platform, place.workspace, place.channel)
        if user == self.user and channel.holds(self.acted_from):
            return True
        key = (user, channel.channel)
        known = self._channels.get(key)
        if known is None:
            ask = self.identities.sees
            said = await ask(user, place, deadline=self.deadline)
            known = self._channels[key] = bool(
                self.told(said, f"who is in channel:{channel.channel}")
            )
        return known

    def untold(self) -> str:
        """What Slack did not say when asked for this action, in words; "" when it said all."""
        return f"Slack did not say {', nor '.join(self._untold)}" if self._untold else ""

    def told(self, said: U | None, what: str) -> U | None:
        """Slack's answer of ``what`` ("who is in group:S1"); None (it did not say) is kept
        as untold, for the refusal to say."""
        if said is None:
            self._untold.append(what)
        return said


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
