"""Discord objects and gateway payloads as the real API sends them (API v10, checked against
discord.py 2.7.1's parsers).

Every id is a string snowflake. New ids come from :func:`snowflake`: time-based (so
``discord.utils.snowflake_time`` gives "now", and ``Interaction.expires_at`` is 15 minutes
ahead, not in 2015) and strictly increasing in this process, so later objects sort later.

Fields discord.py *requires* (a KeyError in its parser otherwise) and which are easy to forget:

* members: ``roles`` and ``flags`` (``Member.__init__`` reads ``data['flags']``), plus ``user``
  wherever the member is not attached to a message author;
* threads: ``message_count``, ``member_count``, ``owner_id``, ``parent_id`` and
  ``thread_metadata`` with ``archived``, ``auto_archive_duration``, ``archive_timestamp``;
* text channels: ``name`` and ``position``;
* messages: ``id``, ``type``, ``content``, ``channel_id`` (and ``author`` for ``Message.author``);
* interactions: ``id``, ``type``, ``token``, ``version``, ``application_id`` and
  ``attachment_size_limit`` (``Interaction.filesize_limit``);
* roles: ``id`` and ``name``.

The builders for INTERACTION_CREATE take the *card* message a component sits on. discord.py
only calls a ``DynamicItem`` when that message's components contain a component with the
clicked ``custom_id`` and type (``ViewStore.schedule_dynamic_item_call`` rebuilds the view
from ``interaction.message``); :func:`interaction_button` therefore builds a card holding the
button when no message is given.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The default world: guild "100" with text channel "200", role "300" ("sre"), bot "900",
#: application "901".
GUILD_ID = "100"
CHANNEL_ID = "200"
ROLE_ID = "300"
BOT_ID = "900"
APP_ID = "901"
USER_ID = "1000"

DISCORD_EPOCH_MS = 1_420_070_400_000

#: ``@everyone`` in the fake guilds: view/send/threads/history/embeds/files/reactions/app
#: commands/invites/nickname/voice connect+speak/external emojis/activities/manage
#: threads+messages.
EVERYONE_PERMISSIONS = "947110931521"
#: ``member.permissions`` / ``app_permissions`` in interaction payloads (a plain member).
MEMBER_PERMISSIONS = "311455763521"
#: Permissions of the bot's managed role when one is asked for (administrator included).
ALL_PERMISSIONS = "8866461766385663"

#: ``attachment_size_limit`` of interactions in an unboosted guild (10 MiB).
ATTACHMENT_SIZE_LIMIT = 10 * 1024 * 1024

#: Message flags.
FLAG_HAS_THREAD = 1 << 5
FLAG_EPHEMERAL = 1 << 6
FLAG_LOADING = 1 << 7
FLAG_IS_COMPONENTS_V2 = 1 << 15

#: Channel types.
TEXT = 0
DM = 1
PUBLIC_THREAD = 11
PRIVATE_THREAD = 12
THREAD_TYPES = frozenset({10, PUBLIC_THREAD, PRIVATE_THREAD})

#: Interaction types.
PING, APPLICATION_COMMAND, MESSAGE_COMPONENT, AUTOCOMPLETE, MODAL_SUBMIT = 1, 2, 3, 4, 5

_lock = threading.Lock()
_last_snowflake = 0
_increment = itertools.count()


def snowflake(at_ms: int | None = None) -> str:
    """A new snowflake id (string), time-based and strictly increasing in this process."""
    global _last_snowflake
    ms = int(time.time() * 1000) if at_ms is None else at_ms
    with _lock:
        value = ((ms - DISCORD_EPOCH_MS) << 22) | (next(_increment) % 4096)
        value = max(value, _last_snowflake + 1)
        _last_snowflake = value
    return str(value)


def snowflake_time(value: str | int) -> datetime.datetime:
    """When a snowflake was made (UTC)."""
    ms = (int(value) >> 22) + DISCORD_EPOCH_MS
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def iso(when: datetime.datetime | None = None) -> str:
    """An ISO-8601 timestamp as Discord writes it (``2024-01-01T00:00:00.000000+00:00``)."""
    when = when or datetime.datetime.now(datetime.UTC)
    return when.astimezone(datetime.UTC).isoformat(timespec="microseconds")


def timestamp_of(value: str | int) -> str:
    """The ISO timestamp of a snowflake (a message's ``timestamp``)."""
    return iso(snowflake_time(value))


def new_token() -> str:
    """A fresh interaction token (opaque, URL-safe)."""
    return "aW50ZXJhY3Rpb24" + uuid.uuid4().hex + uuid.uuid4().hex


# --------------------------------------------------------------------------- users and members


def user(
    user_id: str = USER_ID,
    *,
    username: str | None = None,
    bot: bool = False,
    global_name: str | None = None,
) -> dict[str, Any]:
    """A user object (as in ``author``, ``member.user``, ``mentions``)."""
    name = username or ("kestrel" if bot else f"user{user_id}")
    data: dict[str, Any] = {
        "id": str(user_id),
        "username": name,
        "global_name": global_name if global_name is not None else (None if bot else name.title()),
        "discriminator": "0",
        "avatar": None,
        "avatar_decoration_data": None,
        "banner": None,
        "accent_color": None,
        "public_flags": 0,
        "primary_guild": None,
        "collectibles": None,
        "clan": None,
    }
    if bot:
        data["bot"] = True
    return data


def bot_user(bot_id: str = BOT_ID, *, username: str = "kestrel") -> dict[str, Any]:
    """The bot's own user as ``GET /users/@me`` and READY give it (a ClientUser)."""
    return {
        **user(bot_id, username=username, bot=True),
        "verified": True,
        "mfa_enabled": False,
        "locale": "en-US",
        "email": None,
        "flags": 0,
    }


def member(
    user_id: str = USER_ID,
    *,
    roles: Iterable[str] = (),
    with_user: bool = True,
    username: str | None = None,
    bot: bool = False,
    nick: str | None = None,
    joined_at: str | None = None,
    permissions: str | None = None,
) -> dict[str, Any]:
    """A guild member. ``with_user=False`` gives the form attached to a MESSAGE_CREATE
    ``member`` or a mention's ``member`` (no ``user``); ``permissions`` is set in interactions."""
    data: dict[str, Any] = {
        "roles": [str(r) for r in roles],
        "nick": nick,
        "avatar": None,
        "banner": None,
        "premium_since": None,
        "joined_at": joined_at or "2024-01-01T00:00:00.000000+00:00",
        "pending": False,
        "communication_disabled_until": None,
        "unusual_dm_activity_until": None,
        "flags": 0,
        "mute": False,
        "deaf": False,
    }
    if with_user:
        data["user"] = user(user_id, username=username, bot=bot)
    if permissions is not None:
        data["permissions"] = permissions
    return data


def role(
    role_id: str,
    name: str,
    *,
    position: int = 1,
    permissions: str = "0",
    managed: bool = False,
    bot_id: str | None = None,
) -> dict[str, Any]:
    """A role object (``name="@everyone"`` with ``role_id`` = the guild id for @everyone)."""
    data: dict[str, Any] = {
        "id": str(role_id),
        "name": name,
        "description": None,
        "color": 0,
        "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
        "hoist": False,
        "icon": None,
        "unicode_emoji": None,
        "position": position,
        "permissions": permissions,
        "managed": managed,
        "mentionable": False,
        "flags": 0,
    }
    if managed and bot_id:
        data["tags"] = {"bot_id": str(bot_id)}
    return data


def everyone_role(guild_id: str = GUILD_ID) -> dict[str, Any]:
    """The guild's @everyone role (id = guild id, position 0)."""
    return role(guild_id, "@everyone", position=0, permissions=EVERYONE_PERMISSIONS)


# --------------------------------------------------------------------------- channels


def text_channel(
    channel_id: str = CHANNEL_ID,
    *,
    guild: str = GUILD_ID,
    name: str | None = None,
    position: int = 0,
    parent_id: str | None = None,
    topic: str | None = None,
    last_message_id: str | None = None,
) -> dict[str, Any]:
    """A guild text channel (type 0)."""
    return {
        "id": str(channel_id),
        "type": TEXT,
        "guild_id": str(guild),
        "name": name or f"channel-{channel_id}",
        "position": position,
        "parent_id": parent_id,
        "topic": topic,
        "nsfw": False,
        "rate_limit_per_user": 0,
        "last_message_id": last_message_id,
        "permission_overwrites": [],
        "flags": 0,
        "icon_emoji": None,
        "theme_color": None,
        "default_auto_archive_duration": 1440,
        "default_thread_rate_limit_per_user": 0,
    }


def thread_channel(
    thread_id: str | None = None,
    *,
    guild: str = GUILD_ID,
    parent_id: str = CHANNEL_ID,
    owner_id: str = BOT_ID,
    name: str = "thread",
    type: int = PUBLIC_THREAD,
    archived: bool = False,
    locked: bool = False,
    auto_archive_duration: int = 1440,
    message_count: int = 0,
    member_count: int = 1,
    last_message_id: str | None = None,
    member_user_id: str | None = None,
    newly_created: bool | None = None,
) -> dict[str, Any]:
    """A thread channel (type 11 public, 12 private, 10 announcement) as REST returns it and
    THREAD_CREATE sends it (pass ``newly_created=True`` for the event after a creation).

    ``member_user_id`` adds the ``member`` field (the thread member of the current user, which
    the gateway includes for threads the bot is in).
    """
    thread_id = thread_id or snowflake()
    now = iso()
    data: dict[str, Any] = {
        "id": str(thread_id),
        "type": type,
        "guild_id": str(guild),
        "parent_id": str(parent_id),
        "owner_id": str(owner_id),
        "name": name,
        "last_message_id": last_message_id,
        "rate_limit_per_user": 0,
        "flags": 0,
        "message_count": message_count,
        "member_count": member_count,
        "total_message_sent": message_count,
        "member_ids_preview": [str(owner_id)],
        "thread_metadata": {
            "archived": archived,
            "archive_timestamp": now,
            "auto_archive_duration": auto_archive_duration,
            "locked": locked,
            "create_timestamp": now,
        },
    }
    if type == PRIVATE_THREAD:
        data["thread_metadata"]["invitable"] = True
    if member_user_id is not None:
        data["member"] = {
            "id": str(thread_id),
            "user_id": str(member_user_id),
            "join_timestamp": now,
            "flags": 1,
            "muted": False,
            "mute_config": None,
        }
    if newly_created is not None:
        data["newly_created"] = newly_created
    return data


def dm_channel(channel_id: str, *, recipient: Mapping[str, Any]) -> dict[str, Any]:
    """A DM channel (type 1) with one recipient."""
    return {
        "id": str(channel_id),
        "type": DM,
        "last_message_id": None,
        "flags": 0,
        "recipients": [dict(recipient)],
    }


# --------------------------------------------------------------------------- guilds and READY


def guild_object(
    guild_id: str = GUILD_ID,
    *,
    name: str = "Kestrel Test",
    roles: Sequence[Mapping[str, Any]] = (),
    owner_id: str = "1",
    system_channel_id: str | None = None,
) -> dict[str, Any]:
    """A guild as ``GET /guilds/{id}`` returns it (no channels/members)."""
    return {
        "id": str(guild_id),
        "name": name,
        "icon": None,
        "icon_hash": None,
        "description": None,
        "splash": None,
        "discovery_splash": None,
        "banner": None,
        "features": [],
        "owner_id": str(owner_id),
        "application_id": None,
        "region": "deprecated",
        "afk_channel_id": None,
        "afk_timeout": 300,
        "system_channel_id": system_channel_id,
        "system_channel_flags": 0,
        "widget_enabled": False,
        "widget_channel_id": None,
        "verification_level": 0,
        "default_message_notifications": 0,
        "explicit_content_filter": 0,
        "mfa_level": 0,
        "nsfw": False,
        "nsfw_level": 0,
        "max_presences": None,
        "max_members": 500000,
        "max_video_channel_users": 25,
        "max_stage_video_channel_users": 50,
        "vanity_url_code": None,
        "premium_tier": 0,
        "premium_subscription_count": 0,
        "premium_progress_bar_enabled": False,
        "preferred_locale": "en-US",
        "rules_channel_id": None,
        "public_updates_channel_id": None,
        "safety_alerts_channel_id": None,
        "hub_type": None,
        "incidents_data": None,
        "latest_onboarding_question_id": None,
        "roles": [dict(r) for r in roles],
        "emojis": [],
        "stickers": [],
    }


def guild_create(
    guild_id: str = GUILD_ID,
    *,
    name: str = "Kestrel Test",
    channels: Sequence[Mapping[str, Any]] = (),
    threads: Sequence[Mapping[str, Any]] = (),
    roles: Sequence[Mapping[str, Any]] = (),
    members: Sequence[Mapping[str, Any]] = (),
    member_count: int | None = None,
    owner_id: str = "1",
    joined_at: str | None = None,
) -> dict[str, Any]:
    """The GUILD_CREATE dispatch of an available guild (what makes discord.py cache the guild,
    its channels, threads, roles and the listed members).

    ``members`` should hold at least the bot's member (with ``user``): without the guilds'
    member intent Discord sends only the bot itself (and members in voice).
    """
    system_channel = next((str(c["id"]) for c in channels if c.get("type") == TEXT), None)
    data = guild_object(
        guild_id, name=name, roles=roles, owner_id=owner_id, system_channel_id=system_channel
    )
    data.update(
        {
            "joined_at": joined_at or iso(),
            "large": False,
            "unavailable": False,
            "member_count": member_count if member_count is not None else len(members),
            "voice_states": [],
            "members": [dict(m) for m in members],
            "channels": [{k: v for k, v in c.items() if k != "guild_id"} for c in channels],
            "threads": [dict(t) for t in threads],
            "presences": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
            "embedded_activities": [],
            "activity_instances": [],
            "application_command_counts": {},
            "lazy": True,
            "version": int(time.time() * 1000),
        }
    )
    return data


def ready(
    *,
    bot: Mapping[str, Any],
    guild_ids: Iterable[str],
    session_id: str,
    resume_gateway_url: str,
    app_id: str = APP_ID,
    app_flags: int = 0,
    shard: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The READY dispatch's ``d`` (guilds as unavailable stubs; GUILD_CREATEs follow)."""
    data: dict[str, Any] = {
        "v": 10,
        "user_settings": {},
        "user": dict(bot),
        "guilds": [{"id": str(g), "unavailable": True} for g in guild_ids],
        "session_id": session_id,
        "session_type": "normal",
        "resume_gateway_url": resume_gateway_url,
        "application": {"id": str(app_id), "flags": app_flags},
        "private_channels": [],
        "relationships": [],
        "presences": [],
        "guild_join_requests": [],
        "geo_ordered_rtc_regions": ["fake"],
        "auth": {},
        "_trace": ['["fake-gateway",{"micros":0}]'],
    }
    if shard is not None:
        data["shard"] = list(shard)
    return data


def application(
    app_id: str = APP_ID, *, bot: Mapping[str, Any] | None = None, owner_id: str = "1"
) -> dict[str, Any]:
    """``GET /oauth2/applications/@me`` (discord.py's login needs ``name``, ``description``,
    ``icon``, ``bot_public``, ``bot_require_code_grant``, ``owner``, ``verify_key``)."""
    bot_data = dict(bot) if bot is not None else bot_user()
    return {
        "id": str(app_id),
        "name": bot_data.get("username", "kestrel"),
        "icon": None,
        "description": "Kestrel (fake)",
        "summary": "",
        "type": None,
        "hook": True,
        "bot_public": False,
        "bot_require_code_grant": False,
        "verify_key": "0" * 64,
        "owner": user(owner_id, username="owner"),
        "flags": 0,
        "team": None,
        "bot": bot_data,
        "redirect_uris": [],
        "interactions_endpoint_url": None,
        "role_connections_verification_url": None,
        "tags": [],
        "install_params": None,
        "integration_types_config": {"0": {}},
        "approximate_guild_count": 1,
        "approximate_user_install_count": 0,
    }


# --------------------------------------------------------------------------- messages


def message(
    *,
    channel: str = CHANNEL_ID,
    author: Mapping[str, Any] | None = None,
    content: str = "",
    id: str | None = None,
    components: Sequence[Mapping[str, Any]] = (),
    embeds: Sequence[Mapping[str, Any]] = (),
    attachments: Sequence[Mapping[str, Any]] = (),
    flags: int = 0,
    type: int = 0,
    mentions: Sequence[Mapping[str, Any]] = (),
    mention_roles: Sequence[str] = (),
    mention_everyone: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """A message object as REST returns it (no ``guild_id``/``member``: the gateway adds
    those). ``author`` defaults to the default bot user."""
    message_id = id or snowflake()
    data: dict[str, Any] = {
        "type": type,
        "content": content,
        "mentions": [dict(m) for m in mentions],
        "mention_roles": [str(r) for r in mention_roles],
        "attachments": [dict(a) for a in attachments],
        "embeds": [dict(e) for e in embeds],
        "timestamp": timestamp_of(message_id),
        "edited_timestamp": None,
        "flags": flags,
        "components": [dict(c) for c in components],
        "id": str(message_id),
        "channel_id": str(channel),
        "author": dict(author) if author is not None else user(BOT_ID, bot=True),
        "pinned": False,
        "mention_everyone": mention_everyone,
        "tts": False,
    }
    data.update(extra)
    return data


def _mention(target: str | Mapping[str, Any], guild: str | None) -> dict[str, Any]:
    data = user(str(target), bot=str(target) == BOT_ID) if isinstance(target, str) else dict(target)
    if guild is not None and "member" not in data:
        data["member"] = member(str(data["id"]), with_user=False)
    return data


def message_create(
    *,
    guild: str | None = GUILD_ID,
    channel: str = CHANNEL_ID,
    author_id: str = USER_ID,
    content: str = "",
    mentions: Sequence[str | Mapping[str, Any]] | None = None,
    id: str | None = None,
    roles: Iterable[str] = (),
    username: str | None = None,
    author_bot: bool = False,
    components: Sequence[Mapping[str, Any]] = (),
    embeds: Sequence[Mapping[str, Any]] = (),
    attachments: Sequence[Mapping[str, Any]] = (),
    mention_roles: Sequence[str] = (),
    reply_to: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A MESSAGE_CREATE dispatch (``d``) from a person: ``guild_id`` and ``member`` (without
    ``user``) are set in a guild; ``guild=None`` makes it a DM (no member).

    ``mentions`` defaults to ``[BOT_ID]`` (the bot is pinged); give ids or user dicts. The
    content is used as given, so write the ping yourself (``f"<@{BOT_ID}> deploy"``) when you
    want it in the text. ``channel`` may be a thread id (discord.py resolves it only if the
    thread is cached, i.e. it came in GUILD_CREATE or THREAD_CREATE). ``reply_to`` (a message
    object) makes it a reply (type 19 with ``message_reference`` and ``referenced_message``).
    """
    mentioned = [BOT_ID] if mentions is None else list(mentions)
    data = message(
        channel=channel,
        author=user(author_id, username=username, bot=author_bot),
        content=content,
        id=id,
        components=components,
        embeds=embeds,
        attachments=attachments,
        mentions=[_mention(m, guild) for m in mentioned],
        mention_roles=mention_roles,
        nonce=str(int(time.time() * 1000) << 22),
    )
    if reply_to is not None:
        data["type"] = 19
        data["message_reference"] = {
            "type": 0,
            "channel_id": str(reply_to.get("channel_id", channel)),
            "message_id": str(reply_to["id"]),
            **({"guild_id": str(guild)} if guild is not None else {}),
        }
        data["referenced_message"] = dict(reply_to)
    if guild is not None:
        data["guild_id"] = str(guild)
        data["member"] = member(author_id, roles=roles, with_user=False)
    data.update(extra)
    return data


# --------------------------------------------------------------------------- components


def button(
    custom_id: str,
    *,
    label: str = "Approve",
    style: int = 1,
    disabled: bool = False,
    id: int | None = None,
) -> dict[str, Any]:
    """A button component (type 2)."""
    data: dict[str, Any] = {
        "type": 2,
        "style": style,
        "label": label,
        "custom_id": custom_id,
        "disabled": disabled,
    }
    if id is not None:
        data["id"] = id
    return data


def action_row(*children: Mapping[str, Any], id: int | None = None) -> dict[str, Any]:
    """An action row (type 1) holding ``children``."""
    data: dict[str, Any] = {"type": 1, "components": [dict(c) for c in children]}
    if id is not None:
        data["id"] = id
    return data


def string_select(
    custom_id: str, options: Sequence[str], *, placeholder: str | None = None
) -> dict[str, Any]:
    """A string select (type 3) whose options' labels and values are ``options``."""
    data: dict[str, Any] = {
        "type": 3,
        "custom_id": custom_id,
        "min_values": 1,
        "max_values": 1,
        "disabled": False,
        # Discord omits unset option fields; discord.py chokes on "emoji": null
        "options": [{"label": o, "value": o, "default": False} for o in options],
    }
    if placeholder is not None:
        data["placeholder"] = placeholder
    return data


def number_components(components: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copy ``components`` giving each (nested) component without an ``id`` the next number,
    as Discord does when it stores a message."""
    out = copy.deepcopy([dict(c) for c in components])
    used = {c["id"] for c in _walk(out) if isinstance(c.get("id"), int)}
    counter = itertools.count(1)
    for component in _walk(out):
        if "id" not in component:
            n = next(counter)
            while n in used:
                n = next(counter)
            component["id"] = n
    return out


def _walk(components: Iterable[Any]) -> Iterable[dict[str, Any]]:
    for component in components:
        if not isinstance(component, dict):
            continue
        yield component
        yield from _walk(component.get("components") or [])
        for key in ("component", "accessory"):
            if isinstance(component.get(key), dict):
                yield from _walk([component[key]])


def find_component(
    components: Iterable[Any], custom_id: str, component_type: int | None = None
) -> dict[str, Any] | None:
    """The (nested) component with ``custom_id`` (and type), or None."""
    for component in _walk(components):
        if component.get("custom_id") == custom_id and (
            component_type is None or component.get("type") == component_type
        ):
            return component
    return None


def card_message(
    custom_id: str,
    *,
    channel: str = CHANNEL_ID,
    content: str = "Approval needed",
    component_type: int = 2,
    options: Sequence[str] = (),
    author: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A bot message holding one button (or a string select when ``component_type`` is 3)
    with ``custom_id``: the default ``message`` of the component interaction builders."""
    component = (
        string_select(custom_id, options or ["a", "b"])
        if component_type == 3
        else button(custom_id)
    )
    return message(
        channel=channel,
        author=author,
        content=content,
        components=number_components([action_row(component)]),
    )


# --------------------------------------------------------------------------- interactions


def _channel_object(channel: str | Mapping[str, Any], guild: str | None) -> dict[str, Any]:
    if isinstance(channel, Mapping):
        data = dict(channel)
    elif guild is None:
        data = {"id": str(channel), "type": DM, "last_message_id": None, "flags": 0}
    else:
        data = text_channel(str(channel), guild=guild)
    data["permissions"] = data.get("permissions", MEMBER_PERMISSIONS)
    return data


def interaction(
    type: int,
    data: Mapping[str, Any] | None,
    *,
    guild: str | None = GUILD_ID,
    channel: str | Mapping[str, Any] = CHANNEL_ID,
    user_id: str = USER_ID,
    roles: Iterable[str] = (),
    username: str | None = None,
    app_id: str = APP_ID,
    token: str | None = None,
    id: str | None = None,
    message: Mapping[str, Any] | None = None,
    locale: str = "en-US",
    app_permissions: str = MEMBER_PERMISSIONS,
    **extra: Any,
) -> dict[str, Any]:
    """An INTERACTION_CREATE ``d`` of any type. In a guild it has ``member`` (with ``user``,
    ``roles``, ``flags``, ``permissions``) and a partial ``guild``; with ``guild=None`` it is a
    DM interaction with ``user``. ``channel`` is an id or a channel object (e.g. from
    :func:`thread_channel`); it is sent as ``channel`` (with ``permissions``) and
    ``channel_id``."""
    channel_data = _channel_object(channel, guild)
    payload: dict[str, Any] = {
        "id": id or snowflake(),
        "application_id": str(app_id),
        "type": type,
        "token": token or new_token(),
        "version": 1,
        "channel": channel_data,
        "channel_id": str(channel_data["id"]),
        "locale": locale,
        "app_permissions": app_permissions,
        "entitlements": [],
        "entitlement_sku_ids": [],
        "attachment_size_limit": ATTACHMENT_SIZE_LIMIT,
    }
    if data is not None:
        payload["data"] = dict(data)
    if guild is not None:
        payload["guild_id"] = str(guild)
        payload["guild"] = {"id": str(guild), "locale": "en-US", "features": []}
        payload["guild_locale"] = "en-US"
        payload["member"] = member(
            user_id, roles=roles, username=username, permissions=MEMBER_PERMISSIONS
        )
        payload["authorizing_integration_owners"] = {"0": str(guild)}
        payload["context"] = 0
    else:
        payload["user"] = user(user_id, username=username)
        payload["authorizing_integration_owners"] = {"1": str(user_id)}
        payload["context"] = 1
    if message is not None:
        payload["message"] = dict(message)
    payload.update(extra)
    return payload


def interaction_button(
    *,
    custom_id: str,
    guild: str | None = GUILD_ID,
    channel: str | Mapping[str, Any] = CHANNEL_ID,
    user_id: str = USER_ID,
    message: Mapping[str, Any] | None = None,
    roles: Iterable[str] = (),
    app_id: str = APP_ID,
    token: str | None = None,
    id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A button click (type 3 MESSAGE_COMPONENT, ``data.component_type`` 2) on ``message``
    (default: :func:`card_message` with this button)."""
    channel_id = str(channel["id"]) if isinstance(channel, Mapping) else str(channel)
    card = dict(message) if message is not None else card_message(custom_id, channel=channel_id)
    data: dict[str, Any] = {"custom_id": custom_id, "component_type": 2}
    found = find_component(card.get("components") or [], custom_id, 2)
    if found is not None and "id" in found:
        data["id"] = found["id"]
    return interaction(
        MESSAGE_COMPONENT,
        data,
        guild=guild,
        channel=channel,
        user_id=user_id,
        roles=roles,
        app_id=app_id,
        token=token,
        id=id,
        message=card,
        **extra,
    )


def interaction_select(
    *,
    custom_id: str,
    values: Sequence[str],
    guild: str | None = GUILD_ID,
    channel: str | Mapping[str, Any] = CHANNEL_ID,
    user_id: str = USER_ID,
    message: Mapping[str, Any] | None = None,
    roles: Iterable[str] = (),
    app_id: str = APP_ID,
    token: str | None = None,
    id: str | None = None,
    component_type: int = 3,
    resolved: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A select-menu choice (type 3, ``data.component_type`` 3 string select by default; 5-8
    for user/role/mentionable/channel selects, which also need ``resolved``)."""
    channel_id = str(channel["id"]) if isinstance(channel, Mapping) else str(channel)
    card = (
        dict(message)
        if message is not None
        else card_message(custom_id, channel=channel_id, component_type=3, options=values)
    )
    data: dict[str, Any] = {
        "custom_id": custom_id,
        "component_type": component_type,
        "values": [str(v) for v in values],
    }
    found = find_component(card.get("components") or [], custom_id, component_type)
    if found is not None and "id" in found:
        data["id"] = found["id"]
    if resolved is not None:
        data["resolved"] = dict(resolved)
    return interaction(
        MESSAGE_COMPONENT,
        data,
        guild=guild,
        channel=channel,
        user_id=user_id,
        roles=roles,
        app_id=app_id,
        token=token,
        id=id,
        message=card,
        **extra,
    )


def interaction_modal_submit(
    *,
    custom_id: str,
    components: Mapping[str, str],
    layout: str = "action_row",
    guild: str | None = GUILD_ID,
    channel: str | Mapping[str, Any] = CHANNEL_ID,
    user_id: str = USER_ID,
    message: Mapping[str, Any] | None = None,
    roles: Iterable[str] = (),
    app_id: str = APP_ID,
    token: str | None = None,
    id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A modal submission (type 5 MODAL_SUBMIT): ``components`` maps each text input's
    ``custom_id`` to the submitted value.

    Discord echoes the modal's layout: discord.py 2.7 sends a ``TextInput`` added straight to a
    ``Modal`` inside an action row (type 1), so ``layout="action_row"`` (the default) answers
    ``[{"type": 1, "components": [{"type": 4, "custom_id", "value"}]}]``; a ``TextInput`` inside
    a ``discord.ui.Label`` comes back as ``layout="label"``:
    ``[{"type": 18, "component": {"type": 4, "custom_id", "value"}}]``. discord.py's
    ``Modal._refresh`` reads both. ``message`` is the message the modal was opened from (set
    when a component opened it)."""
    if layout not in ("action_row", "label"):
        raise ValueError(f"layout must be 'action_row' or 'label', not {layout!r}")
    counter = itertools.count(1)
    rows: list[dict[str, Any]] = []
    for input_id, value in components.items():
        outer = next(counter)
        text_input = {"type": 4, "id": next(counter), "custom_id": input_id, "value": value}
        if layout == "action_row":
            rows.append({"type": 1, "id": outer, "components": [text_input]})
        else:
            rows.append({"type": 18, "id": outer, "component": text_input})
    return interaction(
        MODAL_SUBMIT,
        {"custom_id": custom_id, "components": rows},
        guild=guild,
        channel=channel,
        user_id=user_id,
        roles=roles,
        app_id=app_id,
        token=token,
        id=id,
        message=message,
        **extra,
    )


def interaction_command(
    *,
    name: str = "kestrel",
    options: Sequence[Mapping[str, Any]] | None = None,
    command_id: str | None = None,
    command_guild_id: str | None = None,
    guild: str | None = GUILD_ID,
    channel: str | Mapping[str, Any] = CHANNEL_ID,
    user_id: str = USER_ID,
    roles: Iterable[str] = (),
    app_id: str = APP_ID,
    token: str | None = None,
    id: str | None = None,
    resolved: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A slash command (type 2 APPLICATION_COMMAND, ``data.type`` 1 CHAT_INPUT).

    ``options`` as Discord nests them: a subcommand is ``{"name": "status", "type": 1,
    "options": [...]}``, a string argument ``{"name": "service", "type": 3, "value": "api"}``.
    Default: the ``status`` subcommand. ``command_guild_id`` sets ``data.guild_id``, which
    Discord sends for *guild* commands and which discord.py's CommandTree needs to find a
    command synced to a guild (without it only global commands are looked up).
    """
    data: dict[str, Any] = {
        "id": command_id or snowflake(),
        "name": name,
        "type": 1,
        "options": [
            dict(o) for o in (options if options is not None else [{"name": "status", "type": 1}])
        ],
    }
    for option in data["options"]:
        if option.get("type") in (1, 2):
            option.setdefault("options", [])
    if command_guild_id is not None:
        data["guild_id"] = str(command_guild_id)
    if resolved is not None:
        data["resolved"] = dict(resolved)
    return interaction(
        APPLICATION_COMMAND,
        data,
        guild=guild,
        channel=channel,
        user_id=user_id,
        roles=roles,
        app_id=app_id,
        token=token,
        id=id,
        **extra,
    )


_MENTION_USER = re.compile(r"<@!?(\d+)>")
_MENTION_ROLE = re.compile(r"<@&(\d+)>")


def mentioned_ids(content: str) -> tuple[list[str], list[str], bool]:
    """(user ids, role ids, @everyone/@here) mentioned in ``content``."""
    users = list(dict.fromkeys(_MENTION_USER.findall(content)))
    roles = list(dict.fromkeys(_MENTION_ROLE.findall(content)))
    return users, roles, "@everyone" in content or "@here" in content
