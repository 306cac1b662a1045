"""Small helpers on ASCII text: word boundaries, anchored matches, and the validators
(Luhn, card brands, SSN, IBAN mod-97, IP addresses) candidates must pass.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Sequence

from bot.pii.scantext import WORD


def word_before(text: str, index: int) -> bool:
    return index > 0 and text[index - 1] in WORD


def word_at(text: str, index: int) -> bool:
    return index < len(text) and text[index] in WORD


def anchored_finditer(pattern: re.Pattern[str], text: str, anchor: str) -> Iterator[re.Match[str]]:
    """pattern.finditer(text) for a pattern whose every match starts with the character `anchor`.

    The regex engine scans for a literal prefix at about five instructions a character;
    str.find skips to a character with memchr, so for characters that are rare in logs
    ("@", "J", "+") the pass costs next to nothing. Each hit of the anchor costs a Python
    round trip, though: for letters as common as "g" or "k" the engine's own scan is cheaper.
    Lookbehinds still see the text before the match.
    """
    position = text.find(anchor)
    if position < 0:
        return  # before ``pattern.match``: an ``on_use`` pattern stays uncompiled
    find, match = text.find, pattern.match
    while position >= 0:
        found = match(text, position)
        if found is None:
            position = find(anchor, position + 1)
        else:
            yield found
            position = find(anchor, found.end())


def run_start(text: str, end: int, chars: frozenset[str], longest: int) -> int:
    """Start of the run of `chars` ending at `end`; -1 if it is empty or longer than `longest`."""
    start = end
    floor = max(0, end - longest - 1)
    while start > floor and text[start - 1] in chars:
        start -= 1
    if start == end or end - start > longest:
        return -1
    return start


def luhn_ok(digits: str) -> bool:
    """True if the digit string passes the Luhn checksum."""
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if index % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def card_brand_ok(digits: str, grouped: bool) -> bool:
    """True if the number has a card network's prefix and length.

    Runs without separators must be 13-16 digits long: the 17-19 digit runs of logs are
    mostly snowflake ids and epoch nanoseconds, which would pass Luhn one time in ten.
    """
    length = len(digits)
    if not grouped and length > 16:
        return False
    two = int(digits[:2])
    four = int(digits[:4])
    if digits[0] == "4":
        return length in (13, 16, 19)
    if 51 <= two <= 55 or 2221 <= four <= 2720:
        return length == 16
    if two in (34, 37):
        return length == 15
    if four == 6011 or two == 65 or 644 <= int(digits[:3]) <= 649 or two == 62:
        return 16 <= length <= 19
    if 3528 <= four <= 3589:
        return 16 <= length <= 19
    if 300 <= int(digits[:3]) <= 305 or two in (36, 38, 39):
        return 14 <= length <= 19
    return False


def ssn_ok(area: str, group: str, serial: str) -> bool:
    """True unless the SSN has an area, group or serial the SSA never issues."""
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


# Each country's IBAN length (ISO 13616 registry).
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22,
    "BH": 22, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20,
    "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "LY": 25, "MC": 27,
    "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15,
    "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
    "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28,
    "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}  # fmt: skip


def iban_ok(compact: str) -> bool:
    """True if the IBAN (no spaces, capitals) has its country's length and a valid mod-97."""
    if IBAN_LENGTHS.get(compact[:2]) != len(compact):
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(char, 36)) for char in rearranged)) % 97 == 1


def ipv4_ok(octets: Sequence[str]) -> bool:
    """True if the groups of 1-3 digits are an IPv4 address, as ipaddress would judge it.

    Access logs hold an address a line; ipaddress costs microseconds for each of them.
    """
    return all((octet[0] != "0" or octet == "0") and int(octet) <= 255 for octet in octets)


def ip_ok(candidate: str) -> bool:
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return False
    return True
