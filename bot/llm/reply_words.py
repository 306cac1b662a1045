"""What a person reads of a model's reply: its words, without the calls it wrote as text and
without its reasoning. Most replies hold no markup at all, and for those this module answers
alone; ``bot.llm.text_calls``, which reads the markup, is imported for one that might hold some
(``kestrel runs approve`` on a plain answer never loads its parsers)."""

from __future__ import annotations

from bot.domain import AssistantTurn


def may_hold_markup(text: str) -> bool:
    """Whether ``text`` holds a character that every call's markup and every reasoning block
    holds (a tag's ``<``, a list's ``[``, an object's ``{``): words without one hold none."""
    return "<" in text or "{" in text or "[" in text


def words(turn: AssistantTurn) -> str:
    """The turn's text without the calls it wrote as text: what a person reads of it, and what
    the model is sent back beside those calls (its template writes their markup again, so the
    markup sent too would show the model each call twice)."""
    text = turn.text or ""
    if not turn.calls or not text or not may_hold_markup(text):
        # A reply of calls alone, or of words beside the calls a server parsed (most turns
        # that call), holds no markup to take out.
        return text
    from bot.llm.text_calls import read

    written = read(text, {call.name for call in turn.calls})
    if [name for name, _ in written.calls] != [call.name for call in turn.calls]:
        return text  # the server parsed the calls: the text is the model's words
    return written.words


def shown(turn: AssistantTurn) -> str:
    """What a person reads of a reply: its words (``words``) after its reasoning, empty if
    it said nothing but its calls and its reasoning."""
    return after_reasoning(words(turn))


def after_reasoning(text: str) -> str:
    """What follows the reasoning a server without a reasoning parser leaves in a model's text
    (read as ``text_calls`` reads it), blanks around it dropped; the whole text without one."""
    if "<" not in text:  # every reasoning marker opens a tag
        return text
    from bot.llm.text_calls import thought_end

    start = thought_end(text)
    return text[start:].strip() if start else text
