"""A card's buttons and forms: ``DynamicItem``s registered at start-up and matched by their
custom id's template, so a card posted before a restart still works after it. Deny and Answer
open their form (a modal must be the first response); a submitted form is read back by the
client's ``on_interaction`` with ``FORM`` and ``form_text``."""

from __future__ import annotations

import re
from typing import Any

import discord

from adapters.discord import ids
from adapters.discord.respond import in_time, kestrel_of, say_store_failed
from bot.chat.contract import StoreError
from bot.chat.words import NOT_AN_OPTION, NOT_RECORDED, chosen_option
from bot.domain import DecisionKind

EFFECTS = {"retry": DecisionKind.RETRY, "done": DecisionKind.DONE, "failed": DecisionKind.FAILED}
FORM = re.compile(
    r"kestrel:(?P<form>deny|answer)_modal:(?P<req>[A-Za-z0-9][A-Za-z0-9_.-]{0,79}):\d+"
)


class _RequestButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=r"(?!)"):
    """A button that names one request (its decision and template are the subclass's)."""

    kind = DecisionKind.APPROVE
    id_kind = "approve"  # the custom id's kind: ``kestrel:NAME:REQUEST``

    def __init__(self, request_id: str) -> None:
        super().__init__(discord.ui.Button(custom_id=ids.custom_id(self.id_kind, request_id)))
        self.request_id = request_id

    @classmethod
    async def from_custom_id(
        cls,
        # discord.py fixes the signature; the request's id is all the custom id carries.
        interaction: discord.Interaction,  # noqa: ARG003
        item: discord.ui.Item[Any],  # noqa: ARG003
        match: re.Match[str],
    ) -> _RequestButton:
        return cls(match["req"])

    async def callback(self, interaction: discord.Interaction) -> None:
        await kestrel_of(interaction).decide(interaction, self.request_id, self.kind)


class ApproveButton(_RequestButton, template=ids.APPROVE):
    """Approve once."""

    kind = DecisionKind.APPROVE
    id_kind = "approve"


class ApproveRunButton(_RequestButton, template=ids.APPROVE_RUN):
    """Approve this tool for the rest of the run."""

    kind = DecisionKind.APPROVE_ALWAYS
    id_kind = "approve_run"


class StepByStepButton(_RequestButton, template=ids.STEP_BY_STEP):
    """A plan: approve none of it now, ask for each call."""

    kind = DecisionKind.STEP_BY_STEP
    id_kind = "step_by_step"


class DenyButton(_RequestButton, template=ids.DENY):
    """Deny, with an optional reason asked in a modal."""

    kind = DecisionKind.DENY
    id_kind = "deny"

    async def callback(self, interaction: discord.Interaction) -> None:
        await kestrel_of(interaction).ask_first(interaction, self.request_id, self.kind)


class AnswerButton(_RequestButton, template=ids.ANSWER):
    """Answer a free-text question in a modal."""

    kind = DecisionKind.ANSWER
    id_kind = "answer"

    async def callback(self, interaction: discord.Interaction) -> None:
        await kestrel_of(interaction).ask_first(interaction, self.request_id, self.kind)


class ArgumentsButton(_RequestButton, template=ids.ARGUMENTS):
    """Full arguments: what a card cut, shown whole to the clicker; decides nothing."""

    id_kind = "arguments"

    async def callback(self, interaction: discord.Interaction) -> None:
        await kestrel_of(interaction).show_arguments(interaction, self.request_id)


class ChooseButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=ids.CHOOSE):
    """One option of a question (a button ``…:N``, or a menu ``…:mN``'s chosen value)."""

    def __init__(self, request_id: str, index: int | None, menu: int = 0) -> None:
        extra = f"m{menu}" if index is None else str(index)
        super().__init__(discord.ui.Button(custom_id=ids.custom_id("choose", request_id, extra)))
        self.request_id = request_id
        self.index = index

    @classmethod
    async def from_custom_id(
        cls,
        # discord.py fixes the signature; the request's id is all the custom id carries.
        interaction: discord.Interaction,  # noqa: ARG003
        item: discord.ui.Item[Any],  # noqa: ARG003
        match: re.Match[str],
    ) -> ChooseButton:
        if match["n"] is not None:
            return cls(match["req"], int(match["n"]))
        return cls(match["req"], None, int(match["menu"]))

    async def callback(self, interaction: discord.Interaction) -> None:
        client = kestrel_of(interaction)
        index = self.index
        if index is None:  # the select menu: the chosen value is the index
            data: dict[str, Any] = dict(interaction.data or {})
            values = data.get("values") or []
            chosen = str(values[0]) if values else ""
            index = int(chosen) if re.fullmatch(r"[0-9]{1,3}", chosen) else -1
        # Only the option's text is read here; where the click came from is checked (and a
        # refusal audited) as the answer is decided, as for any button of the card.
        try:
            view = await client.chat.request(self.request_id)
        except StoreError as exc:
            await say_store_failed(interaction, "an option", exc, NOT_RECORDED)
            return
        option = chosen_option(view.request.options if view else (), index)
        if option is None:
            await in_time(
                interaction, interaction.response.send_message(NOT_AN_OPTION, ephemeral=True)
            )
            return
        await client.decide(interaction, self.request_id, DecisionKind.ANSWER, option)


class EffectButton(discord.ui.DynamicItem[discord.ui.Button[Any]], template=ids.EFFECT):
    """Retry, Mark done or Mark failed on an uncertain effect."""

    def __init__(self, request_id: str, verb: str) -> None:
        custom_id = ids.custom_id("effect", request_id, verb)
        super().__init__(discord.ui.Button(custom_id=custom_id))
        self.request_id = request_id
        self.verb = verb

    @classmethod
    async def from_custom_id(
        cls,
        # discord.py fixes the signature; the request's id is all the custom id carries.
        interaction: discord.Interaction,  # noqa: ARG003
        item: discord.ui.Item[Any],  # noqa: ARG003
        match: re.Match[str],
    ) -> EffectButton:
        return cls(match["req"], match["verb"])

    async def callback(self, interaction: discord.Interaction) -> None:
        kind = EFFECTS[self.verb]
        await kestrel_of(interaction).decide(interaction, self.request_id, kind)


# --- the forms --------------------------------------------------------------------------


class ReasonModal(discord.ui.Modal, title="Deny"):
    """Deny with an optional reason the model reads (its submission: ``on_interaction``)."""

    reason: discord.ui.TextInput[Any] = discord.ui.TextInput(
        label="Reason (optional)",
        style=discord.TextStyle.paragraph,
        required=False,
        max_length=1000,
    )

    def __init__(self, request_id: str, user: int) -> None:
        super().__init__(custom_id=f"{ids.DENY_MODAL}:{request_id}:{user}")
        self.request_id = request_id


class AnswerModal(discord.ui.Modal, title="Answer"):
    """Answer a free-text question (its submission: ``on_interaction``)."""

    answer: discord.ui.TextInput[Any] = discord.ui.TextInput(
        label="Your answer", style=discord.TextStyle.paragraph, max_length=2000
    )

    def __init__(self, request_id: str, user: int) -> None:
        super().__init__(custom_id=f"{ids.ANSWER_MODAL}:{request_id}:{user}")
        self.request_id = request_id


def form_text(data: dict[str, Any]) -> str:
    """The text typed in a submitted form (action rows or labels around the text input)."""
    for row in data.get("components") or []:
        inner = row.get("components") or ([row["component"]] if "component" in row else [])
        for component in inner:
            if "value" in component:
                return str(component["value"] or "").strip()
    return ""
