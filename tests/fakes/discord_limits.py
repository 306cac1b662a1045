"""Discord's limits on a message's embeds and components, and on a thread's name, as the fake
REST API refuses what breaks them (``50035 Invalid Form Body``, ``BASE_TYPE_MAX_LENGTH``).

From Discord's API reference: an embed's title 256 characters, description 4,096, 25 fields of
a 256-character name and a 1,024-character value, footer 2,048, author name 256, and 6,000
characters over every embed of a message; five action rows in a message, five components in
an action row, a button's label 80 characters, a custom id 100; a select's 25 options of
100-character labels, values and descriptions, its placeholder 150; a channel's (a thread's)
name 100. ``problem`` returns the
path and message of the first broken limit, or None.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

EMBED_TITLE: Final = 256
EMBED_DESCRIPTION: Final = 4096
EMBED_FIELDS: Final = 25
FIELD_NAME: Final = 256
FIELD_VALUE: Final = 1024
FOOTER_TEXT: Final = 2048
AUTHOR_NAME: Final = 256
EMBEDS_TOTAL: Final = 6000
ROW_COMPONENTS: Final = 5
ACTION_ROWS: Final = 5
BUTTON_LABEL: Final = 80
CUSTOM_ID: Final = 100
SELECT_OPTIONS: Final = 25
OPTION_TEXT: Final = 100
PLACEHOLDER: Final = 150
CHANNEL_NAME: Final = 100

Problem = tuple[str, str]


def _over(path: str, value: Any, most: int) -> Iterator[Problem]:
    if value is not None and len(str(value)) > most:
        yield path, f"Must be {most} or fewer in length."


def message_problem(body: Mapping[str, Any]) -> Problem | None:
    """The first of the message's embeds or components over a limit."""
    return next(_embeds(body.get("embeds") or []), None) or next(
        _components(body.get("components") or []), None
    )


def name_problem(name: str) -> Problem | None:
    """A channel or thread name over 100 characters."""
    return next(_over("name", name, CHANNEL_NAME), None)


def _embeds(embeds: list[Any]) -> Iterator[Problem]:
    total = 0
    for n, embed in enumerate(embeds):
        at = f"embeds.{n}"
        yield from _over(f"{at}.title", embed.get("title"), EMBED_TITLE)
        yield from _over(f"{at}.description", embed.get("description"), EMBED_DESCRIPTION)
        yield from _over(f"{at}.footer.text", (embed.get("footer") or {}).get("text"), FOOTER_TEXT)
        yield from _over(f"{at}.author.name", (embed.get("author") or {}).get("name"), AUTHOR_NAME)
        fields = embed.get("fields") or []
        if len(fields) > EMBED_FIELDS:
            yield f"{at}.fields", f"Must be {EMBED_FIELDS} or fewer in length."
        for i, item in enumerate(fields):
            yield from _over(f"{at}.fields.{i}.name", item.get("name"), FIELD_NAME)
            yield from _over(f"{at}.fields.{i}.value", item.get("value"), FIELD_VALUE)
        total += _embed_size(embed)
    if total > EMBEDS_TOTAL:
        yield "embeds", f"Embed size exceeds maximum size of {EMBEDS_TOTAL}"


def _embed_size(embed: Mapping[str, Any]) -> int:
    texts = [
        embed.get("title"),
        embed.get("description"),
        (embed.get("footer") or {}).get("text"),
        (embed.get("author") or {}).get("name"),
    ]
    for item in embed.get("fields") or []:
        texts += [item.get("name"), item.get("value")]
    return sum(len(str(t)) for t in texts if t)


def _components(rows: list[Any]) -> Iterator[Problem]:
    if sum(1 for row in rows if row.get("type") == 1) > ACTION_ROWS:
        yield "components", f"Must be {ACTION_ROWS} or fewer in length."
    for n, row in enumerate(rows):
        if row.get("type") != 1:  # only legacy action rows are checked
            continue
        inner = row.get("components") or []
        if len(inner) > ROW_COMPONENTS:
            yield f"components.{n}.components", f"Must be {ROW_COMPONENTS} or fewer in length."
        for i, component in enumerate(inner):
            yield from _component(f"components.{n}.components.{i}", component)


def _component(at: str, component: Mapping[str, Any]) -> Iterator[Problem]:
    yield from _over(f"{at}.custom_id", component.get("custom_id"), CUSTOM_ID)
    yield from _over(f"{at}.label", component.get("label"), BUTTON_LABEL)
    yield from _over(f"{at}.placeholder", component.get("placeholder"), PLACEHOLDER)
    options = component.get("options") or []
    if len(options) > SELECT_OPTIONS:
        yield f"{at}.options", f"Must be {SELECT_OPTIONS} or fewer in length."
    for i, option in enumerate(options):
        for key in ("label", "value", "description"):
            yield from _over(f"{at}.options.{i}.{key}", option.get(key), OPTION_TEXT)
