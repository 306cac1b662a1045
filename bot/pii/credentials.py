"""Secrets found from a literal prefix: cloud and API keys, tokens, webhooks, JWTs, private
keys (``labelled.py`` finds those known by their labels)."""

from __future__ import annotations

import re
import string
from collections.abc import Iterator

from bot.patterns import finditer_with, on_use
from bot.pii.checks import anchored_finditer, run_start
from bot.pii.encoded import decode_base64
from bot.pii.scantext import BASE64_CHARS, PiiHit, ScanText

_A_KEYS = on_use(
    r"A(?<![0-9A-Za-z_]A)(?:"
    r"(?P<aws>(?:KIA|SIA|BIA|CCA)[A-Z2-7]{16})(?![0-9A-Za-z])"
    r"|(?P<google>Iza[0-9A-Za-z_-]{35})(?![0-9A-Za-z_-]))"
)


# A 40-character secret access key, unlabelled, next to its key id (a credentials CSV,
# "aws configure" answers, two env values pasted on one line).
_AWS_SECRET_SHAPE = on_use(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
_AWS_PAIR_REACH = 256


def _aws_secrets_near(text: str, start: int, end: int) -> Iterator[PiiHit]:
    """The secret access keys within reach of the access key id at [start, end)."""
    low, high = max(0, start - _AWS_PAIR_REACH), min(len(text), end + _AWS_PAIR_REACH)
    for match in _AWS_SECRET_SHAPE.finditer(text, low, high):
        if match.end() == high and high < len(text) and text[high] in BASE64_CHARS:
            continue  # a longer run cut by the window
        key = match.group()
        # Generated keys mix cases; a git sha or a hex digest of the same length does not.
        if not key.islower() and not key.isupper() and not key.isalpha():
            yield PiiHit("AWS_SECRET_KEY", match.start(), match.end())


def find_a_keys(src: ScanText) -> Iterator[PiiHit]:
    """AWS access key ids (AKIA/ASIA...) with any secret key beside them, Google API keys."""
    text = src.text
    for match in anchored_finditer(_A_KEYS, text, "A"):
        if match.group("aws"):
            yield PiiHit("AWS_ACCESS_KEY", match.start(), match.end())
            yield from _aws_secrets_near(text, match.start(), match.end())
        else:
            yield PiiHit("GOOGLE_API_KEY", match.start(), match.end())


_GITHUB = on_use(
    r"g(?<![0-9A-Za-z_]g)(?:h[pousr]_[A-Za-z0-9]{36,251}+|ithub_pat_[A-Za-z0-9_]{22,255}+)"
    r"(?![A-Za-z0-9_])"
)


def find_github(src: ScanText) -> Iterator[PiiHit]:
    """GitHub tokens: ghp_, gho_, ghu_, ghs_, ghr_ and fine-grained github_pat_."""
    for match in finditer_with(_GITHUB, src.text, "gh", "github_pat_"):
        yield PiiHit("GITHUB_TOKEN", match.start(), match.end())


# Anchored on "k" so "sk-", "sk_live_" and "rk_live_" share one pass that skips to a rare letter.
# GitLab's tokens by prefix: personal, deploy, runner (and its router), trigger, feed, OAuth
# app, feature flags client and others; and a runner's legacy registration token.
_GITLAB_KINDS = (
    "pat",
    "dt",
    "rt",
    "rtr",
    "ptt",
    "ft",
    "ffct",
    "soat",
    "cbt",
    "oas",
    "imt",
    "agent",
)
_GITLAB = on_use(
    rf"g(?<![0-9A-Za-z_]g)l(?:{'|'.join(_GITLAB_KINDS)})-[A-Za-z0-9_.-]{{20,}}+"
    r"|G(?<![0-9A-Za-z_]G)R1348941[A-Za-z0-9_-]{20,}+"
)
# Whether a text holds a prefix: one regex search, which skips to "gl" in C, where a search of
# the text for each of the thirteen prefixes cost 27 ms of a 4 MB scan's 190.
_GITLAB_PREFIX = on_use(rf"gl(?:{'|'.join(_GITLAB_KINDS)})-")


def find_gitlab(src: ScanText) -> Iterator[PiiHit]:
    """GitLab tokens: glpat- (personal), gldt- (deploy), glrt- (runner), their kin and a
    runner's legacy registration token (GR1348941...)."""
    text = src.text
    # "gl" first: a prompt without it compiles nothing.
    if not (("gl" in text and _GITLAB_PREFIX.search(text)) or "GR1348941" in text):
        return
    for match in _GITLAB.finditer(text):
        end = match.end()
        while text[end - 1] in ".-":
            end -= 1  # a sentence's full stop, a dash after the token
        yield PiiHit("GITLAB_TOKEN", match.start(), end)


# The tokens of package registries and of services that a deploy or a CI job holds, each found
# from its prefix. npm's: npm_, then 36 base62 characters (the last six a CRC32 checksum).
# PyPI's: a macaroon in base64url whose first bytes name where it is valid, pypi.org or
# test.pypi.org, so every token starts with one of two strings; 70 characters or more follow.
# SendGrid's: SG., a 22-character key id, a dot and a 43-character secret. Hugging Face's:
# hf_, then 34 letters (30 to 40 letters and digits are taken). npm_config_cache and
# hf_hub_download are names: an underscore in or after the body rules them out, and a body of
# small letters alone is a word, not a token.
_NPM = on_use(r"npm_(?<![0-9A-Za-z_]npm_)(?P<body>[A-Za-z0-9]{36})(?![A-Za-z0-9_])")
_PYPI = on_use(r"pypi-AgE(?:IcHlwaS5vcmc|NdGVzdC5weXBpLm9yZw)[A-Za-z0-9_-]{70,}+")
_SENDGRID = on_use(
    r"SG\.(?<![0-9A-Za-z_]SG\.)[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])"
)
_HUGGING_FACE = on_use(r"hf_(?<![0-9A-Za-z_]hf_)(?P<body>[A-Za-z0-9]{30,40}+)(?![A-Za-z0-9_])")


def _not_a_word(body: str) -> bool:
    """True if the body holds a digit or a capital: a name in lower case ("npm_" or "hf_" and
    a long word) is not a generated token."""
    return not (body.isalpha() and body.islower())


def find_service_tokens(src: ScanText) -> Iterator[PiiHit]:
    """npm and PyPI tokens, SendGrid API keys and Hugging Face tokens. One recognizer for the
    four: a text that has none of their prefixes costs four searches in C and one call."""
    text = src.text
    if "npm_" in text:
        for match in _NPM.finditer(text):
            if _not_a_word(match.group("body")):
                yield PiiHit("NPM_TOKEN", match.start(), match.end())
    if "pypi-AgE" in text:
        for match in _PYPI.finditer(text):
            yield PiiHit("PYPI_TOKEN", match.start(), match.end())
    if "SG." in text:
        for match in _SENDGRID.finditer(text):
            yield PiiHit("SENDGRID_API_KEY", match.start(), match.end())
    if "hf_" in text:
        for match in _HUGGING_FACE.finditer(text):
            if _not_a_word(match.group("body")):
                yield PiiHit("HUGGINGFACE_TOKEN", match.start(), match.end())


_K_KEYS = on_use(
    r"k(?<=[sr]k)(?<![0-9A-Za-z_-][sr]k)(?:"
    r"(?<=sk)-(?P<openai>[A-Za-z0-9_-]{32,}+)"
    r"|_(?:live|test)_(?P<stripe>[A-Za-z0-9]{16,}+)(?![A-Za-z0-9_]))"
)


def looks_random(token: str) -> bool:
    """True if the token mixes capitals, small letters and digits, as generated keys do."""
    return (
        any(char.isdigit() for char in token)
        and any(char.isupper() for char in token)
        and any(char.islower() for char in token)
    )


_LOWER_HEX = frozenset("0123456789abcdef")


def _hex_key(token: str) -> bool:
    """True if the token ends in 32 or more hex digits, letters and digits mixed: the keys of
    other OpenAI-compatible endpoints (sk-<hex>, sk-or-v1-<hex>) are not in mixed case."""
    tail = token.rpartition("-")[2]
    return (
        len(tail) >= 32
        and set(tail) <= _LOWER_HEX
        and not tail.isdigit()
        and any(char.isdigit() for char in tail)
    )


def find_k_keys(src: ScanText) -> Iterator[PiiHit]:
    """OpenAI keys (sk-, sk-proj-...), the hex keys of other OpenAI-compatible endpoints, and
    Stripe secret or restricted keys (sk_/rk_live_...)."""
    for match in finditer_with(_K_KEYS, src.text, "k-", "k_"):
        if match.group("stripe"):
            yield PiiHit("STRIPE_KEY", match.start() - 1, match.end())
        elif looks_random(match.group("openai")) or _hex_key(match.group("openai")):
            yield PiiHit("OPENAI_API_KEY", match.start() - 1, match.end())


# A rotating token keeps its xoxe. prefix; a browser's session cookie (xoxd-) is base64,
# URL-encoded (in either case) or decoded (a browser's cookie view: / + and =).
_SLACK = on_use(
    r"x(?<![0-9A-Za-z_-]x)(?:"
    r"oxd-[A-Za-z0-9-]{10,}+(?:(?:%[0-9A-Fa-f]{2}|[/+])[A-Za-z0-9-]*+)*+=*+"
    r"|(?:oxe\.x)?+(?:ox[abcdeoprs]|app)-[A-Za-z0-9-]{10,}+)"
)


def find_slack(src: ScanText) -> Iterator[PiiHit]:
    """Slack tokens: xoxb-, xoxp-, xoxa-, xoxe-, xoxo-, xoxr-, xoxs-, a browser's xoxc- and
    its d cookie xoxd-, and app tokens xapp-."""
    text = src.text
    for match in finditer_with(_SLACK, text, "xox", "xapp-"):
        end = match.end()
        while text[end - 1] == "-":
            end -= 1
        if any(char.isdigit() for char in text[match.start() + 5 : end]):
            yield PiiHit("SLACK_TOKEN", match.start(), end)


# An incoming webhook's URL is its credential (whoever holds it posts to the channel): Slack's
# last path part, Discord's token after the webhook's id. Its slashes may come JSON-escaped
# (PHP's json_encode writes https:\/\/hooks.slack.com\/services\/...).
_SLACK_WEBHOOK = on_use(
    r"hooks\.slack\.com\\?/(?:services|workflows|triggers)\\?/(?:[A-Za-z0-9]+\\?/){2,3}"
    r"(?P<secret>[A-Za-z0-9]{16,}+)"
)
_DISCORD_WEBHOOK = on_use(
    r"discord(?:app)?\.com\\?/api\\?/(?:v[0-9]+\\?/)?webhooks\\?/[0-9]{17,20}\\?/"
    r"(?P<secret>[A-Za-z0-9_-]{20,}+)"
)


def find_webhooks(src: ScanText) -> Iterator[PiiHit]:
    """The secret part of a Slack or Discord incoming webhook's URL."""
    text = src.text
    for pattern, entity, literals in (
        (_SLACK_WEBHOOK, "SLACK_TOKEN", ("hooks.slack.com/", "hooks.slack.com\\/")),
        (_DISCORD_WEBHOOK, "DISCORD_TOKEN", ("/webhooks/", "\\/webhooks\\/")),
    ):
        for match in finditer_with(pattern, text, *literals):
            if len(set(match.group("secret"))) > 4:  # a placeholder repeats one or two characters
                yield PiiHit(entity, *match.span("secret"))


# A Discord bot token: the bot's id in base64 (its first digit makes an M, N or O), a timestamp
# and an HMAC, joined by dots. Found from the timestamp: a pattern that starts with a literal
# "." is searched in C, where one that starts with a lookbehind is tried at every character.
# The id must decode to a 17-20 digit snowflake: that keeps dotted words and base64 text out.
_DISCORD_TAIL = on_use(r"\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{25,}+")
_DISCORD_CHARS = frozenset(string.ascii_letters + string.digits + "_-")


def find_discord(src: ScanText) -> Iterator[PiiHit]:
    """Discord bot tokens (the HMAC is the secret part; the id before it is public)."""
    text = src.text
    for tail in finditer_with(_DISCORD_TAIL, text, "."):
        start = run_start(text, tail.start(), _DISCORD_CHARS, 27)
        if start < 0 or tail.start() - start < 23 or text[start] not in "MNO":
            continue
        snowflake = decode_base64(text[start : tail.start()], shortest=17)
        if snowflake is not None and snowflake.isdigit() and len(snowflake) <= 20:
            yield PiiHit("DISCORD_TOKEN", start, tail.end())


# Anchored on the capital J of "eyJ" (base64 of '{"'), much rarer than its "e".
_JWT = on_use(
    r"J(?<=eyJ)(?<![0-9A-Za-z_-]eyJ)[A-Za-z0-9_-]{8,}+\.eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]*+"
)


# An encrypted JWT (JWE, compact): its header, an encrypted key (empty for "dir"), an IV, the
# ciphertext and a tag. Only the header is JSON; it names the encryption ("enc").
_JWE = on_use(
    r"J(?<=eyJ)(?<![0-9A-Za-z_-]eyJ)(?P<header>[A-Za-z0-9_-]{8,}+)\.[A-Za-z0-9_-]*+"
    r"\.[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+(?![A-Za-z0-9_.-])"
)


def find_jwt(src: ScanText) -> Iterator[PiiHit]:
    """JSON Web Tokens: three base64url segments, header and payload starting with eyJ; and
    encrypted ones, five segments whose header names an "enc"."""
    for match in anchored_finditer(_JWT, src.text, "J"):
        yield PiiHit("JWT", match.start() - 2, match.end())
    for match in anchored_finditer(_JWE, src.text, "J"):
        header = decode_base64("eyJ" + match.group("header"), shortest=2)
        if header is not None and '"enc"' in header:
            yield PiiHit("JWT", match.start() - 2, match.end())


# RFC 4716's form (PuTTYgen's and ssh-keygen -e's SSH2 keys) has four dashes and blanks.
_PEM_BEGIN = on_use(
    r"----(?:-BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    r"| BEGIN SSH2 ENCRYPTED PRIVATE KEY ----)"
)
_PEM_END = on_use(
    r"----(?:-END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----| END SSH2 ENCRYPTED PRIVATE KEY ----)"
)
# A block cut short (head -c, a truncated log line) is covered through its last base64 or
# header line; lines end with real newlines or JSON-escaped ones (read as "\ ", see ScanText).
_PEM_BODY = on_use(
    r"(?:(?:\r?\n|(?:\\ )?\\ )[ \t]*(?:[A-Za-z0-9+/=]++|[A-Za-z][A-Za-z-]*:[^\r\n\\]*+)?[ \t]*"
    r"(?=\r?\n|\\ |\"|\Z))*+"
)
_PEM_REACH = 65536  # a private key block is a few KB; an END farther away belongs to another


# A PuTTY key file (.ppk) gives its private part as "Private-Lines: N", N lines of base64 and
# a Private-MAC line; the public part before it is not secret.
_PUTTY_PRIVATE = on_use(
    r"Private-Lines:[ \t]*(?P<count>[0-9]{1,3})\r?\n(?P<body>(?:[A-Za-z0-9+/=]++\r?\n)+?)"
    r"(?:(?P<mac>Private-MAC:[ \t]*[0-9a-fA-F]++)|(?=[^A-Za-z0-9+/=]|\Z))"
)


def _putty_private_keys(text: str) -> Iterator[PiiHit]:
    """The private lines (and their MAC) of a PuTTY key file."""
    for match in finditer_with(_PUTTY_PRIVATE, text, "Private-Lines:"):
        start, end = match.span("body")
        if match.group("mac"):
            end = match.end()
        while text[end - 1] in "\r\n":
            end -= 1  # a file cut after its private lines: they end the key
        yield PiiHit("PRIVATE_KEY", start, end)


# An age identity (the key SOPS and Flux decrypt with: keys.txt, a Secret's age.agekey), or a
# plugin's (a YubiKey's): Bech32 after "-1", in capitals as age writes it.
_AGE_IDENTITY = on_use(r"AGE-(?:SECRET-KEY|PLUGIN-[A-Z0-9._+-]{1,64}?)-1[02-9AC-HJ-NP-Z]{20,}+")


def find_private_keys(src: ScanText) -> Iterator[PiiHit]:
    """PEM and PGP private key blocks, BEGIN through END (or through the key material), a
    PuTTY key file's private lines, and an age identity."""
    text = src.text
    yield from _putty_private_keys(text)
    for match in finditer_with(_AGE_IDENTITY, text, "AGE-"):
        yield PiiHit("PRIVATE_KEY", match.start(), match.end())
    if "PRIVATE KEY" not in text:  # a long literal: str's search skips most of the text
        return
    begins = list(_PEM_BEGIN.finditer(text))
    ends = list(_PEM_END.finditer(text, begins[0].end())) if begins else []
    next_end = 0
    for index, begin in enumerate(begins):
        # A block's END lies before the next BEGIN; one beyond it belongs to another key.
        limit = begins[index + 1].start() if index + 1 < len(begins) else len(text)
        while next_end < len(ends) and ends[next_end].start() < begin.end():
            next_end += 1
        end = ends[next_end] if next_end < len(ends) else None
        if end is not None and end.end() <= limit and end.start() - begin.end() <= _PEM_REACH:
            stop = end.end()
        else:
            body = _PEM_BODY.match(text, begin.end(), limit)
            stop = body.end() if body else begin.end()
            while text[stop - 1] in " \t\r\n\\":
                stop -= 1  # blank lines (real or escaped) after the key material are not in it
        yield PiiHit("PRIVATE_KEY", begin.start(), stop)


# More vendors' keys, each found from its prefix. Twilio: an API key is SK and 32 hex digits;
# an account is AC and 32 hex digits, a public id, but the 32-character auth token (or an API
# key's secret) written beside it is the credential (Client(SID, TOKEN), -u SID:TOKEN). Mailgun:
# key- and 32 characters. Shopify: shpat_, shpca_, shppa_ or shpss_ and 32 hex digits.
# DigitalOcean: dop_v1_, doo_v1_ or dor_v1_ and 64 hex digits. Google's OAuth tokens: ya29.
# (an access token, as gcloud auth print-access-token prints it) and 1//0 (a refresh token).
# Stripe's webhook signing secret: whsec_ (its API keys are found with the "k" keys above).
_TWILIO_SK = on_use(r"SK(?<![0-9A-Za-z_]SK)[0-9a-fA-F]{32}(?![0-9A-Za-z_])")
_TWILIO_SID = on_use(r"AC(?<![0-9A-Za-z_]AC)[0-9a-f]{32}(?![0-9A-Za-z_])")
_TWILIO_SECRET_SHAPE = on_use(r"(?<![A-Za-z0-9_])[A-Za-z0-9]{32}(?![A-Za-z0-9_])")
_TWILIO_PAIR_REACH = 256
_MAILGUN = on_use(r"key-(?<![0-9A-Za-z_]key-)(?P<body>[0-9a-zA-Z]{32})(?![0-9A-Za-z_])")
_SHOPIFY = on_use(r"shp(?<![0-9A-Za-z_]shp)(?:at|ca|pa|ss)_[0-9a-fA-F]{32}(?![0-9A-Za-z_])")
_DIGITALOCEAN = on_use(r"do(?<![0-9A-Za-z_]do)[opr]_v1_[0-9a-f]{64}(?![0-9A-Za-z_])")
_GOOGLE_OAUTH = on_use(
    r"ya29\.(?<![0-9A-Za-z_.]ya29\.)[0-9A-Za-z_-]{20,}+"
    r"|1//0(?<![0-9A-Za-z_/:]1//0)[0-9A-Za-z_-]{30,}+"
)
_STRIPE_WEBHOOK = on_use(r"whsec_(?<![0-9A-Za-z_]whsec_)[0-9A-Za-z]{24,}+(?![0-9A-Za-z_])")
# An STS session token (aws sts get-session-token, assume-role) starts with the base64 of its
# own header: FQoGZXIvYXdz or FwoGZXIvYXdz before 2021, IQoJb3JpZ2luX2Vj ("origin_ec") since.
_AWS_SESSION = on_use(
    r"(?<![A-Za-z0-9/+])(?:F[Qw]oGZXIvYXdz|IQoJb3JpZ2luX2Vj)[A-Za-z0-9/+]{40,}+=*"
)
# aws ecr get-login-password prints a registry password, valid for 12 hours: the base64 of a
# JSON object whose first key is "payload" ({"payload":").
_ECR_PASSWORD = on_use(r"(?<![A-Za-z0-9/+])eyJwYXlsb2FkIjoi[A-Za-z0-9/+]{64,}+=*")
# Every key but Google's is a run of MIN_ENCODED base64 characters or more (ScanText.runs), or
# starts one: found from the runs, read once for the encoded secrets too, where a search of
# the text for each prefix cost a pass each. Each with what starts its run (the key's prefix
# or its first characters), its pattern and its type; a key after its prefix is matched from
# the prefix's start.
_RUN_STARTS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("FQoGZXIvYXdz", _AWS_SESSION, "AWS_SESSION_TOKEN"),
    ("FwoGZXIvYXdz", _AWS_SESSION, "AWS_SESSION_TOKEN"),
    ("IQoJb3JpZ2luX2Vj", _AWS_SESSION, "AWS_SESSION_TOKEN"),
    ("eyJwYXlsb2FkIjoi", _ECR_PASSWORD, "AWS_SESSION_TOKEN"),
)
_RUN_PREFIXES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("key-", _MAILGUN, "MAILGUN_API_KEY"),
    ("shpat_", _SHOPIFY, "SHOPIFY_TOKEN"),
    ("shpca_", _SHOPIFY, "SHOPIFY_TOKEN"),
    ("shppa_", _SHOPIFY, "SHOPIFY_TOKEN"),
    ("shpss_", _SHOPIFY, "SHOPIFY_TOKEN"),
    ("dop_v1_", _DIGITALOCEAN, "DIGITALOCEAN_TOKEN"),
    ("doo_v1_", _DIGITALOCEAN, "DIGITALOCEAN_TOKEN"),
    ("dor_v1_", _DIGITALOCEAN, "DIGITALOCEAN_TOKEN"),
    ("whsec_", _STRIPE_WEBHOOK, "STRIPE_KEY"),
)
_STARTS = tuple(start for start, _, _ in _RUN_STARTS)
_PREFIXES = tuple(prefix for prefix, _, _ in _RUN_PREFIXES)
_LONGEST_PREFIX = max(map(len, _PREFIXES))
# Twilio's SK and AC, 34 characters, may follow a "/" or "+" inside a run (a URL's
# .../Accounts/AC...): their patterns' lookbehinds keep those inside a word out.
_TWILIO_IN_RUN = on_use(r"SK|AC")
_TWILIO_LENGTH = 34


def _run_keys(text: str, start: int, end: int) -> Iterator[PiiHit]:
    """The vendor keys (but Google's) that are, or start, the run at [start, end)."""
    if text.startswith(_STARTS, start):
        for first, pattern, entity in _RUN_STARTS:
            if text.startswith(first, start) and (match := pattern.match(text, start)):
                yield PiiHit(entity, start, match.end())
    if text.endswith(_PREFIXES, max(0, start - _LONGEST_PREFIX), start):
        for prefix, pattern, entity in _RUN_PREFIXES:
            if text.endswith(prefix, 0, start):
                match = pattern.match(text, start - len(prefix))
                if match and (entity != "MAILGUN_API_KEY" or _digit(match.group("body"))):
                    yield PiiHit(entity, match.start(), match.end())
    if end - start >= _TWILIO_LENGTH:  # a trace id's 32 hex digits cannot hold one
        for place in _TWILIO_IN_RUN.finditer(text, start, end):
            yield from _twilio_keys(text, place.start())


def _digit(body: str) -> bool:
    """Whether a key's body holds a digit (a Mailgun key does; key-value-store-... does not)."""
    return any(char.isdigit() for char in body)


def _twilio_keys(text: str, start: int) -> Iterator[PiiHit]:
    """A Twilio API key (SK...) at ``start`` and the secret beside it, or the auth token
    beside an account SID (AC...)."""
    if text.startswith("SK", start):
        match = _TWILIO_SK.match(text, start)
        if match is None or match.group()[2:].isdigit():
            return  # a product's SKU: 32 random hex digits hold a letter
        yield PiiHit("TWILIO_KEY", match.start(), match.end())
    else:
        match = _TWILIO_SID.match(text, start)
        if match is None:
            return
    yield from _twilio_secrets_near(text, match.start(), match.end())


# The key of a 32-character value that names an id or a digest: a trace id, an ETag, an MD5
# beside an SID in a JSON log line is no auth token.
_TWILIO_NOT_SECRET_KEYS = ("id", "hash", "md5", "sha", "sum", "digest", "etag", "fingerprint")
_KEY_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
_KEY_SEPARATORS = "\"' \t:="


def _named_not_secret(text: str, start: int) -> bool:
    """Whether the key before the value at ``start`` names an id or a digest (trace_id=,
    "ETag": ", request-id: ")."""
    end = start
    while end > max(0, start - 8) and text[end - 1] in _KEY_SEPARATORS:
        end -= 1
    if end == start:
        return False
    key = run_start(text, end, _KEY_CHARS, 64)
    return key >= 0 and text[key:end].lower().endswith(_TWILIO_NOT_SECRET_KEYS)


def _twilio_secrets_near(text: str, start: int, end: int) -> Iterator[PiiHit]:
    """The 32-character tokens near a Twilio account SID or API key: its auth token or secret."""
    low, high = max(0, start - _TWILIO_PAIR_REACH), min(len(text), end + _TWILIO_PAIR_REACH)
    for match in _TWILIO_SECRET_SHAPE.finditer(text, low, high):
        token = match.group()
        if match.end() == high and high < len(text) and text[high].isalnum():
            continue  # a longer run cut by the window
        if _named_not_secret(text, match.start()):
            continue
        if any(char.isdigit() for char in token) and any(char.isalpha() for char in token):
            yield PiiHit("TWILIO_KEY", match.start(), match.end())


# How the keys of the prefixed recognizers here start, as regexes: a key behind a
# percent-escaped separator is looked for again only before one of them (see recognizers.py).
# A recognizer of a new prefix adds it here.
PREFIX_STARTS = (
    *(r"gh[pousr]_", "github_pat_", "gl[a-z]{1,6}-", "GR1348941", "xox", r"xapp-", "[sr]k[-_]"),
    *("npm_", "pypi-", r"SG\.", "hf_", "A(?:KIA|SIA|BIA|CCA|Iza)", "eyJ", "key-", "shp"),
    *("do[opr]_v1_", r"ya29\.", "1//0", "whsec_", "SK", "AC", "F[Qw]oG", "IQoJ"),
)


def find_vendor_keys(src: ScanText) -> Iterator[PiiHit]:
    """AWS session tokens, Twilio API keys and auth tokens, Mailgun API keys, Shopify and
    DigitalOcean tokens, Google OAuth tokens and Stripe webhook secrets: Google's from their
    prefixes, the others from the runs of base64 characters they make."""
    text = src.text
    for start, end in src.runs:
        yield from _run_keys(text, start, end)
    for match in finditer_with(_GOOGLE_OAUTH, text, "ya29.", "1//0"):
        yield PiiHit("GOOGLE_OAUTH_TOKEN", match.start(), match.end())
