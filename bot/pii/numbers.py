"""Numbers: with separators (cards, SSNs, phones, IPv4), runs without them (cards, IBANs)
found in the shape of the text, and IPv6 found from its first colon.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from bot.patterns import finditer_with, on_use, on_use_written
from bot.pii.checks import (
    IBAN_LENGTHS,
    anchored_finditer,
    card_brand_ok,
    iban_ok,
    ip_ok,
    ipv4_ok,
    luhn_ok,
    run_start,
    ssn_ok,
    word_at,
    word_before,
)
from bot.pii.scantext import HEX, WORD, PiiHit, ScanText

_Group = int | tuple[int, int]

# Digit groups after the first one, per separator. A tail must name a real format: dates
# (4-2-2), versions (1-2-2) and times never match, so the regex fails without calling Python.
_CARD_TAILS: tuple[tuple[_Group, ...], ...] = ((4, 4, 4, 3), (4, 4, 4), (6, 5), (6, 4))
_EU_TAILS: tuple[tuple[_Group, ...], ...] = (
    (2, 2, 2, 2),
    (4, 4),
    (3, 4),
    (4, 3),
    (3, 3),
    ((5, 9),),
)
_US_TAILS: tuple[tuple[_Group, ...], ...] = ((3, 3, 4), (3, 4))
_SSN_TAILS: tuple[tuple[_Group, ...], ...] = ((2, 4),)
_IPV4_TAILS: tuple[tuple[_Group, ...], ...] = (((1, 3), (1, 3), (1, 3)),)


def _lengths(group: _Group) -> range:
    return range(group[0], group[1] + 1) if isinstance(group, tuple) else range(group, group + 1)


def _trie(words: Iterable[str], sep: str) -> str:
    """A regex of `words` ("d" a digit, as "0" in the shape; "s" the separator) as a trie.

    A flat alternation makes the engine retry a dozen formats at every date or UUID;
    the trie reads each character once and fails at the first one no format allows.
    """
    root: dict[str, dict[str, Any]] = {}
    for word in words:
        node = root
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        parts = [
            ("0" if key == "d" else sep) + emit(node[key]) for key in ("d", "s") if key in node
        ]
        if "" in node:
            parts.append("")
        return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"

    return emit(root)


def _family(sep: str, tails: Iterable[tuple[_Group, ...]]) -> re.Pattern[bytes]:
    """A regex for the shape of the text, anchored on the first `sep` of a number and matching
    one of the `tails` after it; written and compiled when first used (a text holding no
    separated digits, as most do, needs neither).
    """
    return on_use_written(lambda: _family_source(sep, tails))


def _family_source(sep: str, tails: Iterable[tuple[_Group, ...]]) -> bytes:
    """``_family``'s regex.

    In the shape every digit is "0", so the regex starts with the two-character literal
    `sep` "0": the engine's prefix search skips the separators of ordinary text ("a - b",
    prose spaces, the dots of host names) without entering the matcher, and the trie
    compares literals instead of classes.
    """
    escaped = re.escape(sep)
    words = set()
    for tail in tails:
        for lengths in itertools.product(*map(_lengths, tail)):
            words.add("s".join("d" * length for length in lengths)[1:])
    # The second branch takes any other run with at least seven more digits: a card in an
    # odd grouping ("41 11 11 ...", "4111.1111.1111.1111"), judged in Python; ``glued`` when
    # its last group starts a word ("... 0004 3rd"), which Python leaves out.
    return (
        rf"{escaped}0(?<=0{escaped}0)(?:{_trie(words, escaped)}"
        rf"(?![0-9A-Za-z_]|{escaped}0)"
        rf"|{f'{escaped}?0' * 6}(?P<run>0*+(?:{escaped}0++)*+)(?P<glued>(?=[A-Za-z_]))?)"
    ).encode()


_DASH = _family("-", _CARD_TAILS + _EU_TAILS + _US_TAILS + _SSN_TAILS)
# Two-group dotted numbers are left out: 3.510216 and every other long decimal would match.
_DOT = _family(".", _IPV4_TAILS + _EU_TAILS[:-1] + _US_TAILS)
_SPACE = _family(" ", _CARD_TAILS + _EU_TAILS + _SSN_TAILS)
# Each family with its separator: what ``find_separated_numbers`` searches, and the runs of the
# shape (a digit, the separator, a digit) its recognizer's gate needs.
SEPARATED: Final = ((_DASH, "-"), (_DOT, "."), (_SPACE, " "))
_CARD_SIGNATURES = frozenset({(4, 4, 4, 4), (4, 4, 4, 4, 3), (4, 6, 5), (4, 6, 4)})


def _us_phone(groups: Sequence[str]) -> bool:
    if len(groups) == 4 and groups[0] == "1":
        groups = groups[1:]
    # NANP area codes never start with 0 or 1; exchanges are not checked, since the
    # 555-123-4567 of examples and test data is what people write.
    return tuple(map(len, groups)) == (3, 3, 4) and groups[0][0] not in "01"


def _eu_phone(groups: Sequence[str]) -> bool:
    """A national number with a trunk 0 (020 7946 0958, 06-12345678, 01 23 45 67 89)."""
    first = groups[0]
    total = sum(map(len, groups))
    return (
        2 <= len(first) <= 5
        and first[0] == "0"
        and first[1] != "0"
        and 9 <= total <= 12
        and all(len(group) >= 2 for group in groups)
    )


def _classify(groups: Sequence[str], sep: str) -> str | None:
    """The entity a separated number is, if any."""
    signature = tuple(map(len, groups))
    if signature == (3, 2, 4) and sep != ".":
        return "US_SSN" if ssn_ok(*groups) else None
    if signature in _CARD_SIGNATURES and sep != ".":
        digits = "".join(groups)
        if card_brand_ok(digits, grouped=True) and luhn_ok(digits):
            return "CREDIT_CARD"
        return None
    if sep == "." and len(groups) == 4 and max(signature) <= 3:
        return "IP_ADDRESS" if ipv4_ok(groups) else None
    if sep != " " and _us_phone(groups):
        return "PHONE_NUMBER"
    return "PHONE_NUMBER" if _eu_phone(groups) else None


def _odd_card(groups: Sequence[str]) -> str | None:
    """CREDIT_CARD if the groups, however cut, spell a valid card number."""
    digits = "".join(groups)
    if len(groups) < 3 or not 13 <= len(digits) <= 19 or max(map(len, groups)) > 6:
        return None  # two groups: a decimal (3.7123456789012) or two numbers of a table
    return "CREDIT_CARD" if card_brand_ok(digits, grouped=True) and luhn_ok(digits) else None


# "version 10.2.3.4" and "kernel: 5.15.0.1" name versions, whatever they look like.
_VERSION_LABEL = on_use(
    r"(?:version|release|firmware|kernel|build|driver|ver)[\"']?[ \t]*[:=]?[ \t]*[\"']?\Z"
)


def _is_version(text: str, start: int) -> bool:
    return _VERSION_LABEL.search(text[max(0, start - 16) : start].lower()) is not None


_SHORTEST_CARD = 16  # 4-6-4 with its separators: the shortest card grouping


def _cards_inside(text: str, start: int, end: int, sep: str) -> Iterator[PiiHit]:
    """Cards written in a card's grouping inside a longer run of digit groups.

    A time, a quantity or a year beside a card joins its run ("12:00:01 4111 1111 1111 1111",
    "4111 1111 1111 1111 2024"), and the run as a whole is no card. Only whole groups in one
    of the card groupings (4-4-4-4, 4-4-4-4-3, 4-6-5, 4-6-4) are tried, with the network
    prefix and Luhn checks, so runs of ordinary numbers stay as they are.
    """
    groups = text[start:end].split(sep)
    lengths = [len(group) for group in groups]
    offsets = list(itertools.accumulate((length + 1 for length in lengths), initial=start))
    index = 0
    while index < len(groups):
        found = 0
        if lengths[index] == 4:
            for size in (5, 4, 3):  # the longest grouping first: 19 digits before 16
                if len(lengths) - index < size:
                    continue
                if tuple(lengths[index : index + size]) in _CARD_SIGNATURES:
                    digits = "".join(groups[index : index + size])
                    if card_brand_ok(digits, grouped=True) and luhn_ok(digits):
                        found = size
                        break
        if found:
            yield PiiHit("CREDIT_CARD", offsets[index], offsets[index + found] - 1)
            index += found
        else:
            index += 1


def _separated(src: ScanText, pattern: re.Pattern[bytes], sep: str) -> Iterator[PiiHit]:
    text, shape = src.text, src.shape
    # A word character before the leading digits, "+" (an international number) or "." or
    # the separator itself (part of a longer dotted or dashed id); a space may start a number.
    rejected = WORD | {"+", "."} | ({sep} - {" "})
    # Dotted runs are versions, addresses and OIDs: no card is looked for inside them.
    inside = _cards_inside if sep != "." else None
    # Every match starts after a digit, its separator and a digit (the family's lookbehind):
    # "exit status 0" compiles no family.
    for match in finditer_with(pattern, shape, f"0{sep}0".encode()):
        at, end = match.span()
        odd = match.lastindex is not None  # only the odd-grouping branch has groups
        if odd and match.group("glued") is not None:
            end = text.rfind(sep, at, end)  # the last group is a word's ("3rd"), not a number's
            if end <= at:
                continue
        # The leading digit group, read backwards in the shape: one C call, not a loop.
        longest = 6 if odd else 5
        window = shape[max(0, at - longest - 1) : at]
        start = at - (len(window) - len(window.rstrip(b"0")))
        # A leading group too long for a number, or glued to a word or a longer id, is not
        # part of one; a card may still follow it ("card2 4111 1111 1111 1111").
        glued = at - start > longest or (
            start > 0
            and (
                text[start - 1] in rejected
                or (text[start - 1] == "/" and word_before(text, start - 1))  # Chrome/124.0
            )
        )
        if glued:
            if inside is not None and end - at > _SHORTEST_CARD:
                yield from inside(text, at + 1, end, sep)
            continue
        groups = text[start:end].split(sep)
        kind = _odd_card(groups) if odd else _classify(groups, sep)
        if kind == "IP_ADDRESS" and _is_version(text, start):
            continue
        if kind:
            yield PiiHit(kind, start, end)
        elif inside is not None and end - start >= _SHORTEST_CARD:
            yield from inside(text, start, end, sep)


def find_separated_numbers(src: ScanText) -> Iterator[PiiHit]:
    """Cards, SSNs, US/EU phones and IPv4 addresses written with - . or space separators."""
    for pattern, sep in SEPARATED:
        yield from _separated(src, pattern, sep)


_PAREN_PHONE = on_use(
    r"\((?<![0-9A-Za-z_]\()(?P<area>[0-9]{2,5})\)[ -]?"
    r"(?P<rest>[0-9]{2,8}(?:[ .-][0-9]{2,8}){0,2})(?![0-9A-Za-z_]|[ .-][0-9])"
)
_NOT_DIGIT = on_use(r"[^0-9]")


def find_paren_phones(src: ScanText) -> Iterator[PiiHit]:
    """Phones with the area code in parentheses: (555) 123-4567, (030) 1234567."""
    for match in finditer_with(_PAREN_PHONE, src.text, "("):
        area = match.group("area")
        groups = [area, *_NOT_DIGIT.split(match.group("rest"))]
        if (len(area) == 3 and _us_phone(groups)) or _eu_phone(groups):
            yield PiiHit("PHONE_NUMBER", match.start(), match.end())


_INTL_PHONE = on_use(
    r"\+(?<![0-9A-Za-z_+]\+)[1-9][0-9]*+"
    r"(?:[ .-]?\((?P<trunk>0)\)[ .-]?[0-9]++|[ .-]?\([0-9]{1,4}\)[ .-]?[0-9]++|[ .-][0-9]++)*+"
    r"(?![0-9A-Za-z_])"
)


def find_intl_phones(src: ScanText) -> Iterator[PiiHit]:
    """International numbers: +44 20 7946 0958, +1-555-123-4567, +4915112345678."""
    for match in anchored_finditer(_INTL_PHONE, src.text, "+"):
        digits = sum(char.isdigit() for char in match.group()) - (1 if match.group("trunk") else 0)
        if 8 <= digits <= 15:
            yield PiiHit("PHONE_NUMBER", match.start(), match.end())


# ---------------------------------------------------------------------------------------------
# Runs without separators, searched in the shape of the text


CARD_RUN_START: Final = b"0" * 13  # in the shape: thirteen digits, a card run's least
IBAN_START: Final = b"AA00"  # in the shape: a country's two capitals, then two check digits
# Written out: a repeat like 0{13} would not give the regex engine a literal prefix to skip to.
_CARD_RUN = on_use(rb"0000000000000(?<![0-9A-Za-z_.]0000000000000)0{0,3}(?![0-9A-Za-z_])")


def find_card_runs(src: ScanText) -> Iterator[PiiHit]:
    """Card numbers written as one run of 13-16 digits."""
    text = src.text
    for match in finditer_with(_CARD_RUN, src.shape, CARD_RUN_START):
        start, end = match.span()
        # Every card network starts with 2-6; the epoch milliseconds of JSON logs start with 1.
        if text[start] not in "23456":
            continue
        digits = text[start:end]
        if card_brand_ok(digits, grouped=False) and luhn_ok(digits):
            yield PiiHit("CREDIT_CARD", start, end)


_IBAN_RUN = on_use(rb"AA00(?<![0-9A-Za-z_]AA00)(?: ?[A0]{4}){2,7}(?: ?[A0]{1,4})?")


def find_ibans(src: ScanText) -> Iterator[PiiHit]:
    """IBANs, compact or in groups of four, cut to their country's length and mod-97 checked."""
    text = src.text
    for match in finditer_with(_IBAN_RUN, src.shape, IBAN_START):
        length = IBAN_LENGTHS.get(text[match.start() : match.start() + 2])
        if length is None:
            continue
        end, kept = match.start(), 0
        while kept < length and end < match.end():
            kept += text[end] != " "
            end += 1
        compact = text[match.start() : end].replace(" ", "")
        if kept == length and not word_at(text, end) and iban_ok(compact):
            yield PiiHit("IBAN_CODE", match.start(), end)


# ---------------------------------------------------------------------------------------------
# IPv6, found from its first colon


# The lookahead demands what every IPv6 address has, "::" or seven colons, so the colons of
# times and "key: value" fail inside the regex engine. The seven colons are written out: a
# repeated group costs the engine an allocation at every colon of the text.
_SEVEN_COLONS = "[0-9A-Fa-f]{1,4}:" * 6 + "[0-9A-Fa-f]"
_IPV6_REST = r"[0-9A-Fa-f:]++(?:\.[0-9]{1,3}){0,3}(?:%[0-9A-Za-z]{1,15})?"
_IPV6_TAIL = on_use(rf":(?=:|[0-9A-Fa-f:]{{0,40}}::|{_SEVEN_COLONS}){_IPV6_REST}")
# The same where the text has no "::" (most logs): its first two branches cannot hold, and
# trying them at every colon (a digest after "sha256:" is 40 characters of backtracking) is
# much of the recognizer's cost.
_IPV6_FULL_TAIL = on_use(rf":(?={_SEVEN_COLONS}){_IPV6_REST}")


def find_ipv6(src: ScanText) -> Iterator[PiiHit]:
    """IPv6 addresses, full or compressed, validated by ipaddress."""
    text = src.text
    pattern = _IPV6_TAIL if "::" in text else _IPV6_FULL_TAIL
    for match in finditer_with(pattern, text, ":"):
        start = run_start(text, match.start(), HEX, 4)
        if start < 0:
            start = match.start()
        if start > 0 and (text[start - 1] in WORD or text[start - 1] in ":."):
            continue
        end = match.end()
        if ip_ok(text[start:end]):
            yield PiiHit("IP_ADDRESS", start, end)
        elif text[end - 1] == ":" and text[end - 2] != ":" and ip_ok(text[start : end - 1]):
            yield PiiHit("IP_ADDRESS", start, end - 1)
