"""Recognizers of the PII guard: true positives and false positives per entity type."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bot.pii.checks import anchored_finditer, card_brand_ok, iban_ok, ipv4_ok, luhn_ok, ssn_ok
from bot.pii.credentials import _A_KEYS, _JWT
from bot.pii.emails import _AT_SIGN
from bot.pii.encoded import _SECRET_LABELS
from bot.pii.guard import resolve_overlaps
from bot.pii.numbers import _INTL_PHONE
from bot.pii.recognizers import RECOGNIZERS, Scanner
from bot.pii.scantext import ENTITY_TYPES, ScanText, load_finder
from tests.fakes.growth import assert_linear

SCAN = Scanner()

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwia"
    "WF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
AZURE_KEY = (
    "Yk3x9QmZ1vP8rT2sW7uL4nB6cD0eF5gH9jK1lM3nO5pQ7rS9tU1vW3xY5zA7bC9dE1fG3hI5jK7lM9nO1p+Q3r/S=="
)
GH_BODY = "1234567890abcdefghijABCDEFGHIJ123456"
# A Discord bot token: the bot's id (1089976543210987654) in base64, a timestamp, an HMAC.
DISCORD = "MTA4OTk3NjU0MzIxMDk4NzY1NA.GkX2bT.Vq3mZ9rT0pLx8sWcY1uNd4Hf-JbKe7gAo2iQv5R"
# Made up in the registries' formats: npm_ and 36 base62 characters; a PyPI macaroon for
# pypi.org and one for test.pypi.org; SendGrid's SG.<22>.<43>; hf_ and 34 letters.
NPM = "npm_38AibNyyurlGFb0EkjKWREhbiGjlvhkTp3SK"
PYPI = (
    "pypi-AgEIcHlwaS5vcmcCJGU4OGY0MGEyLTNiZDQtM2U5NC1hMTE0LWYyN2VhYjE5NWI0NwACKlsxLFsia2VzdHJl"
    "bC1jaGF0b3BzIl1dAAAGIHIP6UZWAVHkK4RWrFubZGdSvE7JKliZj3xEcBTP4bnY"
)
TEST_PYPI = (
    "pypi-AgENdGVzdC5weXBpLm9yZwIkZjljMjE1NjctMmFjMy04YWRmLTQxYjAtNzkxNTdhNmQ3ZmYzAAAGIJwq6Uh7"
    "R-sV4hm6YNNuqvF3eDp-ORqecmqL3Ws43z9d"
)
SENDGRID = "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"
HUGGING_FACE = "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"
# Made up in the vendors' formats: Twilio's API key (SK and 32 hex) and account SID (AC and 32
# hex) with its auth token, Mailgun's key-, Shopify's shpat_, DigitalOcean's dop_v1_, Google's
# OAuth access (ya29.) and refresh (1//0) tokens, Stripe's webhook signing secret.
TWILIO_SK = "SK33dbf550cbd9cf909cf615cb5856614c"
TWILIO_SID = "AC08b895cac62890c4ee2290b41c3d72e8"
TWILIO_AUTH = "71045e4563e0ae3bad9db4466f005d61"
AGE_KEY = "AGE-SECRET-KEY-1GFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPYYSJZGFPQ4EGAEX"
MAILGUN = "key-aeb30712cf79d734c1b2e0db8bddca41"
SHOPIFY = "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"
DIGITALOCEAN = "dop_v1_580aa856a81b34caf5f2fbf61751960e528995ed05ddff5877ebb1b52266e840"
GOOGLE_ACCESS = "ya29.a0AfB_byC1XkLm2PzR9vTnB4wYc8HdJs5FgA3eUi0oQ7XkLm2PzR9vTnB4wYc8HdJs5Fg0171"
GOOGLE_REFRESH = "1//0gLr3ZqXkLm2PzR9vTnB4wYc8HdJs5FgA3eUi0oQ7XkLm2PzR9vTnB4wYc8HdJs5FgA3eUi0o"
STRIPE_WEBHOOK = "whsec_RLcZERNFkgpqorrJNUuZ3O2VJV8YX4m9"
# STS session tokens: the older FwoGZXIvYXdz... and the newer IQoJb3JpZ2luX2Vj... ("origin_ec").
AWS_SESSION = "FwoGZXIvYXdzEBYaDHqa0AP1hWLt/hKjoSLAAVsMy7ZsRmdXvLx1Gf+D2ZT1k0bYFiJ5yAmpcQ8mZ8I5HT=="
AWS_SESSION_NEW = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQDl3Ft4hXk2Rb0fTmzYqLp"
ECR_PASSWORD = (
    "eyJwYXlsb2FkIjoiQmx0MVdURkRiUXRaeGR3ZlJ4V2ZqZ1h6Y0x0QmxUcm5rY2hKR0JKa0x2N3JrbGxrZCIsImRhdGFr"
    "ZXkiOiJBUUVCQUhoIiwidmVyc2lvbiI6IjIiLCJ0eXBlIjoiREFUQV9LRVkiLCJleHBpcmF0aW9uIjoxNzAwMDAwMDAwfQ=="
)
PUTTY_PRIVATE = (
    "AAAAIDF3G9Vr0pLx8sWcY1uNd4HfJbKe7gAo2iQv5R1234\nAAAAIQDl3Ft4hXk2Rb0fTmzYqLp9\n"
    "Private-MAC: 2a3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f2a3b"
)
PUTTY_KEY = (
    "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: eddsa-key\n"
    "Public-Lines: 2\nAAAAC3NzaC1lZDI1NTE5AAAAIGHk\nAAAAC3NzaC1lZDI1\nPrivate-Lines: 2\n"
    f"{PUTTY_PRIVATE}\n"
)
VAULT_KV = """====== Metadata ======
Key                Value
---                -----
created_time       2024-05-01T12:00:00.123456Z
version            3

====== Data ======
Key         Value
---         -----
api         k3yv4lu3
"""
VAULT_READ = """Key                Value
---                -----
lease_id           database/creds/readonly/2f6a614c
lease_duration     768h
password           A1a-EkPXWxYz9q
username           v-token-readonly-wGL
"""
JWE = (
    "eyJhbGciOiJSU0EtT0FFUCIsImVuYyI6IkEyNTZHQ00ifQ.OKOawDo13gRp2ojaHV7LFpZcgV7T6DVZKTyKOMTYUm"
    ".48V1_ALb6US04U3b.5eym8TW_c8SuK0ltJ3rpYIzOeDQz7TALvtu6UG9oMo4vpzs9tX_EFSh.XFBoMYUZodetZdvTiFvSkQ"
)
RSA_BLOCK = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx4UbaDzY1W2YBkV\n"
    "q8T0jDdbB2xY1ZkLd0==\n-----END RSA PRIVATE KEY-----"
)


def found(text: str, entity: str) -> list[str]:
    """The substrings the scanner reports as `entity`, after overlaps are resolved."""
    hits = resolve_overlaps(SCAN(text), len(text))
    return [text[hit.start : hit.end] for hit in hits if hit.entity_type == entity]


TRUE_POSITIVES: list[tuple[str, str, str]] = [
    # EMAIL_ADDRESS
    ("EMAIL_ADDRESS", "contact alice@example.com now", "alice@example.com"),
    ("EMAIL_ADDRESS", "bob.smith+tag@mail.example.co.uk", "bob.smith+tag@mail.example.co.uk"),
    ("EMAIL_ADDRESS", "<ops_team@corp-mail.io>", "ops_team@corp-mail.io"),
    ("EMAIL_ADDRESS", "mailto:jane.doe@example.org", "jane.doe@example.org"),
    ("EMAIL_ADDRESS", '{"email": "x.y@sub.example.travel"}', "x.y@sub.example.travel"),
    ("EMAIL_ADDRESS", "sent to jörg@example.de.", "jörg@example.de"),
    ("EMAIL_ADDRESS", "Author: Jane <jane@example.com>", "jane@example.com"),
    ("EMAIL_ADDRESS", "reply to jane@example.com: she knows", "jane@example.com"),
    # PHONE_NUMBER
    ("PHONE_NUMBER", "call +44 20 7946 0958 today", "+44 20 7946 0958"),
    ("PHONE_NUMBER", "+1 (555) 123-4567", "+1 (555) 123-4567"),
    ("PHONE_NUMBER", "tel:+1-555-123-4567", "+1-555-123-4567"),
    ("PHONE_NUMBER", "mobile=+4915112345678", "+4915112345678"),
    ("PHONE_NUMBER", "+33 1 23 45 67 89", "+33 1 23 45 67 89"),
    ("PHONE_NUMBER", "+44 (0)20 7946 0958", "+44 (0)20 7946 0958"),
    ("PHONE_NUMBER", "phone: (555) 123-4567", "(555) 123-4567"),
    ("PHONE_NUMBER", "phone: 555-123-4567", "555-123-4567"),
    ("PHONE_NUMBER", "phone: 555.123.4567", "555.123.4567"),
    ("PHONE_NUMBER", "toll free 1-800-555-0199", "1-800-555-0199"),
    ("PHONE_NUMBER", "London 020 7946 0958", "020 7946 0958"),
    ("PHONE_NUMBER", "Berlin 030 12345678", "030 12345678"),
    ("PHONE_NUMBER", "mobiel 06-12345678", "06-12345678"),
    ("PHONE_NUMBER", "Paris 01 23 45 67 89", "01 23 45 67 89"),
    ("PHONE_NUMBER", "portable 06.12.34.56.78", "06.12.34.56.78"),
    ("PHONE_NUMBER", "Tel. (030) 1234567", "(030) 1234567"),
    ("PHONE_NUMBER", "call 07700 900123 now", "07700 900123"),
    # CREDIT_CARD
    ("CREDIT_CARD", "card=4111111111111111", "4111111111111111"),
    ("CREDIT_CARD", "card 4111 1111 1111 1111 exp 12/29", "4111 1111 1111 1111"),
    ("CREDIT_CARD", "4111-1111-1111-1111", "4111-1111-1111-1111"),
    # A word that starts with a digit right after the card ("3rd", "2fa") is no part of it.
    ("CREDIT_CARD", "order 5500 0000 0000 0004 3rd try", "5500 0000 0000 0004"),
    ("CREDIT_CARD", "pan 4111-1111-1111-1111-2fa=ok", "4111-1111-1111-1111"),
    ("CREDIT_CARD", "4111 1111 1111 1111 12ab", "4111 1111 1111 1111"),
    ("CREDIT_CARD", "mc 5500 0000 0000 0004", "5500 0000 0000 0004"),
    ("CREDIT_CARD", "amex 3782 822463 10005", "3782 822463 10005"),
    ("CREDIT_CARD", "amex 378282246310005", "378282246310005"),
    ("CREDIT_CARD", "discover 6011111111111117", "6011111111111117"),
    ("CREDIT_CARD", "jcb 3530111333300000", "3530111333300000"),
    ("CREDIT_CARD", "diners 30569309025904", "30569309025904"),
    ("CREDIT_CARD", "mc2 2221000000000009", "2221000000000009"),
    ("CREDIT_CARD", '"pan": "4012888888881881"', "4012888888881881"),
    # IBAN_CODE
    ("IBAN_CODE", "iban DE89370400440532013000", "DE89370400440532013000"),
    ("IBAN_CODE", "IBAN: DE89 3704 0044 0532 0130 00.", "DE89 3704 0044 0532 0130 00"),
    ("IBAN_CODE", "GB82WEST12345698765432", "GB82WEST12345698765432"),
    ("IBAN_CODE", "GB82 WEST 1234 5698 7654 32", "GB82 WEST 1234 5698 7654 32"),
    ("IBAN_CODE", "FR1420041010050500013M02606", "FR1420041010050500013M02606"),
    ("IBAN_CODE", "NL91ABNA0417164300", "NL91ABNA0417164300"),
    ("IBAN_CODE", "NO9386011117947", "NO9386011117947"),
    # IP_ADDRESS
    ("IP_ADDRESS", "10.0.0.1 - - [01/May/2024] GET /", "10.0.0.1"),
    ("IP_ADDRESS", "client 8.8.8.8 connected", "8.8.8.8"),
    ("IP_ADDRESS", "http://10.1.2.3:8080/x", "10.1.2.3"),
    ("IP_ADDRESS", "listen [2001:db8::1]:443", "2001:db8::1"),
    ("IP_ADDRESS", "fe80::1ff:fe23:4567:890a", "fe80::1ff:fe23:4567:890a"),
    (
        "IP_ADDRESS",
        "addr 2001:0db8:85a3:0000:0000:8a2e:0370:7334 up",
        "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
    ),
    ("IP_ADDRESS", "bound to ::1", "::1"),
    ("IP_ADDRESS", "peer ::ffff:192.0.2.128", "::ffff:192.0.2.128"),
    ("IP_ADDRESS", "link fe80::1%eth0 up", "fe80::1%eth0"),
    # US_SSN
    ("US_SSN", "ssn 123-45-6789", "123-45-6789"),
    ("US_SSN", "SSN: 078-05-1120\n", "078-05-1120"),
    ("US_SSN", "SSN 123 45 6789", "123 45 6789"),
    # AWS_ACCESS_KEY
    ("AWS_ACCESS_KEY", "AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("AWS_ACCESS_KEY", "id ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A"),
    ("AWS_ACCESS_KEY", "key=AKIAIOSFODNN7EXAMPLE;", "AKIAIOSFODNN7EXAMPLE"),
    # AWS_SECRET_KEY
    ("AWS_SECRET_KEY", f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET),
    ("AWS_SECRET_KEY", f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}", AWS_SECRET),
    ("AWS_SECRET_KEY", f'"SecretAccessKey": "{AWS_SECRET}"', AWS_SECRET),
    ("AWS_SECRET_KEY", f"aws_secret_key: {AWS_SECRET}", AWS_SECRET),
    # GITHUB_TOKEN
    ("GITHUB_TOKEN", f"token ghp_{GH_BODY}", f"ghp_{GH_BODY}"),
    ("GITHUB_TOKEN", f"gho_{GH_BODY}", f"gho_{GH_BODY}"),
    ("GITHUB_TOKEN", f"GH_TOKEN=ghu_{GH_BODY}", f"ghu_{GH_BODY}"),
    ("GITHUB_TOKEN", f"ghs_{GH_BODY}", f"ghs_{GH_BODY}"),
    ("GITHUB_TOKEN", f"ghr_{GH_BODY}", f"ghr_{GH_BODY}"),
    (
        "GITHUB_TOKEN",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ01",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ01",
    ),
    # SLACK_TOKEN
    (
        "SLACK_TOKEN",
        "SLACK=xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
        "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    ),
    (
        "SLACK_TOKEN",
        "xoxp-123456789012-123456789012-123456789012-0123456789abcdef",
        "xoxp-123456789012-123456789012-123456789012-0123456789abcdef",
    ),
    ("SLACK_TOKEN", "xoxa-2-1234567890-abcdefghij", "xoxa-2-1234567890-abcdefghij"),
    # An incoming webhook's URL is its credential: its last part is the secret.
    (
        "SLACK_TOKEN",
        "slack_api_url: https://hooks.slack.com/services/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",
        "a1B2c3D4e5F6g7H8i9J0k1L2",
    ),
    (
        "SLACK_TOKEN",
        "https://hooks.slack.com/workflows/T0A1B2C3D/A0A1B2C3D/412345678901234567/a1B2c3D4e5F6g7H8i9J0",
        "a1B2c3D4e5F6g7H8i9J0",
    ),
    # JSON that escapes its slashes (PHP's json_encode, a Laravel log channel's webhook).
    (
        "SLACK_TOKEN",
        r'{"url":"https:\/\/hooks.slack.com\/services\/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"}',
        "a1B2c3D4e5F6g7H8i9J0k1L2",
    ),
    (
        "SLACK_TOKEN",
        "app xapp-1-A01234567-1234567890123-abcdef0123456789",
        "xapp-1-A01234567-1234567890123-abcdef0123456789",
    ),
    # DISCORD_TOKEN
    ("DISCORD_TOKEN", f"token {DISCORD} leaked", DISCORD),
    ("DISCORD_TOKEN", f"DISCORD_TOKEN={DISCORD}", DISCORD),
    ("DISCORD_TOKEN", f"Authorization: Bot {DISCORD}", DISCORD),
    ("DISCORD_TOKEN", f'{{"token": "{DISCORD}"}}', DISCORD),
    (
        "DISCORD_TOKEN",
        "url: https://discord.com/api/webhooks/1234567890123456789/"
        "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-AbCdEfGhIjKlMnOpQrStUvWxYz01",
        "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789_-AbCdEfGhIjKlMnOpQrStUvWxYz01",
    ),
    (
        "DISCORD_TOKEN",
        "https://discordapp.com/api/v10/webhooks/1234567890123456789/Ab1_cD2-eF3gH4iJ5kL6mN7oP8",
        "Ab1_cD2-eF3gH4iJ5kL6mN7oP8",
    ),
    (
        "DISCORD_TOKEN",
        r'{"hook":"https:\/\/discord.com\/api\/webhooks\/1234567890123456789\/Ab1_cD2-eF3gH4iJ5kL6mN7oP8"}',
        "Ab1_cD2-eF3gH4iJ5kL6mN7oP8",
    ),
    (
        "DISCORD_TOKEN",
        "old NzkyNzE1NDU0MTk2MDg4ODQy.X-hvzA.Ovy4MCQywSkoMRRclStW4xAYK7I",
        "NzkyNzE1NDU0MTk2MDg4ODQy.X-hvzA.Ovy4MCQywSkoMRRclStW4xAYK7I",
    ),
    # OPENAI_API_KEY, and the keys of other OpenAI-compatible endpoints: hex after sk-
    (
        "OPENAI_API_KEY",
        "key: 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",
        "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",
    ),
    (
        "OPENAI_API_KEY",
        "using sk-10dc059f1dc7afa5ab28ab6f50b7c271",
        "sk-10dc059f1dc7afa5ab28ab6f50b7c271",
    ),
    (
        "OPENAI_API_KEY",
        "OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwxyzABCDEFGH1234567890abcd",
        "sk-abcdefghijklmnopqrstuvwxyzABCDEFGH1234567890abcd",
    ),
    (
        "OPENAI_API_KEY",
        "sk-proj-AbCdEf0123456789_abcdefghij-ABCDEFGHIJ0123456789abcdefgh",
        "sk-proj-AbCdEf0123456789_abcdefghij-ABCDEFGHIJ0123456789abcdefgh",
    ),
    # STRIPE_KEY
    ("STRIPE_KEY", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("STRIPE_KEY", "key: rk_live_4eC39HqLyjWDarjtT1zdp7dc", "rk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("STRIPE_KEY", "sk_test_4eC39HqLyjWDarjtT1zdp7dc", "sk_test_4eC39HqLyjWDarjtT1zdp7dc"),
    # GOOGLE_API_KEY
    (
        "GOOGLE_API_KEY",
        "key=AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY&q=x",
        "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
    ),
    # NPM_TOKEN
    ("NPM_TOKEN", f"//registry.npmjs.org/:_authToken={NPM}", NPM),
    ("NPM_TOKEN", f"npm publish failed for {NPM} (E403)", NPM),
    ("NPM_TOKEN", f"NPM_TOKEN={NPM}\n", NPM),
    ("NPM_TOKEN", f'{{"token": "{NPM}", "readonly": false}}', NPM),
    # PYPI_TOKEN
    ("PYPI_TOKEN", f"[pypi]\n  username = __token__\n  password = {PYPI}\n", PYPI),
    (
        "PYPI_TOKEN",
        f"uv publish --publish-url https://test.pypi.org/legacy/ -t {TEST_PYPI}",
        TEST_PYPI,
    ),
    # SENDGRID_API_KEY
    ("SENDGRID_API_KEY", f"sgMail.setApiKey('{SENDGRID}');", SENDGRID),
    ("SENDGRID_API_KEY", f"key {SENDGRID}. Rotate it", SENDGRID),
    # HUGGINGFACE_TOKEN
    ("HUGGINGFACE_TOKEN", f"huggingface-cli login --token {HUGGING_FACE}", HUGGING_FACE),
    ("HUGGINGFACE_TOKEN", f"HF_TOKEN={HUGGING_FACE}", HUGGING_FACE),
    (
        "HUGGINGFACE_TOKEN",
        "hf_hub_download(repo, token='hf_q7XkLm2PzR9vTnB4wYc8HdJs5FgA3eUi0o')",
        "hf_q7XkLm2PzR9vTnB4wYc8HdJs5FgA3eUi0o",
    ),
    # TWILIO_KEY: an API key, and an account's auth token beside its SID
    ("TWILIO_KEY", f"twilio api:core:keys:list\n{TWILIO_SK}  ci  2024-05-01", TWILIO_SK),
    ("TWILIO_KEY", f"{TWILIO_SID}:{TWILIO_AUTH}", TWILIO_AUTH),
    ("TWILIO_KEY", f"client = Client('{TWILIO_SID}', '{TWILIO_AUTH}')", TWILIO_AUTH),
    ("TWILIO_KEY", f"curl -u {TWILIO_SID}:{TWILIO_AUTH} https://api.twilio.com", TWILIO_AUTH),
    ("TWILIO_KEY", f"sid={TWILIO_SID} auth_token={TWILIO_AUTH}", TWILIO_AUTH),
    # The SID in a URL's path, the key after a plus: inside a longer run of base64 characters.
    (
        "TWILIO_KEY",
        f"POST /2010-04-01/Accounts/{TWILIO_SID}/Messages.json auth {TWILIO_AUTH}",
        TWILIO_AUTH,
    ),
    ("TWILIO_KEY", f"keys=a1+{TWILIO_SK}", TWILIO_SK),
    # AWS_SESSION_TOKEN: aws sts get-session-token's text and table outputs give it unlabelled
    (
        "AWS_SESSION_TOKEN",
        f"CREDENTIALS\tASIAY34FZKBOKMUTVV7A\t2024-05-01T12:00:00Z\t{AWS_SECRET}\t{AWS_SESSION}",
        AWS_SESSION,
    ),
    ("AWS_SESSION_TOKEN", f"|  SessionToken    |  {AWS_SESSION_NEW} |", AWS_SESSION_NEW),
    # A registry's auth in a docker config (base64 of user:password), however short.
    ("GENERIC_SECRET", '{"auths": {"ghcr.io": {"auth": "Ym9iOmh1bnRlcjIy"}}}', "Ym9iOmh1bnRlcjIy"),
    # Airflow's Fernet key, a password named _PW (LDAP_BIND_PW), as env prints them.
    (
        "GENERIC_SECRET",
        "AIRFLOW__CORE__FERNET_KEY=81HqDtbqAywKSOumSha3BhWNOdQ26slT6K0YaZeZyPs=",
        "81HqDtbqAywKSOumSha3BhWNOdQ26slT6K0YaZeZyPs=",
    ),
    ("GENERIC_SECRET", "LDAP_BIND_PW=s3cr3tpw9\nX=1", "s3cr3tpw9"),
    # aws ecr get-login-password: base64 of {"payload": ...}, alone on its line.
    ("AWS_SESSION_TOKEN", f"$ aws ecr get-login-password\n{ECR_PASSWORD}\n", ECR_PASSWORD),
    # A PuTTY key file's private lines.
    ("PRIVATE_KEY", PUTTY_KEY, PUTTY_PRIVATE),
    (
        "PRIVATE_KEY",
        "Private-Lines: 1\r\nAAAAIDF3G9Vr0pLx8sWcY1uNd4HfJbKe7gAo2iQv5R1234\r\n",
        "AAAAIDF3G9Vr0pLx8sWcY1uNd4HfJbKe7gAo2iQv5R1234",
    ),
    # An age identity (SOPS, Flux), as keys.txt or SOPS_AGE_KEY holds it, and a plugin's.
    (
        "PRIVATE_KEY",
        f"export SOPS_AGE_KEY={AGE_KEY}",
        AGE_KEY,
    ),
    (
        "PRIVATE_KEY",
        "#    Recipient: age1yubikey1qwt50d05\nAGE-PLUGIN-YUBIKEY-1XQJ2WSQYZYE3Q5CLX2X6N",
        "AGE-PLUGIN-YUBIKEY-1XQJ2WSQYZYE3Q5CLX2X6N",
    ),
    # Rails's secret_key_base, as an env or credentials dump shows it
    ("GENERIC_SECRET", '"SECRET_KEY_BASE=3f2c9a1e4b5d", "TZ=UTC"', "3f2c9a1e4b5d"),
    # MAILGUN_API_KEY
    ("MAILGUN_API_KEY", f"curl -s --user 'api:{MAILGUN}' https://api.mailgun.net/v3", MAILGUN),
    # SHOPIFY_TOKEN
    ("SHOPIFY_TOKEN", f"X-Shopify-Access-Token {SHOPIFY}", SHOPIFY),
    # DIGITALOCEAN_TOKEN
    ("DIGITALOCEAN_TOKEN", f"doctl auth init -t {DIGITALOCEAN}", DIGITALOCEAN),
    # GOOGLE_OAUTH_TOKEN: gcloud auth print-access-token, an OAuth client's refresh token
    ("GOOGLE_OAUTH_TOKEN", f"$ gcloud auth print-access-token\n{GOOGLE_ACCESS}\n", GOOGLE_ACCESS),
    ("GOOGLE_OAUTH_TOKEN", f"refresh with {GOOGLE_REFRESH}.", GOOGLE_REFRESH),
    # Stripe's webhook signing secret, as stripe listen prints it
    ("STRIPE_KEY", f"Your webhook signing secret is {STRIPE_WEBHOOK} (^C to quit)", STRIPE_WEBHOOK),
    # BEARER_TOKEN
    ("BEARER_TOKEN", "Authorization: Bearer abcDEF123456ghiJKL", "abcDEF123456ghiJKL"),
    ("BEARER_TOKEN", "bearer 0123456789abcdef0123", "0123456789abcdef0123"),
    ("BEARER_TOKEN", "BEARER Zm9vYmFyYmF6cXV4==", "Zm9vYmFyYmF6cXV4=="),
    # BASIC_AUTH
    ("BASIC_AUTH", "Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
    ("BASIC_AUTH", "curl -H 'Authorization: basic YTpi'", "YTpi"),
    # GENERIC_SECRET
    (
        "GENERIC_SECRET",
        "client_secret=9f86d081884c7d659a2feaa0c55ad015",
        "9f86d081884c7d659a2feaa0c55ad015",
    ),
    ("GENERIC_SECRET", "Authorization: Token 9a8b7c6d5e4f3a2b1c0d", "9a8b7c6d5e4f3a2b1c0d"),
    # An environment variable named for a secret (.env, env, docker inspect), whatever it holds.
    (
        "GENERIC_SECRET",
        "KESTREL_WEB_TOKEN=correct-horse-battery-staple",
        "correct-horse-battery-staple",
    ),
    (
        "GENERIC_SECRET",
        'export API_KEY="3f2b8c1e-9d4a-4e7b-8c6f-1a2b3c4d5e6f"',
        "3f2b8c1e-9d4a-4e7b-8c6f-1a2b3c4d5e6f",
    ),
    ("GENERIC_SECRET", '"Env": ["SECRET_KEY=aB3dE5fG7hJ9kL1m", "TZ=UTC"]', "aB3dE5fG7hJ9kL1m"),
    ("GENERIC_SECRET", "env:\n  SLACK_SIGNING_SECRET: Hunter2!xyz\n", "Hunter2!xyz"),
    ("GENERIC_SECRET", "DISCORD_CLIENT_SECRET='s3cr3t-w0rds'", "s3cr3t-w0rds"),
    # A key in small letters that names a secret, and a value that looks generated: shorter
    # than 20 characters, or a UUID (its dashes cut it into short runs).
    (
        "GENERIC_SECRET",
        "api key: 3f2c9a1e-4b5d-4e6f-8a7b-9c0d1e2f3a4b",
        "3f2c9a1e-4b5d-4e6f-8a7b-9c0d1e2f3a4b",
    ),
    ("GENERIC_SECRET", "client_secret=abcd1234efgh", "abcd1234efgh"),
    ("GENERIC_SECRET", "client_secret: Ab3/x9Kd+2q", "Ab3/x9Kd+2q"),
    ("GENERIC_SECRET", "token: 9f8e7d6c5b4a", "9f8e7d6c5b4a"),
    ("GENERIC_SECRET", "next_token: x\nrefresh_token: 9f8e7d6c5b4a", "9f8e7d6c5b4a"),
    ("GENERIC_SECRET", '{"SessionToken": "AQoDYXdzEJr1K9f8e7d6c5b"}', "AQoDYXdzEJr1K9f8e7d6c5b"),
    ("GENERIC_SECRET", '{"apiKey": "a1b2c3d4e5", "region": "eu"}', "a1b2c3d4e5"),
    (
        "GENERIC_SECRET",
        "-H 'x-api-key: 7c9e6679-7425-40de-944b-e07fc1f90ae7'",
        "7c9e6679-7425-40de-944b-e07fc1f90ae7",
    ),
    ("GENERIC_SECRET", "auth_token = 'k9Xz81qP'", "k9Xz81qP"),
    ("GENERIC_SECRET", "stringData:\n  webhook_secret: s3cretvalue9\n", "s3cretvalue9"),
    ("GENERIC_SECRET", r'{"log":"{\"access_key\": \"ab12cd34\"}"}', "ab12cd34"),
    ("GENERIC_SECRET", "Credentials: u1x9-77ab. Done", "u1x9-77ab"),
    # A long option and its value as two words: a command line a tool echoed.
    ("GENERIC_SECRET", "app --client-secret abcd1234efgh --port 80", "abcd1234efgh"),
    (
        "GENERIC_SECRET",
        "app --api-key '3f2c9a1e-4b5d-4e6f-8a7b-9c0d1e2f3a4b'",
        "3f2c9a1e-4b5d-4e6f-8a7b-9c0d1e2f3a4b",
    ),
    # kubectl create secret's literals: every value is the secret's.
    (
        "GENERIC_SECRET",
        "kubectl create secret generic app --from-literal=api=k3yv4lu3 -n x",
        "k3yv4lu3",
    ),
    ("GENERIC_SECRET", "kubectl create secret generic a --from-literal 'url=x y'", "x y"),
    (
        "GENERIC_SECRET",
        "kubectl create cm a --from-literal=A=b1\nkubectl create secret generic s \\\n"
        "  --from-literal=api=k3yv4lu3",
        "k3yv4lu3",
    ),
    # PASS as the last word of a name, given as a name and a value (a pod's spec).
    ("GENERIC_SECRET", "- name: SMTP_PASS\n  value: hunter22", "hunter22"),
    # An application's key: Laravel's APP_KEY, Datadog's application key.
    (
        "GENERIC_SECRET",
        "APP_ENV=production\nAPP_KEY=base64:q9rT0pLx8sWcY1uNd4HfJbKe7gAo2iQv5R1234abcd=\n",
        "base64:q9rT0pLx8sWcY1uNd4HfJbKe7gAo2iQv5R1234abcd=",
    ),
    (
        "GENERIC_SECRET",
        "DD_APP_KEY=9f86d081884c7d659a2feaa0c55ad0159f86d081",
        "9f86d081884c7d659a2feaa0c55ad0159f86d081",
    ),
    # A value with a slash that is no path of lower-case names: base64, as AWS keys are.
    (
        "GENERIC_SECRET",
        "APP_SECRET=/wJalrXUtnFEMI/K7MDENG/bPxRfiCY",
        "/wJalrXUtnFEMI/K7MDENG/bPxRfiCY",
    ),
    # /proc/PID/environ: NUL ends each value
    ("GENERIC_SECRET", "TZ=UTC\x00KESTREL_WEB_TOKEN=abcdef123456\x00HOME=/root", "abcdef123456"),
    # JWT
    ("JWT", f"token={JWT}", JWT),
    ("JWT", f"Authorization: Bearer {JWT}", JWT),
    # An encrypted JWT (JWE): five parts, its header names an "enc".
    ("JWT", f"id_token {JWE} ok", JWE),
    # PRIVATE_KEY
    ("PRIVATE_KEY", f"key:\n{RSA_BLOCK}\nnext line", RSA_BLOCK),
    (
        "PRIVATE_KEY",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n"
        "-----END OPENSSH PRIVATE KEY-----",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n"
        "-----END OPENSSH PRIVATE KEY-----",
    ),
    (
        "PRIVATE_KEY",
        '{"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC'
        '\\n-----END PRIVATE KEY-----\\n", "type": "service_account"}',
        "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
        "\\n-----END PRIVATE KEY-----",
    ),
    (
        "PRIVATE_KEY",
        "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBYq8T0jDdbB2xY1ZkLd0\nAwEHoUQDQgAE\n"
        "2024-05-01 12:00:00 the output was cut",
        "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBYq8T0jDdbB2xY1ZkLd0\nAwEHoUQDQgAE",
    ),
    (
        "PRIVATE_KEY",
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"
        "DEK-Info: AES-128-CBC,3F17F5316E2BAC89\n\nMIIEowIBAAKCAQEAx4UbaDzY1W2YBkV",
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n"
        "DEK-Info: AES-128-CBC,3F17F5316E2BAC89\n\nMIIEowIBAAKCAQEAx4UbaDzY1W2YBkV",
    ),
    (
        "PRIVATE_KEY",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----",
    ),
    # CONNECTION_STRING_PASSWORD
    ("CONNECTION_STRING_PASSWORD", "postgres://app:s3cr3t@db:5432/app", "s3cr3t"),
    ("CONNECTION_STRING_PASSWORD", "redis://:hunter2@cache:6379/0", "hunter2"),
    # A password glued to -p on a MySQL client's command line, or after sshpass -p.
    ("CONNECTION_STRING_PASSWORD", "mysql -u root -pTr0ub4dor3 app", "Tr0ub4dor3"),
    ("CONNECTION_STRING_PASSWORD", "mysqldump -h db -u app '-ps3cr3t;x' app", "s3cr3t;x"),
    ("CONNECTION_STRING_PASSWORD", "sshpass -p Tr0ub4dor3 ssh host", "Tr0ub4dor3"),
    # Quoted after the flag, as scripts quote a password with a shell character in it.
    ("CONNECTION_STRING_PASSWORD", "sshpass -p 'Tr0ub4dor&3' ssh host", "Tr0ub4dor&3"),
    ("CONNECTION_STRING_PASSWORD", 'sshpass -p"correct horse" ssh host', "correct horse"),
    ("CONNECTION_STRING_PASSWORD", "mysql -uroot -p'S3cr3t!' -h db", "S3cr3t!"),
    ("CONNECTION_STRING_PASSWORD", 'mariadb -u app -p"Tr0ub4dor&3" app', "Tr0ub4dor&3"),
    ("CONNECTION_STRING_PASSWORD", "mysql -e 'select 1; select 2' -pTr0ub4dor3", "Tr0ub4dor3"),
    ("CONNECTION_STRING_PASSWORD", "sudo -u mysql mysqladmin -pTr0ub4dor3 status", "Tr0ub4dor3"),
    ("CONNECTION_STRING_PASSWORD", "kubectl exec mysql-0 -- mysql -pTr0ub4dor3", "Tr0ub4dor3"),
    ("CONNECTION_STRING_PASSWORD", "kubectl exec -it db-0 -- mysql -pTr0ub4dor3", "Tr0ub4dor3"),
    ("CONNECTION_STRING_PASSWORD", "sudo -E mysql -uroot -pTr0ub4dor3", "Tr0ub4dor3"),
    ("CONNECTION_STRING_PASSWORD", "mysql -h mysql -pTr0ub4dor3", "Tr0ub4dor3"),
    # A registry login's -p and redis-cli's -a, as a CI job's trace or ps shows them.
    ("CONNECTION_STRING_PASSWORD", "+ docker login -u bob -p hunter22 registry.corp", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "podman login -u a -p 'Tr0ub 4dor' quay.io", "Tr0ub 4dor"),
    ("CONNECTION_STRING_PASSWORD", "redis-cli -h cache -p 6379 -a hunter22 ping", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "redis-cli -h cache --pass hunter22 ping", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "mongosh -u admin -p hunter22 --quiet", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "mongodump -h db -u bkp -p 'Tr0ub 4dor' --out /b", "Tr0ub 4dor"),
    # JSON that escapes its slashes (PHP's json_encode): postgresql:\/\/app:...@db\/x
    # JSON inside a JSON string whose value escapes a character: Go's \u0026 for "&", a
    # backslash, PHP's "\/"; the escapes are the secret's own characters.
    (
        "CONNECTION_STRING_PASSWORD",
        r'{"log":"{\"password\":\"Tr0ub4dor\\u00263\"}"}',
        r"Tr0ub4dor\\u00263",
    ),
    ("CONNECTION_STRING_PASSWORD", r'{"log":"{\"pwd\": \"Tr0ub\\\\4dor3\"}"}', r"Tr0ub\\\\4dor3"),
    ("CONNECTION_STRING_PASSWORD", r'{"log":"{\"passwd\":\"s3\\/cr3t\"}"}', r"s3\\/cr3t"),
    ("CONNECTION_STRING_PASSWORD", r'{"dsn":"postgresql:\/\/app:s3cr3t@db\/app"}', "s3cr3t"),
    ("CONNECTION_STRING_PASSWORD", "mongodb+srv://u:p%40ss@cluster0.example.net/db", "p%40ss"),
    ("CONNECTION_STRING_PASSWORD", "amqp://guest:p@ss@rabbit/vhost", "p@ss"),
    # A token given as a URL's user: git's remotes (git remote -v), a CI job's clone URL.
    (
        "GENERIC_SECRET",
        "origin\thttps://0123456789abcdef0123456789abcdef01234567@github.com/o/r.git (push)",
        "0123456789abcdef0123456789abcdef01234567",
    ),
    (
        "GENERIC_SECRET",
        "git clone https://0123456789abcdef0123456789abcdef01234567:x-oauth-basic@github.com/o/r",
        "0123456789abcdef0123456789abcdef01234567",
    ),
    ("CONNECTION_STRING_PASSWORD", "Server=db;User Id=sa;Password=Pa55w0rd!;", "Pa55w0rd!"),
    ("CONNECTION_STRING_PASSWORD", "host=db user=app password=hunter2 dbname=app", "hunter2"),
    ("CONNECTION_STRING_PASSWORD", "Driver={ODBC};Pwd={secret;val};", "secret;val"),
    ("CONNECTION_STRING_PASSWORD", 'password="with space" port=5432', "with space"),
    ("CONNECTION_STRING_PASSWORD", "PGPASSWORD=abc123 psql", "abc123"),
    ("CONNECTION_STRING_PASSWORD", "[db]\npassword = hunter2\n", "hunter2"),
    # A separator inside a value is part of it; one before the next key ends it.
    ("CONNECTION_STRING_PASSWORD", "login password=Tr0ub4dor&3 ok", "Tr0ub4dor&3"),
    ("CONNECTION_STRING_PASSWORD", "?password=x&user=y", "x"),
    ("CONNECTION_STRING_PASSWORD", "Password=a;b;Data Source=db", "a;b"),
    ("CONNECTION_STRING_PASSWORD", "Password=x;User Id=sa;", "x"),
    ("CONNECTION_STRING_PASSWORD", "pwd=abc, then", "abc"),
    # A password that starts like a shell variable, but with small letters.
    ("CONNECTION_STRING_PASSWORD", "login password=$ecretPass1 ok", "$ecretPass1"),
    ("CONNECTION_STRING_PASSWORD", "[db]\npassword = xK9(aB3\n", "xK9(aB3"),
    # GITLAB_TOKEN
    ("GITLAB_TOKEN", "token glpat-abcdefghij1234567890XY.", "glpat-abcdefghij1234567890XY"),
    ("GITLAB_TOKEN", "CI_JOB=gldt-ABCDEFGHIJKLMNOPQRSTuv x", "gldt-ABCDEFGHIJKLMNOPQRSTuv"),
    ("GITLAB_TOKEN", "glrt-t1_AbCdEfGhIjKlMnOpQrSt", "glrt-t1_AbCdEfGhIjKlMnOpQrSt"),
    ("GITLAB_TOKEN", "glrtr-AbCdEfGhIjKlMnOpQrSt12", "glrtr-AbCdEfGhIjKlMnOpQrSt12"),
    ("GITLAB_TOKEN", "glffct-AbCdEfGhIjKlMnOpQrSt12", "glffct-AbCdEfGhIjKlMnOpQrSt12"),
    (
        "GITLAB_TOKEN",
        "--registration-token GR1348941AbCdEfGhIjKlMnOpQrSt",
        "GR1348941AbCdEfGhIjKlMnOpQrSt",
    ),
    # JSON inside a JSON string (a container's log line, an applied manifest): escaped quotes.
    ("CONNECTION_STRING_PASSWORD", r'{"log":"{\"password\":\"hunter2xyz\"}\n"}', "hunter2xyz"),
    ("CONNECTION_STRING_PASSWORD", r'"{\\\"db_password\\\": \\\"Tr0ub4dor3\\\"}"', "Tr0ub4dor3"),
    (
        "GENERIC_SECRET",
        r'{"log":"{\"api_key\": \"9f8e7d6c5b4a39281706f5e4d3c2b1a0\"}"}',
        "9f8e7d6c5b4a39281706f5e4d3c2b1a0",
    ),
    ("GENERIC_SECRET", r'"{\"token\":\"Zx9Qw8Er7Ty6Ui5Op4As3Df2\"}"', "Zx9Qw8Er7Ty6Ui5Op4As3Df2"),
    (
        "GENERIC_SECRET",
        r'"{\"authorization\": \"Token 9f8e7d6c5b4a39281706f5e4d3\"}"',
        "9f8e7d6c5b4a39281706f5e4d3",
    ),
    ("AWS_SECRET_KEY", rf'"{{\"aws_secret_access_key\": \"{AWS_SECRET}\"}}"', AWS_SECRET),
    # A value may start with a separator.
    ("CONNECTION_STRING_PASSWORD", "password=&Tr0ub4dor3 x", "&Tr0ub4dor3"),
    ("CONNECTION_STRING_PASSWORD", "PASSWORD=,abc123XYZ", ",abc123XYZ"),
    # YAML: a password key that starts its line, nested, named or with a value that is not
    # a plain word (a compose file's environment, a chart's values, a config map).
    ("CONNECTION_STRING_PASSWORD", "db:\n  password: changeme\n", "changeme"),
    ("CONNECTION_STRING_PASSWORD", "environment:\n  DB_PASSWORD: s3cr3t!\n", "s3cr3t!"),
    ("CONNECTION_STRING_PASSWORD", 'DB_PASSWORD: "Tr0ub4dor 3"', "Tr0ub4dor 3"),
    ("CONNECTION_STRING_PASSWORD", "x\npassword: hunter22 # the old one", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "users:\n- passwd: Letmein\n", "Letmein"),
    ("CONNECTION_STRING_PASSWORD", "redis-password:\tTr0ub4dor3", "Tr0ub4dor3"),
    # A colon with blanks before it or none after it; Ruby's and Perl's =>.
    ("CONNECTION_STRING_PASSWORD", "user : bob\npassword : hunter22\n", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "User:bob\nPassword:hunter22\n", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "  :password => 'hunter22',", "hunter22"),
    # A YAML block scalar: the lines below the key, indented deeper.
    ("CONNECTION_STRING_PASSWORD", "password: |\n  hunter22xyz\n", "hunter22xyz"),
    (
        "CONNECTION_STRING_PASSWORD",
        "db:\n  password: >-\n    Tr0ub4dor3\n  user: app\n",
        "Tr0ub4dor3",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "- db_password: |2-  # two lines\r\n\n    line one\r\n    line 2\r\nnext: 1",
        "line one\r\n    line 2",
    ),
    # A quoted key before =>: PHP's arrays (Laravel's config/database.php), Ruby's hashes.
    ("CONNECTION_STRING_PASSWORD", "    'password' => 'hunter22',", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", '{"db_password" => "Tr0ub 4dor"}', "Tr0ub 4dor"),
    # XML: Maven's settings.xml, a .NET appSettings' add element.
    ("GENERIC_SECRET", "<server><id>x</id><password>hunter22</password></server>", "hunter22"),
    ("GENERIC_SECRET", '<add key="ApiKey" value="abc123def456"/>', "abc123def456"),
    # Spring's and Hibernate's XML, Java's properties in XML, WordPress's wp-config.php.
    ("GENERIC_SECRET", '<property name="password" value="hunter22"/>', "hunter22"),
    (
        "GENERIC_SECRET",
        '<property name="hibernate.connection.password">hunter22</property>',
        "hunter22",
    ),
    ("GENERIC_SECRET", '<entry key="db.password">hunter22</entry>', "hunter22"),
    ("GENERIC_SECRET", "<password><![CDATA[Tr0ub<4dor&3]]></password>", "Tr0ub<4dor&3"),
    ("GENERIC_SECRET", "define( 'DB_PASSWORD', 'hunter22' );", "hunter22"),
    ("GENERIC_SECRET", 'define("AUTH_KEY", "x9!kQ2 p#L");', "x9!kQ2 p#L"),
    # A plain word is a password at a line's start as it is nested: only prose words are not.
    ("CONNECTION_STRING_PASSWORD", "password: hunter\n", "hunter"),
    ("CONNECTION_STRING_PASSWORD", "Username: bob\nPassword: letmein\n", "letmein"),
    ("CONNECTION_STRING_PASSWORD", "user: bob\npassword: correct horse\n", "correct horse"),
    ("CONNECTION_STRING_PASSWORD", "password: hunter22 # in the vault\n", "hunter22"),
    # Not code: a password with dots or a bracket, or a word with a comma after it.
    ("CONNECTION_STRING_PASSWORD", "db:\n  password: Summer.Time\n", "Summer.Time"),
    ("CONNECTION_STRING_PASSWORD", "db:\n  password: Tr0ub(4dor\n", "Tr0ub(4dor"),
    ("CONNECTION_STRING_PASSWORD", "db:\n  password: hunter22,\n", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "db:\n  password: MyPassw0rd\n", "MyPassw0rd"),
    # PASS as the last word of a key, or a quoted key of its own: docker inspect's Env, kubectl
    # describe, an Ansible inventory, a JSON config.
    (
        "CONNECTION_STRING_PASSWORD",
        '"Env": ["TZ=UTC", "RABBITMQ_DEFAULT_PASS=guest123"]',
        "guest123",
    ),
    ("CONNECTION_STRING_PASSWORD", "    Environment:\n      REDIS_PASS:  s3cr3tpw\n", "s3cr3tpw"),
    ("CONNECTION_STRING_PASSWORD", "web1 ansible_become_pass=hunter22 x=1", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "all:\n  vars:\n    ansible_ssh_pass: s3cr3t\n", "s3cr3t"),
    ("CONNECTION_STRING_PASSWORD", '{"user": "bob", "pass": "hunter22"}', "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "data:\n  db-pass: aHVudGVyMjI=\n", "aHVudGVyMjI="),
    ("CONNECTION_STRING_PASSWORD", "smtp:\n  smtpPass: hunter22x\n", "hunter22x"),
    ("CONNECTION_STRING_PASSWORD", '{"rootPass": "hunter22"}', "hunter22"),
    # A plain scalar runs to the line's end or a comment: every word of a passphrase.
    (
        "CONNECTION_STRING_PASSWORD",
        "auth:\n  password: correct horse battery # rotated\n  user: app",
        "correct horse battery",
    ),
    ("CONNECTION_STRING_PASSWORD", "  DB_PASSWORD: Tr0ub 4dor 3\r\n", "Tr0ub 4dor 3"),
    # YAML or an env file inside a JSON string (a config map in kubectl -o json), its line
    # ends escaped: the value ends before the escape, which the model still reads.
    (
        "CONNECTION_STRING_PASSWORD",
        r'{"data": {"config.yaml": "db:\n  password: hunter22\n  user: app\n"}}',
        "hunter22",
    ),
    ("CONNECTION_STRING_PASSWORD", r'{"log": "password=hunter22\nnext line"}', "hunter22"),
    # A JSON string's escaped quote is part of the password; a JSON string starts a line (a
    # container's log line in Docker's json-file log).
    ("CONNECTION_STRING_PASSWORD", r'{"password":"Tr0ub\"4dor","user":"app"}', r"Tr0ub\"4dor"),
    (
        "CONNECTION_STRING_PASSWORD",
        r'{"log":"password: hunter22\r\n","stream":"stdout"}',
        "hunter22",
    ),
    ("GENERIC_SECRET", r'{"data": {"app.env": "API_TOKEN=abcdef123456\nX=1"}}', "abcdef123456"),
    # A password after a word: a long option, SQL, .netrc.
    ("CONNECTION_STRING_PASSWORD", "mongo --username bob --password hunter22 db", "hunter22"),
    # OpenSSL's pass: argument and keytool's store and key passwords.
    (
        "CONNECTION_STRING_PASSWORD",
        "openssl enc -aes-256-cbc -pass pass:hunter22 -in x",
        "hunter22",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "openssl pkcs12 -passout 'pass:Tr0ub 4dor' -out x",
        "Tr0ub 4dor",
    ),
    ("CONNECTION_STRING_PASSWORD", "keytool -list -keystore k.jks -storepass hunter22", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "jarsigner -keypass 'Tr0ub 4dor' app.jar", "Tr0ub 4dor"),
    ("CONNECTION_STRING_PASSWORD", "app migrate --db-password 'Tr0ub 4dor'", "Tr0ub 4dor"),
    # An option that starts a line continued from a command's (a script's backslash).
    ("CONNECTION_STRING_PASSWORD", "mongo \\\n  --password hunter22 \\\n  --db app", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "app --password HUNTER22", "HUNTER22"),
    # An option and its value as items of a list: docker inspect's Args, a pod's args.
    (
        "CONNECTION_STRING_PASSWORD",
        '"Args": ["--password", "hunter22", "--port", "5432"]',
        "hunter22",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "    args:\n    - --db-password\n    - Tr0ub4dor3\n",
        "Tr0ub4dor3",
    ),
    ("CONNECTION_STRING_PASSWORD", "command: ['app', '--password', 'two words']", "two words"),
    # Redis's password: redis-server's option (a compose file's command), redis.conf's line.
    (
        "CONNECTION_STRING_PASSWORD",
        "command: redis-server --requirepass hunter22 --appendonly yes",
        "hunter22",
    ),
    ("CONNECTION_STRING_PASSWORD", "# set it\nrequirepass Tr0ub4dor3\n", "Tr0ub4dor3"),
    ("CONNECTION_STRING_PASSWORD", "CREATE USER 'app'@'%' IDENTIFIED BY 'hunter22';", "hunter22"),
    (
        "CONNECTION_STRING_PASSWORD",
        "ALTER USER app IDENTIFIED WITH mysql_native_password BY 's3cr3t';",
        "s3cr3t",
    ),
    ("CONNECTION_STRING_PASSWORD", "CREATE ROLE app WITH LOGIN PASSWORD 'hunter22';", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "machine github.com login bob password hunter22", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "machine db\n  login bob\n  password hunter22\n", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "machine db password hunter22", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "default login anonymous password Tr0ub4dor3", "Tr0ub4dor3"),
    ("CONNECTION_STRING_PASSWORD", "machine a.b\r\nlogin bob\r\npassword hunter22", "hunter22"),
    # An account token beside the login (ftp's), in either order.
    (
        "CONNECTION_STRING_PASSWORD",
        "machine db login bob account ops password hunter22",
        "hunter22",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "machine db\n account ops\n login bob\n password Tr0ub",
        "Tr0ub",
    ),
    # A Secret's data: the password in base64, padded.
    ("CONNECTION_STRING_PASSWORD", "data:\n  password: aHVudGVyMjI=\n", "aHVudGVyMjI="),
    # Azure's connection strings.
    (
        "GENERIC_SECRET",
        f"DefaultEndpointsProtocol=https;AccountName=app;AccountKey={AZURE_KEY};EndpointSuffix=x",
        AZURE_KEY,
    ),
    (
        "GENERIC_SECRET",
        "Endpoint=sb://app.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;"
        f"SharedAccessKey={AZURE_KEY[:44]}",
        AZURE_KEY[:44],
    ),
    # A URL's query parameter named for a credential, as an access log or a proxy shows it.
    ("GENERIC_SECRET", "GET /api/v1/items?token=abc123def456ghi789 HTTP/1.1", "abc123def456ghi789"),
    (
        "GENERIC_SECRET",
        '10.0.0.1 - - "GET /cb?code=x&access_token=ya29.a0AfH6SMBx1234abcd&state=y HTTP/1.1"',
        "ya29.a0AfH6SMBx1234abcd",
    ),
    ("GENERIC_SECRET", "https://api.example.com/v2/x?api_key=9f86d081&page=2", "9f86d081"),
    (
        "GENERIC_SECRET",
        "https://app.blob.core.windows.net/c/b?sv=2022-11-02&sr=b&sig=u1Xk%2Fq9rT0pLx8sWcY1uN%3D",
        "u1Xk%2Fq9rT0pLx8sWcY1uN%3D",
    ),
    # Cookies: every cookie of a Cookie header, the one a Set-Cookie header sets.
    (
        "GENERIC_SECRET",
        "> Cookie: theme=dark; sessionid=8f14e45fceea167a5a36dedd4bea",
        "8f14e45fceea167a5a36dedd4bea",
    ),
    (
        "GENERIC_SECRET",
        "< Set-Cookie: session=s%3Aabc123def456.xyzXYZ0987; Path=/; HttpOnly",
        "s%3Aabc123def456.xyzXYZ0987",
    ),
    (
        "GENERIC_SECRET",
        '{"Cookie": "lang=en; sid=abcDEF123456xyz", "Host": "x"}',
        "abcDEF123456xyz",
    ),
    # Vault's tokens, as vault login and vault token lookup print them.
    (
        "GENERIC_SECRET",
        "token            hvs.CAESIJ1aB2cD3eF4gH5iJ6kL7mN8oP9qR0sT1uV2wX3yZ4a\nrenewable true",
        "hvs.CAESIJ1aB2cD3eF4gH5iJ6kL7mN8oP9qR0sT1uV2wX3yZ4a",
    ),
    (
        "GENERIC_SECRET",
        "X-Vault-Token: hvb.AAAAAQJ8kZ0x9Lq3Vb7Nc2Mw5Ht1Ry4Ue6Io8Pa0Sd2Fg4Hj6",
        "hvb.AAAAAQJ8kZ0x9Lq3Vb7Nc2Mw5Ht1Ry4Ue6Io8Pa0Sd2Fg4Hj6",
    ),
    # An SSM SecureString parameter, as aws ssm get-parameter --with-decryption prints it.
    (
        "GENERIC_SECRET",
        '{\n    "Parameter": {\n        "Name": "/prod/db/password",\n'
        '        "Type": "SecureString",\n        "Value": "hunter 22",\n        "Version": 3',
        "hunter 22",
    ),
    # A sensitive output, as terraform output -json prints it.
    (
        "GENERIC_SECRET",
        '{\n  "db_password": {\n    "sensitive": true,\n    "type": "string",\n'
        '    "value": "hunter22"\n  }\n}',
        "hunter22",
    ),
    # aws secretsmanager get-secret-value: the SecretString, whatever it holds.
    (
        "GENERIC_SECRET",
        '{\n    "Name": "prod/api",\n    "SecretString": "k3yv4lu3-plain",\n'
        '    "VersionStages": []',
        "k3yv4lu3-plain",
    ),
    # vault kv get: every value of the Data table; vault read: the secret-named rows.
    ("GENERIC_SECRET", VAULT_KV, "k3yv4lu3"),
    ("GENERIC_SECRET", VAULT_READ, "A1a-EkPXWxYz9q"),
    # Under a terminal (kubectl exec -t, ssh -t) each line ends in CRLF.
    ("GENERIC_SECRET", VAULT_KV.replace("\n", "\r\n"), "k3yv4lu3"),
    ("GENERIC_SECRET", VAULT_READ.replace("\n", "\r\n"), "A1a-EkPXWxYz9q"),
    # An environment given as name and value (a pod's spec, an ECS task definition).
    ("GENERIC_SECRET", "env:\n- name: DB_PASSWORD\n  value: hunter22\n", "hunter22"),
    ("GENERIC_SECRET", '    - name: API_TOKEN\n      value: "abc def"', "abc def"),
    ("GENERIC_SECRET", '[{"name": "STRIPE_SECRET", "value": "s3cr3t"}]', "s3cr3t"),
    ("GENERIC_SECRET", "{'name': 'Signing_Key', 'value': 'k3y!'}", "k3y!"),
    (
        "GENERIC_SECRET",
        '"env": [\n    {\n        "name": "DB_PASSWORD",\n        "value": "hunter22"\n    }\n]',
        "hunter22",
    ),
    (
        "GENERIC_SECRET",
        "- name: DB_PASSPHRASE\n  value: correct horse battery\n",
        "correct horse battery",
    ),
    # A passphrase keeps every word, a prose word among them too: prose starts or ends with
    # one, or is made of them.
    ("CONNECTION_STRING_PASSWORD", "password: open sesame and more\n", "open sesame and more"),
    (
        "CONNECTION_STRING_PASSWORD",
        "  password: correct horse battery staple is the best\n",
        "correct horse battery staple is the best",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "password: grape strong lunar pillow",
        "grape strong lunar pillow",
    ),
    # key = value at a line's start (an INI file, my.cnf, .properties, .env, env's output): the
    # value runs to the line's end, or a comment, or the next key=.
    (
        "CONNECTION_STRING_PASSWORD",
        "[client]\npassword = correct horse battery staple\nuser = app",
        "correct horse battery staple",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "HOSTNAME=web-1\nDB_PASSWORD=correct horse battery staple\nTZ=UTC",
        "correct horse battery staple",
    ),
    ("CONNECTION_STRING_PASSWORD", "password = two words # rotated\n", "two words"),
    ("CONNECTION_STRING_PASSWORD", "password=hunter22 dbname=app sslmode=require", "hunter22"),
    # A passphrase's words that source code's expressions use too: code's only beside a call.
    (
        "CONNECTION_STRING_PASSWORD",
        "[client]\nuser = app\npassword = salt and pepper - 42\n",
        "salt and pepper - 42",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "HOSTNAME=web-1\nDB_PASSWORD=fish or chips if not in\nTZ=UTC",
        "fish or chips if not in",
    ),
    # After a key that names a secret, a generated value with dashes is no object's name.
    ("GENERIC_SECRET", "secret: a1b2-c3d4-e5f6\n", "a1b2-c3d4-e5f6"),
    ("GENERIC_SECRET", "token: abcdef-123456\n", "abcdef-123456"),
    (
        "GENERIC_SECRET",
        "client_secret: 123e4567-e89b-12d3-a456-426614174000",
        "123e4567-e89b-12d3-a456-426614174000",
    ),
    # A client's, an API's or a webhook's secret is a value, never a Secret's name: a
    # memorable password in words is redacted there.
    ("GENERIC_SECRET", "client_secret: purple-monkey-dishwasher-42", "purple-monkey-dishwasher-42"),
    ("GENERIC_SECRET", '{"webhookSecret": "lunar-grape7-pillow"}', "lunar-grape7-pillow"),
    # Unlabelled, in the shape of a well-known file or output. .pgpass: host:port:db:user:pw.
    (
        "CONNECTION_STRING_PASSWORD",
        "db.internal:5432:appdb:appuser:S3cretPgPass\n",
        "S3cretPgPass",
    ),
    ("CONNECTION_STRING_PASSWORD", "*:*:*:postgres:hunter22", "hunter22"),
    ("CONNECTION_STRING_PASSWORD", "$ cat ~/.pgpass\ndb:6432:*:app:two words", "two words"),
    # Written by echo (a CI job, a Dockerfile's RUN), quoted or not; a managed database's
    # five-digit port (DigitalOcean's 25060).
    (
        "CONNECTION_STRING_PASSWORD",
        "+ echo 'db.internal:5432:appdb:appuser:S3cretPgPass' >> ~/.pgpass",
        "S3cretPgPass",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        'RUN echo "*:*:*:postgres:two words" > /root/.pgpass',
        "two words",
    ),
    ("CONNECTION_STRING_PASSWORD", "echo db.x:5432:app:app:S3cretPg >> .pgpass", "S3cretPg"),
    (
        "CONNECTION_STRING_PASSWORD",
        "db-pg.b.db.ondigitalocean.com:25060:defaultdb:doadmin:S3cretPgPass",
        "S3cretPgPass",
    ),
    # .htpasswd's and /etc/shadow's hashes: MD5-crypt, bcrypt, SHA-crypt, yescrypt, {SHA}.
    (
        "GENERIC_SECRET",
        "admin:$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/",
        "$apr1$r31.....$HqJZimcKQFAMYayBlzkrA/",
    ),
    (
        "GENERIC_SECRET",
        "bob:$2y$05$6S6KW8g8Mt7vWRAmPbdvPeuwaqkcqPAHX94Kk0XLJsPCJ8RYrMOGm",
        "$2y$05$6S6KW8g8Mt7vWRAmPbdvPeuwaqkcqPAHX94Kk0XLJsPCJ8RYrMOGm",
    ),
    (
        "GENERIC_SECRET",
        "carol:$6$saltsalt$qFmFH.bQmmtXzyBY0s9v7Oicd2z4XSIecDzlB5KiA2/jctKu9YterLp8ww:19000:0:",
        "$6$saltsalt$qFmFH.bQmmtXzyBY0s9v7Oicd2z4XSIecDzlB5KiA2/jctKu9YterLp8ww",
    ),
    (
        "GENERIC_SECRET",
        "dave:$y$j9T$F5Jx5fExrKuPp53xLKQ..1$X3DX6M94c7o.9agCG9G317fhZg9SqC.5i5rd.RhAtQ7:19000::",
        "$y$j9T$F5Jx5fExrKuPp53xLKQ..1$X3DX6M94c7o.9agCG9G317fhZg9SqC.5i5rd.RhAtQ7",
    ),
    (
        "GENERIC_SECRET",
        "alice:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=",
        "{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=",
    ),
    # LDAP's other schemes (OpenLDAP's pw-sha2, 389 Directory Server's and FreeIPA's PBKDF2),
    # in an LDIF's userPassword too; argon2 in its modular form.
    (
        "GENERIC_SECRET",
        "userPassword: {SSHA512}mAmPaElro8MJT/+2ohnmww5w7khtVXJFkXDAy8XDcxOPwcPLePW0CbNMVMRYxOE8"
        "81ntDBHHfBHceDyzpq562nNhbHRzYWx0\n",
        "{SSHA512}mAmPaElro8MJT/+2ohnmww5w7khtVXJFkXDAy8XDcxOPwcPLePW0CbNMVMRYxOE881ntDBHHfBHce"
        "Dyzpq562nNhbHRzYWx0",
    ),
    (
        "GENERIC_SECRET",
        "bob:{PBKDF2_SHA256}T7epWfxBHiKQQGlNJ3+9CM17dQuKVeWu++anuIAf6vhzYWx0c2FsdHNhbHQ=",
        "{PBKDF2_SHA256}T7epWfxBHiKQQGlNJ3+9CM17dQuKVeWu++anuIAf6vhzYWx0c2FsdHNhbHQ=",
    ),
    ("GENERIC_SECRET", "carol {MD5}AQEBAQEBAQEBAQEBAQEBAQ== x", "{MD5}AQEBAQEBAQEBAQEBAQEBAQ=="),
    (
        "GENERIC_SECRET",
        "admin_hash $argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$T7epWfxBHiKQQGlNJ3+9CM17dQuKVeWu",
        "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$T7epWfxBHiKQQGlNJ3+9CM17dQuKVeWu",
    ),
    # A Dockerfile's ENV in its legacy form, name and value apart: the value is the line's rest.
    ("GENERIC_SECRET", "FROM node:20\nENV API_KEY abc123def456ghi\n", "abc123def456ghi"),
    ("GENERIC_SECRET", "ENV DB_PASSWORD correct horse battery\n", "correct horse battery"),
    # Inside a JSON string (docker inspect's history, CreatedBy): the value ends at its quote.
    (
        "GENERIC_SECRET",
        '"CreatedBy": "/bin/sh -c #(nop)  ENV DB_PASSWORD two words",\n',
        "two words",
    ),
    (
        "GENERIC_SECRET",
        '{"CreatedBy":"/bin/sh -c #(nop)  ENV API_TOKEN abcdef123456"}',
        "abcdef123456",
    ),
    # Windows's cmdkey and an Oracle login (sqlplus, a thin JDBC URL): user/password@db.
    (
        "CONNECTION_STRING_PASSWORD",
        "cmdkey /add:srv01 /user:CORP\\admin /pass:Hunter22!",
        "Hunter22!",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        'cmdkey /generic:TERMSRV/h /user:a /pass:"P@ss w0rd"',
        "P@ss w0rd",
    ),
    ("CONNECTION_STRING_PASSWORD", "jdbc:oracle:thin:scott/tiger@db:1521/ORCL", "tiger"),
    ("CONNECTION_STRING_PASSWORD", "$ sqlplus -s scott/Tiger22@ORCL @report.sql", "Tiger22"),
    # A command that prints one secret, echoed above what it printed (a shell's transcript,
    # set -x, a CI log): the line after it is the secret.
    (
        "GENERIC_SECRET",
        "$ terraform output -raw db_password\nSup3rS3cretPw!\n$ ls",
        "Sup3rS3cretPw!",
    ),
    ("GENERIC_SECRET", '+ tofu output admin_token\n"abc def"\n', '"abc def"'),
    # terraform's global options before output (a CI job's -chdir), blanks, a quoted name.
    (
        "GENERIC_SECRET",
        "+ terraform -chdir=infra output -raw db_password\nSup3rS3cretPw!\n",
        "Sup3rS3cretPw!",
    ),
    ("GENERIC_SECRET", "$ terraform  output  -raw 'db_password'\nSup3rS3cretPw!", "Sup3rS3cretPw!"),
    (
        "GENERIC_SECRET",
        "$ tofu output -state=prod.tfstate -raw db_password\nSup3rS3cretPw!",
        "Sup3rS3cretPw!",
    ),
    (
        "GENERIC_SECRET",
        "$ heroku config:get SESSION_SECRET -a web\nhunter2isnotsafe",
        "hunter2isnotsafe",
    ),
    ("GENERIC_SECRET", "$ vault kv get -field=value secret/app/db\nhunter22", "hunter22"),
    # -field given apart; a secret-named field of vault's other commands (dynamic database
    # credentials, a token); a profile's key that aws configure get prints.
    ("GENERIC_SECRET", "$ vault kv get -field value secret/app/db\nhunter22", "hunter22"),
    ("GENERIC_SECRET", "$ vault read -field=password database/creds/app\nA1a-Xk9q", "A1a-Xk9q"),
    ("GENERIC_SECRET", "+ vault token create -field=token -ttl=1h\nhvs_x.A1aXk9q", "hvs_x.A1aXk9q"),
    (
        "GENERIC_SECRET",
        "$ aws configure get profile.prod.aws_secret_access_key\nabcDEF123ghi",
        "abcDEF123ghi",
    ),
    (
        "GENERIC_SECRET",
        "$ kubectl get secret db -o jsonpath='{.data.password}' | base64 -d\nhunter22\n",
        "hunter22",
    ),
    ("GENERIC_SECRET", "gcloud secrets versions access latest --secret=db\nhunter22", "hunter22"),
    # An RFC 4716 (SSH2) private key, as PuTTYgen and ssh-keygen -e write it.
    (
        "PRIVATE_KEY",
        '---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: "rsa-key"\nP2/56wAAAi4AAAA3aWYtbW9k\n'
        "---- END SSH2 ENCRYPTED PRIVATE KEY ----\n",
        '---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: "rsa-key"\nP2/56wAAAi4AAAA3aWYtbW9k\n'
        "---- END SSH2 ENCRYPTED PRIVATE KEY ----",
    ),
    # More clients' password flags: cloud and cluster logins, Cassandra, SQL Server, a BMC,
    # LDAP, Samba's user%password, FreeRDP, InfluxDB's single-dash -password.
    (
        "CONNECTION_STRING_PASSWORD",
        "az login --service-principal -u app -p Xy7~abcDEF.12345 --tenant t1",
        "Xy7~abcDEF.12345",
    ),
    ("CONNECTION_STRING_PASSWORD", "oc login -u dev -p S3cretDev https://api:6443", "S3cretDev"),
    ("CONNECTION_STRING_PASSWORD", "cf login -a https://api.x -u admin -p S3cretCf", "S3cretCf"),
    ("CONNECTION_STRING_PASSWORD", "cqlsh -u cassandra -p S3cretCq db1", "S3cretCq"),
    ("CONNECTION_STRING_PASSWORD", 'sqlcmd -S db -U sa -P S3cretSql -Q "select 1"', "S3cretSql"),
    (
        "CONNECTION_STRING_PASSWORD",
        "ipmitool -I lanplus -H b1 -U admin -P S3cretIp power on",
        "S3cretIp",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "ldapsearch -x -D cn=admin,dc=example,dc=org -w S3cretLdap -b dc=example,dc=org",
        "S3cretLdap",
    ),
    ("CONNECTION_STRING_PASSWORD", "smbclient //srv/share -U alice%S3cretSmb -c ls", "S3cretSmb"),
    # Samba's user quoted with a blank in its password, or given as --user; -w glued.
    (
        "CONNECTION_STRING_PASSWORD",
        "smbclient //srv/share -U 'CORP\\alice%two words' -c ls",
        "two words",
    ),
    ("CONNECTION_STRING_PASSWORD", "smbclient //srv/share --user=alice%S3cretSmb", "S3cretSmb"),
    ("CONNECTION_STRING_PASSWORD", "rpcclient srv --user alice%S3cretSmb", "S3cretSmb"),
    ("CONNECTION_STRING_PASSWORD", "ldapwhoami -x -D cn=admin -wS3cretLdap", "S3cretLdap"),
    ("CONNECTION_STRING_PASSWORD", "xfreerdp /v:host /u:admin /p:S3cretRdp", "S3cretRdp"),
    ("CONNECTION_STRING_PASSWORD", "influx -username admin -password S3cretIdb", "S3cretIdb"),
    # Azure's keys: a storage account's (az storage account keys list), Service Bus's and
    # Event Hubs' (authorization-rule keys list); and aws configure get of a secret.
    (
        "GENERIC_SECRET",
        '[\n  {\n    "creationTime": "2024-05-01T12:00:00+00:00",\n    "keyName": "key1",\n'
        '    "permissions": "FULL",\n'
        '    "value": "AbCdEf0123456789AbCdEf0123+/AbCdEf0123456789AbCdEf==="\n  }\n]',
        "AbCdEf0123456789AbCdEf0123+/AbCdEf0123456789AbCdEf===",
    ),
    # The same keys as -o yaml, -o tsv and -o table print them.
    (
        "GENERIC_SECRET",
        "- creationTime: '2024-05-01T12:00:00+00:00'\n  keyName: key1\n  permissions: FULL\n"
        "  value: AbCdEf0123456789AbCdEf0123+/AbCdEf0123456789AbCdEf==\n",
        "AbCdEf0123456789AbCdEf0123+/AbCdEf0123456789AbCdEf==",
    ),
    (
        "GENERIC_SECRET",
        "2024-05-01T12:00:00+00:00\tkey1\tFULL\tAbCdEf0123456789AbCdEf0123+/AbCdEf012345==\n",
        "AbCdEf0123456789AbCdEf0123+/AbCdEf012345==",
    ),
    (
        "GENERIC_SECRET",
        "KeyName    Permissions    Value\n---------  -------------  -----\n"
        "key2       FULL           AbCdEf0123456789AbCdEf0123+/AbCdEf012345==",
        "AbCdEf0123456789AbCdEf0123+/AbCdEf012345==",
    ),
    (
        "GENERIC_SECRET",
        '{"keyName": "RootManageSharedAccessKey",'
        ' "primaryKey": "AbCdEf0123456789AbCdEf0123456789AbCdEf01234="}',
        "AbCdEf0123456789AbCdEf0123456789AbCdEf01234=",
    ),
    (
        "GENERIC_SECRET",
        "$ aws configure get aws_secret_access_key\nwJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    # A password as a command's positional argument: htpasswd's batch mode, chpasswd's input,
    # rabbitmqctl change_password.
    (
        "CONNECTION_STRING_PASSWORD",
        "htpasswd -b -c /etc/nginx/.htpasswd alice S3cretHt",
        "S3cretHt",
    ),
    ("CONNECTION_STRING_PASSWORD", "htpasswd -nbB -C 10 alice 'two words'", "two words"),
    ("CONNECTION_STRING_PASSWORD", "echo 'alice:S3cretChpw' | sudo chpasswd", "S3cretChpw"),
    ("CONNECTION_STRING_PASSWORD", "rabbitmqctl change_password app S3cretRab", "S3cretRab"),
    # Unspaced, printed by printf, or one of several users' lines; rabbitmqctl add_user.
    ("CONNECTION_STRING_PASSWORD", "echo alice:S3cretChpw|chpasswd", "S3cretChpw"),
    ("CONNECTION_STRING_PASSWORD", "printf 'alice:S3cretChpw\\n' | chpasswd", "S3cretChpw"),
    ("CONNECTION_STRING_PASSWORD", "rabbitmqctl add_user app 'S3cret Rab'", "S3cret Rab"),
    # Inside a line "password:" is mostly prose, but an installer's generated password, the
    # line's last word and mixing three kinds of character, is none.
    (
        "CONNECTION_STRING_PASSWORD",
        "Generated root password: Xk9#mP2$vL7@qR4!\n",
        "Xk9#mP2$vL7@qR4!",
    ),
    ("CONNECTION_STRING_PASSWORD", "[init] Grafana admin password: admin123X", "admin123X"),
    # A terminal's line end (kubectl exec -t) with the output's last newline cut off.
    ("CONNECTION_STRING_PASSWORD", "Generated root password: Xk9#mP2$vL7q\r", "Xk9#mP2$vL7q"),
    ("CONNECTION_STRING_PASSWORD", "The admin password is: Xk9#mP2$vL7q \r", "Xk9#mP2$vL7q"),
    (
        "CONNECTION_STRING_PASSWORD",
        "[Note] [MY-010454] [Server] A temporary password is generated for root@localhost: "
        "Xk9#mP2$vL7@\n",
        "Xk9#mP2$vL7@",
    ),
    ("CONNECTION_STRING_PASSWORD", "The generated admin password is: aB3dE5fG7hJ9", "aB3dE5fG7hJ9"),
    # A file named for a secret, printed with cat under its echoed command line.
    (
        "GENERIC_SECRET",
        "$ cat /var/jenkins_home/secrets/initialAdminPassword\n3f9a1c2e4b5d6f708192a3b4c5d6e7f8",
        "3f9a1c2e4b5d6f708192a3b4c5d6e7f8",
    ),
    # With cat's options, the name quoted, or an echo after it for the line end a secret lacks.
    ("GENERIC_SECRET", "$ cat /run/secrets/db_password; echo\nPw1xyz\n$ ls", "Pw1xyz"),
    ("GENERIC_SECRET", "+ cat -v '/run/secrets/db_password' && echo\nPw1xyz", "Pw1xyz"),
    ("GENERIC_SECRET", '$ cat "secrets/api token.txt"\nPw1xyz', "Pw1xyz"),
    # Slack's browser session: an xoxc- token and its d cookie (xoxd-, URL-encoded); a rotating
    # token whole, its xoxe. prefix too.
    (
        "SLACK_TOKEN",
        '{"token": "xoxc-1234567890-1234567890123-abcdef0123456789abcdef0123"}',
        "xoxc-1234567890-1234567890123-abcdef0123456789abcdef0123",
    ),
    (
        "SLACK_TOKEN",
        "Cookie: d=xoxd-aBcD1234eFgH5678%2FiJkL9012mNoP3456%3D",
        "xoxd-aBcD1234eFgH5678%2FiJkL9012mNoP3456%3D",
    ),
    # Encoded in small letters, or decoded (a browser's cookie view): base64's / + and =.
    (
        "SLACK_TOKEN",
        "d=xoxd-aBcD1234eFgH5678%2fiJkL9012%2bmNoP3456%3d; d-s=1",
        "xoxd-aBcD1234eFgH5678%2fiJkL9012%2bmNoP3456%3d",
    ),
    (
        "SLACK_TOKEN",
        "d: xoxd-aBcD1234eFgH5678/iJkL9012+mNoP3456==",
        "xoxd-aBcD1234eFgH5678/iJkL9012+mNoP3456==",
    ),
    (
        "SLACK_TOKEN",
        "refresh: xoxe.xoxp-1-Mi0yLTEyMzQ1Njc4OTAtMTIzNDU2Nzg5MDEy",
        "xoxe.xoxp-1-Mi0yLTEyMzQ1Njc4OTAtMTIzNDU2Nzg5MDEy",
    ),
    # docker inspect's Env: each variable a JSON string, its value to the closing quote.
    (
        "CONNECTION_STRING_PASSWORD",
        '"Env": [\n    "MYSQL_ROOT_PASSWORD=correct horse, battery",\n    "TZ=UTC"\n]',
        "correct horse, battery",
    ),
]


# A Kubernetes Secret's data, whatever its keys are named: kubectl get secret -o yaml and -o
# json (keys sorted, so kind comes after data), a manifest (kind before stringData), a List.
SECRET_YAML = """apiVersion: v1
data:
  api: c2VjcmV0MTIz
  ca.crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t
  webhook: aHR0cHM6Ly9leGFtcGxl
kind: Secret
metadata:
  name: app
type: Opaque
"""
SECRET_MANIFEST = """---
apiVersion: v1
kind: Secret
metadata:
  name: app
stringData:
  config.ini: |
    [auth]
    key = plainvalue
  endpoint: "https://x.example/hook/abc"
---
apiVersion: v1
kind: ConfigMap
data:
  level: debug
"""
SECRET_JSON = """{
    "apiVersion": "v1",
    "items": [
        {
            "apiVersion": "v1",
            "data": {
                "api": "c2VjcmV0MTIz",
                "webhook": "aHR0cHM6Ly9leGFtcGxl"
            },
            "kind": "Secret",
            "metadata": {
                "name": "app"
            }
        },
        {
            "apiVersion": "v1",
            "data": {
                "level": "debug"
            },
            "kind": "ConfigMap"
        }
    ],
    "kind": "List"
}"""
SECRET_LIST = """apiVersion: v1
items:
- apiVersion: v1
  data:
    level: debug
  kind: ConfigMap
- apiVersion: v1
  data:
    api: c2VjcmV0MTIz
  kind: Secret
kind: List
"""


# kubectl apply keeps the manifest it applied in an annotation, as JSON on one line (escaped
# once more in -o json's string).
SECRET_APPLIED = """metadata:
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: |
      {"apiVersion":"v1","data":{"api":"c2VjcmV0MTIz","x":"eHl6"},"kind":"Secret","metadata":{"name":"app"}}
"""
SECRET_APPLIED_JSON = (
    '"kubectl.kubernetes.io/last-applied-configuration": "{\\"apiVersion\\":\\"v1\\",'
    '\\"kind\\":\\"Secret\\",\\"stringData\\":{\\"api\\":\\"plain-value\\"}}\\n"'
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SECRET_APPLIED, ["c2VjcmV0MTIz", "eHl6"]),
        (SECRET_APPLIED_JSON, ["plain-value"]),
        (SECRET_YAML, ["c2VjcmV0MTIz", "aHR0cHM6Ly9leGFtcGxl"]),
        (SECRET_MANIFEST, ["[auth]\n    key = plainvalue", "https://x.example/hook/abc"]),
        (SECRET_JSON, ["c2VjcmV0MTIz", "aHR0cHM6Ly9leGFtcGxl"]),
        (SECRET_LIST, ["c2VjcmV0MTIz"]),
    ],
    ids=["applied", "applied-json", "yaml", "manifest", "json", "list"],
)
def test_a_kubernetes_secrets_data_is_redacted_whatever_its_keys(
    text: str, expected: list[str]
) -> None:
    assert found(text, "GENERIC_SECRET") == expected


def test_a_config_maps_data_is_left() -> None:
    text = SECRET_YAML.replace("kind: Secret", "kind: ConfigMap")
    assert found(text, "GENERIC_SECRET") == []


@pytest.mark.parametrize(("entity", "text", "expected"), TRUE_POSITIVES)
def test_true_positive(entity: str, text: str, expected: str) -> None:
    assert found(text, entity) == [expected]


FALSE_POSITIVES: list[tuple[str, str]] = [
    # EMAIL_ADDRESS
    ("EMAIL_ADDRESS", "@app.route('/x')"),
    ("EMAIL_ADDRESS", "npm i @types/node"),
    ("EMAIL_ADDRESS", "ssh user@localhost"),
    ("EMAIL_ADDRESS", "pip install pkg@1.2.3"),
    ("EMAIL_ADDRESS", "image nginx@sha256:abcdef0123"),
    ("EMAIL_ADDRESS", "postgres://app:secret@db.example.com/app"),
    ("EMAIL_ADDRESS", "https://user@example.com/path"),
    ("EMAIL_ADDRESS", "x@-bad.com"),
    ("EMAIL_ADDRESS", "foo@bar.c"),
    # scp's user@host:path: git's remotes, rsync and scp command lines.
    ("EMAIL_ADDRESS", "origin\tgit@github.com:acme/api.git (fetch)"),
    ("EMAIL_ADDRESS", "scp deploy@web1.example.com:/var/log/app.log ."),
    # PHONE_NUMBER
    ("PHONE_NUMBER", "2024-05-01 12:34:56"),
    ("PHONE_NUMBER", "2024-05-01T12:34:56.789+02:00"),
    ("PHONE_NUMBER", "request_id=123e4567-e89b-12d3-a456-426614174000"),
    ("PHONE_NUMBER", '{"ts": 1714567890123}'),
    ("PHONE_NUMBER", "offset +0000 tz +05:30"),
    ("PHONE_NUMBER", "Chrome/124.0.6367.91"),
    ("PHONE_NUMBER", "123-456-7890"),
    ("PHONE_NUMBER", "00 00 00 00 00 00 00 00"),
    ("PHONE_NUMBER", "01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"),
    ("PHONE_NUMBER", "sizes 512 256 1024"),
    ("PHONE_NUMBER", "+12 points, +1234 lines"),
    ("PHONE_NUMBER", "ISBN 978-3-16-148410-0"),
    ("PHONE_NUMBER", "12/25/2024 and 2024/05/01"),
    ("PHONE_NUMBER", "1,234,567 rows"),
    ("PHONE_NUMBER", "port 8080 pid 12345 version 10.2.3"),
    ("PHONE_NUMBER", "01.02.2024 12:00"),
    ("PHONE_NUMBER", "HTTP/1.1 200 90493"),
    ("PHONE_NUMBER", "3.14159265358979"),
    # CREDIT_CARD
    ("CREDIT_CARD", "4111111111111112"),
    ("CREDIT_CARD", "1234567812345670"),
    ("CREDIT_CARD", '{"ts": 1714567890123}'),
    ("CREDIT_CARD", "guild 1222661216587828173"),
    ("CREDIT_CARD", "4111111111111111111"),
    ("CREDIT_CARD", "4111 1111 1111 1112"),
    ("CREDIT_CARD", "0000 0000 0000 0000"),
    ("CREDIT_CARD", "a4111111111111111b"),
    ("CREDIT_CARD", "v4.111.1111.1111.1111"),
    # IBAN_CODE
    ("IBAN_CODE", "DE89370400440532013001"),
    ("IBAN_CODE", "XX89370400440532013000"),
    ("IBAN_CODE", "DE8937040044053201300"),
    ("IBAN_CODE", "DE893704004405320130001"),
    ("IBAN_CODE", "HTTP/1.1 UTF8 AB12"),
    # IP_ADDRESS
    ("IP_ADDRESS", "999.1.1.1"),
    ("IP_ADDRESS", "1.2.3"),
    ("IP_ADDRESS", "oid 1.2.3.4.5"),
    ("IP_ADDRESS", "v1.2.3.4"),
    ("IP_ADDRESS", "Mozilla/5.0 Chrome/124.0.0.0"),
    ("IP_ADDRESS", "12:34:56"),
    ("IP_ADDRESS", "std::vector<int> Foo::bar"),
    ("IP_ADDRESS", "mac 00:1A:2B:3C:4D:5E"),
    ("IP_ADDRESS", "01.02.03.04"),
    ("IP_ADDRESS", "1.2.3.4a"),
    # US_SSN
    ("US_SSN", "000-12-3456"),
    ("US_SSN", "666-12-3456"),
    ("US_SSN", "900-12-3456"),
    ("US_SSN", "123-00-4567"),
    ("US_SSN", "123-45-0000"),
    ("US_SSN", "123-45-67890"),
    ("US_SSN", "a123-45-6789"),
    ("US_SSN", "123.45.6789"),
    ("US_SSN", "2024-05-01"),
    # AWS_ACCESS_KEY
    ("AWS_ACCESS_KEY", "AKIAIOSFODNN7EXAMPL"),
    ("AWS_ACCESS_KEY", "AKIAIOSFODNN7EXAMPLE1"),
    ("AWS_ACCESS_KEY", "XAKIAIOSFODNN7EXAMPLE"),
    ("AWS_ACCESS_KEY", "AKIAiosfodnn7example"),
    # AWS_SECRET_KEY
    ("AWS_SECRET_KEY", f"secret_key = {AWS_SECRET}"),
    ("AWS_SECRET_KEY", "aws_secret_access_key = short"),
    ("AWS_SECRET_KEY", f"aws_secret_access_key = {AWS_SECRET}X"),
    ("AWS_SECRET_KEY", AWS_SECRET),
    # GITHUB_TOKEN
    ("GITHUB_TOKEN", "ghp_short"),
    ("GITHUB_TOKEN", f"ghx_{GH_BODY}"),
    ("GITHUB_TOKEN", f"xghp_{GH_BODY}"),
    ("GITHUB_TOKEN", "github_pat_short"),
    # SLACK_TOKEN
    ("SLACK_TOKEN", "xoxb- placeholder"),
    ("SLACK_TOKEN", "xoxb-abcdefghijkl"),
    ("SLACK_TOKEN", "xoxz-123456789012"),
    # DISCORD_TOKEN: the first part must be a snowflake id in base64
    ("DISCORD_TOKEN", "MTIzNDU2Nzg5MGFiY2RlZmdoaWo.GkX2bT.Vq3mZ9rT0pLx8sWcY1uNd4HfJbKe7gA"),
    ("DISCORD_TOKEN", "Mozilla5CompatibleWindowsNT.x86_64.AppleWebKitKHTMLlikeGeckoChrome"),
    ("DISCORD_TOKEN", "MTA4OTk3NjU0MzIxMDk4NzY1NA.GkX2bT.short"),
    ("DISCORD_TOKEN", f"x{DISCORD}"),
    ("DISCORD_TOKEN", "see https://discord.com/developers/docs/resources/webhook"),
    (
        "SLACK_TOKEN",
        "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    ),
    ("SLACK_TOKEN", "POST https://hooks.slack.com/services/ returns 404"),
    # OPENAI_API_KEY
    ("OPENAI_API_KEY", "sk-learn-is-a-python-library-for-machine-learning"),
    ("OPENAI_API_KEY", "sk-00000000000000000000000000000000"),
    ("OPENAI_API_KEY", "sk-deadbeefdeadbeefdeadbeefdeadbeef"),
    ("OPENAI_API_KEY", "task-1234567890ABCDEFGHIJabcdefghij12345"),
    ("OPENAI_API_KEY", "sk-short1A"),
    # STRIPE_KEY
    ("STRIPE_KEY", "pk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    ("STRIPE_KEY", "sk_live_short"),
    ("STRIPE_KEY", "disk_live_4eC39HqLyjWDarjtT1zdp7dc"),
    # NPM_TOKEN: npm's configuration and package variables, a token cut short or run on
    ("NPM_TOKEN", "npm_config_cache=/home/runner/.npm npm_package_version=1.2.3"),
    ("NPM_TOKEN", "npm_lifecycle_event=build npm_config_user_agent=npm/10.2.4"),
    ("NPM_TOKEN", NPM[:-1]),
    ("NPM_TOKEN", f"{NPM}X"),
    ("NPM_TOKEN", f"x{NPM}"),
    ("NPM_TOKEN", "npm_installationdirectorypermissionerror"),
    # PYPI_TOKEN: the prefix alone, as docs quote it; another macaroon's
    ("PYPI_TOKEN", "PyPI tokens start with pypi-AgEIcHlwaS5vcmc, then a long body"),
    ("PYPI_TOKEN", PYPI[:60]),
    ("PYPI_TOKEN", "pypi-AgEIcHlwaS5vcmd" + PYPI[20:]),
    # SENDGRID_API_KEY: SG. in prose, in a word, parts of the wrong length
    ("SENDGRID_API_KEY", "Signed off by SG. Tan; see MSG.BWkNhBm2bd2AG2_B2TFu2a for the id"),
    ("SENDGRID_API_KEY", f"M{SENDGRID}"),
    ("SENDGRID_API_KEY", f"{SENDGRID}x"),
    ("SENDGRID_API_KEY", SENDGRID.replace(".Wo_", ".o_")),
    ("SENDGRID_API_KEY", "SG.short.token"),
    # HUGGINGFACE_TOKEN: huggingface_hub's names, a long word, too short or too long
    ("HUGGINGFACE_TOKEN", "from huggingface_hub import hf_hub_download, hf_hub_url"),
    ("HUGGINGFACE_TOKEN", "pip install hf_transfer; HF_HUB_ENABLE_HF_TRANSFER=1"),
    ("HUGGINGFACE_TOKEN", "hf_resolvedrepositoryfilenamelookups"),
    ("HUGGINGFACE_TOKEN", "hf_AmSJkmIKCziEghpqGzTYdXtyNB_lWWWqWib"),
    ("HUGGINGFACE_TOKEN", "hf_AmSJkmIKCziEghpqGzTYdX"),
    ("HUGGINGFACE_TOKEN", f"{HUGGING_FACE}AmSJkmIKCz"),
    ("HUGGINGFACE_TOKEN", f"my_{HUGGING_FACE}"),
    # GOOGLE_API_KEY
    ("GOOGLE_API_KEY", "AIzaSyD-short"),
    ("GOOGLE_API_KEY", "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWYx"),
    # TWILIO_KEY: SK or AC inside a word, an SID alone, a digest far from any SID
    ("TWILIO_KEY", f"DISK{TWILIO_SK[2:]} TASK{TWILIO_SK[2:]}"),
    ("TWILIO_KEY", f"account {TWILIO_SID}"),
    # SK and 32 digits: a product's SKU, no hex a generator would give.
    ("TWILIO_KEY", '{"SKU": "SK12345678901234567890123456789012", "qty": 2}'),
    ("TWILIO_KEY", f"md5 {TWILIO_AUTH}"),
    ("TWILIO_KEY", f"{TWILIO_SID} " + "x" * 300 + f" {TWILIO_AUTH}"),
    # A 32-character id beside an SID that its key names as no secret: a trace id, an ETag.
    (
        "TWILIO_KEY",
        '{"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "account_sid": "'
        + TWILIO_SID
        + '", "ETag": "d41d8cd98f00b204e9800998ecf8427e", "request-id": '
        + '"0af7651916cd43dd8448eb211c80319c"}',
    ),
    ("TWILIO_KEY", f"sms sent account={TWILIO_SID} traceId=4bf92f3577b34da6a3ce929d0e0e4736"),
    # MAILGUN_API_KEY: a word, a key cut short, inside a word
    ("MAILGUN_API_KEY", "key-value-store-implementation-ab"),
    ("MAILGUN_API_KEY", f"{MAILGUN[:-1]} monkey-aeb30712cf79d734c1b2e0db8bddca41"),
    # SHOPIFY_TOKEN, DIGITALOCEAN_TOKEN: cut short, not hex
    ("SHOPIFY_TOKEN", f"{SHOPIFY[:-1]} shpat_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"),
    ("DIGITALOCEAN_TOKEN", f"{DIGITALOCEAN[:-1]} dop_v1_"),
    # GOOGLE_OAUTH_TOKEN: the prefix in prose, a path with a double slash
    ("GOOGLE_OAUTH_TOKEN", "access tokens start with ya29. and expire; see 1//0 or file:1//0a"),
    ("STRIPE_KEY", "whsec_short whsec_"),
    ("GENERIC_SECRET", "SPW=abc123def OLDPWD=/tmp/x1 auth: kerberos5 auth=sha256"),
    ("GENERIC_SECRET", "auth:\n  existingSecret: db-secret-2\n  imagePullSecret: regcred2"),
    # A time, a duration or a version after a secret-naming key: no generator's output.
    ("GENERIC_SECRET", "token: 2024-05-01T12:00:00Z\nsecret: 12.5ms\napi_key: v1.2.3"),
    ("GENERIC_SECRET", "token: 1h30m0s, auth_token: 2024-05-01 12:00:00.123"),
    # Where a secret is kept, not the secret: a URL, an ARN, a relative path in small letters.
    ("GENERIC_SECRET", "secret: projects/my-proj-123/secrets/db-pass/versions/latest"),
    ("GENERIC_SECRET", "secret: arn:aws:secretsmanager:us-east-1:123456789012:secret:db-AbCdEf"),
    ("GENERIC_SECRET", "  token: vault:secret/data/ci2#token\n  client_key: certs/client-2024.key"),
    ("GENERIC_SECRET", "secret: s3://bucket-2024/secrets.json\ntoken: https://vault.example/v1/a"),
    # A page's cursor, which the next call needs (aws's NextToken, Google's nextPageToken, S3's
    # NextContinuationToken, --starting-token): no credential, however it looks.
    ("GENERIC_SECRET", '{"items": [], "next_token": "eyJvZmZzZXQiOjEwMH0"}'),
    ("GENERIC_SECRET", '{"Functions": [], "NextToken": "AAMA-EFRSURBSGgx2kPzTEyWQ9f3"}'),
    ("GENERIC_SECRET", '{"nextPageToken": "CiAKGjBpNDd2Nmp2Zml2cXRwYjBpOXA3", "items": []}'),
    ("GENERIC_SECRET", '"NextContinuationToken": "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="'),
    ("GENERIC_SECRET", "page_token=Cg4xNzE0NTY3ODkwMTIz next_page_token: a1b2c3d4e5"),
    ("GENERIC_SECRET", "aws lambda list-functions --starting-token eyJNYXJrZXIiOiBudWxsfQ=="),
    (
        "GENERIC_SECRET",
        "<IsTruncated>true</IsTruncated><NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhb"
        "</NextContinuationToken><ContinuationToken>1ueGcxLPRx1Tr</ContinuationToken>",
    ),
    ("GENERIC_SECRET", "<nextToken>AAMA-EFRSURBSGgx2kPzTEyWQ9f3</nextToken>"),
    ("GENERIC_SECRET", "app --token --port 8080 --secret-file /etc/s.txt; my token abc123def"),
    ("GENERIC_SECRET", "kubectl create secret generic a --from-literal=api=$API_KEY"),
    ("GENERIC_SECRET", "--from-literal=A=… --from-literal=B=xoxb-… --from-literal=KEY=VALUE"),
    # A ConfigMap's literals hold no secret; a Secret's, created after it, do (a TP below).
    ("GENERIC_SECRET", "kubectl create configmap app --from-literal=LOG_LEVEL=debug2"),
    ("GENERIC_SECRET", "oc create cm app \\\n  --from-literal=PORT=8080 \\\n  --from-literal=A=b1"),
    ("GENERIC_SECRET", '<add key="ApiKey" value="..."/><password>****</password>'),
    ("PRIVATE_KEY", "Private-Lines: 3\nthe key has three private lines"),
    # An age recipient is public; a placeholder for an identity holds no key.
    ("PRIVATE_KEY", "# public key: age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"),
    ("PRIVATE_KEY", "SOPS_AGE_KEY=AGE-SECRET-KEY-1... (from keys.txt); AGE-SECRET-KEY-1<key>"),
    ("AWS_SESSION_TOKEN", f"FwoGZXIvYXdz IQoJb3JpZ2luX2Vj x{AWS_SESSION}"),
    # BEARER_TOKEN
    ("BEARER_TOKEN", "Bearer authentication is required"),
    ("BEARER_TOKEN", 'WWW-Authenticate: Bearer realm="example"'),
    ("BEARER_TOKEN", "the bearer token expired"),
    ("BEARER_TOKEN", "Authorization: Bearer ${TOKEN}"),
    ("BEARER_TOKEN", "Authorization: Bearer <redacted>"),
    # BASIC_AUTH
    ("BASIC_AUTH", "Basic authentication is required"),
    ("BASIC_AUTH", 'WWW-Authenticate: Basic realm="example"'),
    # GENERIC_SECRET
    ("GENERIC_SECRET", "trace_id=4bf92f3577b34da6a3ce929d0e0e4736"),
    ("GENERIC_SECRET", "secret_name: db-credentials-production"),
    ("GENERIC_SECRET", "token: xxxxxxxxxxxxxxxxxxxxxxxx"),
    ("GENERIC_SECRET", "authorization: required for this endpoint"),
    ("GENERIC_SECRET", "GITHUB_TOKEN=${{ secrets.GH_TOKEN }}"),
    ("GENERIC_SECRET", "PRIMARY_KEY=customer_id"),
    ("GENERIC_SECRET", "ERROR INVALID_TOKEN: the session expired"),
    ("GENERIC_SECRET", "API_KEY_HEADER=X-Api-Key"),
    ("GENERIC_SECRET", "SECRET_KEY=********"),
    ("GENERIC_SECRET", "TOKEN=<redacted>"),
    # A path names where the secret is kept, which the model needs ("file not found").
    ("GENERIC_SECRET", "GOOGLE_APPLICATION_CREDENTIALS=/var/secrets/google/key.json"),
    ("GENERIC_SECRET", "KUBE_TOKEN=/var/run/secrets/kubernetes.io/serviceaccount/token"),
    ("GENERIC_SECRET", "  SIGNING_KEY:  ./keys/signing.pem"),
    ("GENERIC_SECRET", "  SECRET_KEY:  <set to the key 'key' in secret 'app'>"),
    ("GENERIC_SECRET", "MAX_TOKENS=4096 TOKEN=abc"),
    # A key that names no secret, a value that is a word, a number, a path or a placeholder.
    ("GENERIC_SECRET", "sort_key: abc123def monkey=ab12cd34 primary key: id123abc"),
    ("GENERIC_SECRET", "max_tokens: 4096 token_count=12ab34 tokenizer=bert2base"),
    ("GENERIC_SECRET", "token: expired\nsecret: none\napi_key: 12345678"),
    ("GENERIC_SECRET", "client_secret: /etc/app/secret.txt token=${TOKEN} api-key: <your key>"),
    ("GENERIC_SECRET", "secrets: 3 found, tokens: 12ab34cd"),
    ("CONNECTION_STRING_PASSWORD", "BYPASS=enabled1 COMPASS=northward SKIP_BYPASS=always1"),
    ("CONNECTION_STRING_PASSWORD", "tests: pass=12 fail=0\n  pass: 3\n"),
    ("CONNECTION_STRING_PASSWORD", "proxy:\n  bypass: internal1\n  compass: north1\n"),
    ("CONNECTION_STRING_PASSWORD", "ERROR DB_PASS: invalid value"),
    # A query's other parameters, words and placeholders; cookies that hold a word; prose.
    ("GENERIC_SECRET", "https://x.example/items?sort_key=created_at&page_token=next"),
    ("GENERIC_SECRET", "https://x.example/y?auth=1&token=none&key=value"),
    ("GENERIC_SECRET", "https://x.example/y?access_token=${TOKEN}&q=token=abc123456"),
    ("GENERIC_SECRET", "Set-Cookie: lang=en-US; Path=/; Expires=Wed, 21 Oct 2026 07:28:00 GMT"),
    ("GENERIC_SECRET", "the cookie: it was stale; retry=later"),
    ("GENERIC_SECRET", "https://deploy-bot-for-production@git.example.com/o/r.git"),
    ("GENERIC_SECRET", "ssh://git@github.com:22/o/r.git"),
    ("GENERIC_SECRET", "ahvs.CAESIJ1aB2cD3eF4gH5iJ6kL7mN8oP9qR0sT1uV2wX3yZ4a hvs.short"),
    ("GENERIC_SECRET", '{"Name": "/prod/region", "Type": "String", "Value": "eu-west-1a"}'),
    ("GENERIC_SECRET", '{"region": {"sensitive": false, "type": "string", "value": "eu-west-1a"}}'),
    # JWT
    ("JWT", "eyJhbGciOiJIUzI1NiJ9 only a header"),
    ("JWT", "eyJ.eyJ.x"),
    # Five parts whose header names no "enc": base64 JSON and dotted words, not a JWE.
    ("JWT", "eyJhIjoxfQ.a.bbbbbbbb.cccccccc.dddddddd"),
    # PRIVATE_KEY
    ("PRIVATE_KEY", "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqh\n-----END PUBLIC KEY-----"),
    ("PRIVATE_KEY", "-----BEGIN CERTIFICATE-----\nMIIBIjANBgkqh\n-----END CERTIFICATE-----"),
    ("PRIVATE_KEY", "the private key is stored in vault"),
    # CONNECTION_STRING_PASSWORD
    ("CONNECTION_STRING_PASSWORD", "https://example.com:8443/path"),
    ("CONNECTION_STRING_PASSWORD", "password= dbname=app"),
    ("CONNECTION_STRING_PASSWORD", "password=*** user=app"),
    # Kafka's client config dump: a password it hides, or none set (Java's null).
    (
        "CONNECTION_STRING_PASSWORD",
        "\tssl.truststore.password = [hidden]\n\tssl.key.password = null\n",
    ),
    ("CONNECTION_STRING_PASSWORD", "password=[REDACTED] user=app"),
    ("CONNECTION_STRING_PASSWORD", "PWD=/home/user OLDPWD=/tmp"),
    ("CONNECTION_STRING_PASSWORD", "password: required"),
    ("CONNECTION_STRING_PASSWORD", "http://user@host/"),
    # GITLAB_TOKEN
    ("GITLAB_TOKEN", "glpat-short"),
    ("GITLAB_TOKEN", "xglpat-abcdefghij1234567890XY"),
    ("GITLAB_TOKEN", "glxyz-abcdefghij1234567890XY"),
    ("CONNECTION_STRING_PASSWORD", "password=;Database=app"),
    ("CONNECTION_STRING_PASSWORD", "mysql -u root -p app"),
    (
        "CONNECTION_STRING_PASSWORD",
        "openssl enc -pass env:PASS; openssl pkcs12 -passin stdin -passout file:/tmp/p;"
        " keytool -storepass:env PW -keypass $KEY_PW",
    ),
    ("CONNECTION_STRING_PASSWORD", "mkdir -p /var/lib/mysql"),
    ("CONNECTION_STRING_PASSWORD", "mysql -P3306 -h db"),
    ("CONNECTION_STRING_PASSWORD", "sshpass -p $PASS ssh host"),
    ("CONNECTION_STRING_PASSWORD", 'sshpass -p "$PASS" ssh host'),
    ("CONNECTION_STRING_PASSWORD", "mysql -u root -p'${DB_PASSWORD}' app"),
    # A -p that is not the client's: a port mapping for a container named mysql, another
    # command after the client's on the same line.
    ("CONNECTION_STRING_PASSWORD", "docker run --name mysql -p3306:3306 -d mysql:8"),
    ("CONNECTION_STRING_PASSWORD", "docker run --name=mysql -p3306:3306 -d mysql:8"),
    ("CONNECTION_STRING_PASSWORD", "kubectl -n mysql exec db-0 -- ss -plnt"),
    ("CONNECTION_STRING_PASSWORD", "mysql -u root -p -e 'select 1'; ss -plnt"),
    ("CONNECTION_STRING_PASSWORD", "pgrep mysqld | xargs ps -p1234"),
    ("CONNECTION_STRING_PASSWORD", "docker login ghcr.io && docker run -p 8080:80 nginx"),
    ("CONNECTION_STRING_PASSWORD", "docker login -u bob -p $CI_REGISTRY_PASSWORD"),
    ("CONNECTION_STRING_PASSWORD", "redis-cli -p 6379 info; ps -a 1"),
    ("CONNECTION_STRING_PASSWORD", "app --pass-through x --passes 3; a --bypass x; --pass -"),
    ("CONNECTION_STRING_PASSWORD", "mongosh -u admin -p --authenticationDatabase admin"),
    ("CONNECTION_STRING_PASSWORD", "docker run --name mongo -p 27017:27017 mongo:7"),
    ("CONNECTION_STRING_PASSWORD", r'{"log": "{\"password\": \"\"}"}'),
    # A password key with a colon inside a line is prose; at a line's start, a plain word
    # after an unnamed, unindented key is too (and nsswitch.conf's sources), as are YAML's
    # placeholders, nulls, anchors and block indicators.
    ("CONNECTION_STRING_PASSWORD", "error: password: hunter22"),
    ("CONNECTION_STRING_PASSWORD", r'{"log":"Password: Login incorrect\n","msg":"x password: y"}'),
    ("CONNECTION_STRING_PASSWORD", "Password: incorrect"),
    ("CONNECTION_STRING_PASSWORD", "passwd:         files systemd"),
    ("CONNECTION_STRING_PASSWORD", "  passwd:     files systemd"),
    ("CONNECTION_STRING_PASSWORD", "  password: required"),
    ("CONNECTION_STRING_PASSWORD", "- password: missing\n- username: ok"),
    ("CONNECTION_STRING_PASSWORD", "DB_PASSWORD: required"),
    ("CONNECTION_STRING_PASSWORD", "Password :incorrect\npassword:\n  - x"),
    ("CONNECTION_STRING_PASSWORD", "Username: bob\nPassword: N/A\n  password: unchanged"),
    ("GENERIC_SECRET", '<id>x1y2z3abc</id><add key="LogLevel" value="debug2x"/>'),
    ("GENERIC_SECRET", "<password>${env.PASS}</password><token></token>"),
    (
        "GENERIC_SECRET",
        "define('DB_NAME', 'wordpress2'); define('DB_PASSWORD', getenv('DB_PASSWORD'));"
        '<property name="username" value="app2"/><entry key="url">jdbc:x2</entry>',
    ),
    ("CONNECTION_STRING_PASSWORD", "Password: Incorrect."),
    # Prose after the first word too: a login's echo after its prompt, a validator's message,
    # an account's status; a colon inside the value, which YAML's plain scalars never hold.
    ("CONNECTION_STRING_PASSWORD", "Password: Login incorrect"),
    ("CONNECTION_STRING_PASSWORD", "Password: su: Authentication failure"),
    ("CONNECTION_STRING_PASSWORD", "Password: Sorry, try again."),
    ("CONNECTION_STRING_PASSWORD", "Password: Permission denied, please try again."),
    ("CONNECTION_STRING_PASSWORD", "Password: Login Succeeded"),
    ("CONNECTION_STRING_PASSWORD", "password: This field is required."),
    ("CONNECTION_STRING_PASSWORD", "password: Field required"),
    ("CONNECTION_STRING_PASSWORD", "password: Value error, too short"),
    ("CONNECTION_STRING_PASSWORD", "password: size must be between 8 and 64"),
    ("CONNECTION_STRING_PASSWORD", "password: Ensure this field has at least 8 characters."),
    ("CONNECTION_STRING_PASSWORD", "Password: Expires in 5 days"),
    ("CONNECTION_STRING_PASSWORD", "Password: never expires\nPassword: Never\nPassword: Locked"),
    ("CONNECTION_STRING_PASSWORD", "password: see below\npassword: same as above"),
    ("CONNECTION_STRING_PASSWORD", "password: [REDACTED]\npassword: <hidden>"),
    # The same statuses in the languages whose interfaces keep the English word "password".
    ("CONNECTION_STRING_PASSWORD", "Password: falsch\nPassword: errata\nPassword: incorrecta"),
    (
        "CONNECTION_STRING_PASSWORD",
        "password: obligatoire\npassword: ungültig\nPassword: richiesta",
    ),
    ("CONNECTION_STRING_PASSWORD", "  password: is too short"),
    ("CONNECTION_STRING_PASSWORD", "password: must be 12 characters or more"),
    ("CONNECTION_STRING_PASSWORD", "  password: ${DB_PASSWORD}"),
    ("CONNECTION_STRING_PASSWORD", "  password: '{{ .Values.db.password }}'"),
    ("CONNECTION_STRING_PASSWORD", "  password: ~"),
    ("CONNECTION_STRING_PASSWORD", "  password: null"),
    ("CONNECTION_STRING_PASSWORD", "  password: |"),
    ("CONNECTION_STRING_PASSWORD", "  password: |\n  user: app\nerror: password: |\n  x1y2z3"),
    ("CONNECTION_STRING_PASSWORD", "password: >\n  The admin's password, at least 12 characters."),
    ("CONNECTION_STRING_PASSWORD", "password: |\n  {{ .Values.password | b64enc }}\n"),
    ("CONNECTION_STRING_PASSWORD", "  password: *db_password"),
    ("CONNECTION_STRING_PASSWORD", "  password: ********"),
    # Source code whose field is named password: a Go or JavaScript object's field set from an
    # expression, a schema's type or validator (Go, Node, zod, SQLAlchemy, pydantic, GraphQL).
    (
        "CONNECTION_STRING_PASSWORD",
        '\tPassword: os.Getenv("DB_PASSWORD"),\n\tPassword: cfg.DBPassword,\n'
        "\tPassword: password,\n  password: hashedPassword,\n",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "  password: req.body.password,\n  password: process.env.DB_PASSWORD\n"
        "  password: this.password\n  password: z.string().min(8),\n",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "    password: Mapped[str] = mapped_column(String(128))\n"
        "    password: constr(min_length=8)\n  password: String!\n",
    ),
    ("CONNECTION_STRING_PASSWORD", "    password = models.CharField(max_length=128)\n"),
    # A flag's value, a size kubectl describe shows for a Secret's key, terraform's stand-ins.
    ("CONNECTION_STRING_PASSWORD", "  password: true"),
    ("CONNECTION_STRING_PASSWORD", "auth:\n  show_password: false\n"),
    ("CONNECTION_STRING_PASSWORD", "Data\n====\npassword:  8 bytes\nusername:  5 bytes\n"),
    ("CONNECTION_STRING_PASSWORD", "      + password                = (sensitive value)"),
    ("CONNECTION_STRING_PASSWORD", "  ~ db_password = (known after apply)"),
    ("CONNECTION_STRING_PASSWORD", "login: bob\npassword: (hidden)\n"),
    # A field's type in source code or an API's schema.
    ("CONNECTION_STRING_PASSWORD", "class Login(BaseModel):\n    password: str\n"),
    ("CONNECTION_STRING_PASSWORD", "    db_password: Optional[SecretStr] = None\n"),
    ("CONNECTION_STRING_PASSWORD", "interface Login {\n  password: string;\n}"),
    ("CONNECTION_STRING_PASSWORD", "docker login --password-stdin registry"),
    ("CONNECTION_STRING_PASSWORD", "app --password - < secret.txt"),
    ("CONNECTION_STRING_PASSWORD", 'app --password "$DB_PASSWORD"'),
    # A --help text's or a man page's option line, a usage line's name for the value, and an
    # option that says there is no password.
    ("CONNECTION_STRING_PASSWORD", "Flags:\n  -p, --password string   Password for the registry"),
    ("CONNECTION_STRING_PASSWORD", "Options:\n  --password TEXT  The database password.\n"),
    ("CONNECTION_STRING_PASSWORD", "  -P, --password         Ask for a password"),
    ("CONNECTION_STRING_PASSWORD", "OPTIONS\n       --password password\n           The password."),
    ("CONNECTION_STRING_PASSWORD", "usage: app [-h] [--password PASSWORD]"),
    ("CONNECTION_STRING_PASSWORD", "pg_dump -h db --no-password app"),
    ("CONNECTION_STRING_PASSWORD", "Error: --password is required\nhint: pass --password or set X"),
    ("CONNECTION_STRING_PASSWORD", '"Args": ["--password", "-", "--db-password", "--port"]'),
    ("CONNECTION_STRING_PASSWORD", "args:\n- --password\n- $(DB_PASSWORD)\n"),
    ("CONNECTION_STRING_PASSWORD", 'fields: ["password", "hunter22"]'),
    ("CONNECTION_STRING_PASSWORD", "# requirepass foobared\nthe requirepass option sets it"),
    ("CONNECTION_STRING_PASSWORD", "Options:\n  --password=PASSWORD  The password.\n"),
    ("CONNECTION_STRING_PASSWORD", "helm upgrade db chart --set auth.password=$DB_PASSWORD"),
    # Source code's right-hand side: where the password comes from, not the password.
    ("CONNECTION_STRING_PASSWORD", "if args.password is None:\n    args.password = getpass()"),
    ("CONNECTION_STRING_PASSWORD", 'password = os.environ["DB_PASSWORD"]'),
    ("CONNECTION_STRING_PASSWORD", 'password = config.get("db", "password") or None'),
    ("CONNECTION_STRING_PASSWORD", "    password = None"),
    ("CONNECTION_STRING_PASSWORD", "--set auth.password=${DB_PASSWORD},auth.user=app"),
    ("CONNECTION_STRING_PASSWORD", "ALTER ROLE app PASSWORD NULL;"),
    ("CONNECTION_STRING_PASSWORD", "the password is wrong"),
    # .netrc's shape only (machine HOST [login USER] password PASS), not any text that holds
    # the word "machine".
    ("CONNECTION_STRING_PASSWORD", "the build machine is slow\npassword reset mails queued"),
    ("CONNECTION_STRING_PASSWORD", "machine learning login\npassword policy: 12 chars"),
    ("CONNECTION_STRING_PASSWORD", "state machine: login ok password expired"),
    ("CONNECTION_STRING_PASSWORD", "the ci machine\n\npassword rotation is weekly"),
    ("GENERIC_SECRET", "- name: LOG_LEVEL\n  value: debug"),
    ("GENERIC_SECRET", "- name: SORT_KEY\n  value: created_at"),
    ("GENERIC_SECRET", "- name: DB_PASSWORD\n  valueFrom:\n    secretKeyRef: {name: db}"),
    ("GENERIC_SECRET", '{"name": "API_TOKEN", "value": ""}'),
    ("GENERIC_SECRET", "- name: API_TOKEN\n  value: $(TOKEN)"),
    # Prose lookalikes of a passphrase: a status word at either end, or mostly prose words.
    ("CONNECTION_STRING_PASSWORD", "password: the same one as before"),
    ("CONNECTION_STRING_PASSWORD", "Password: reset link sent to your inbox"),
    ("CONNECTION_STRING_PASSWORD", "password: it has been changed"),
    ("CONNECTION_STRING_PASSWORD", "password: length should be at least 12"),
    ("CONNECTION_STRING_PASSWORD", "Password: Account locked due to 5 failed attempts"),
    ("CONNECTION_STRING_PASSWORD", "password: ssh login failed for root"),
    ("CONNECTION_STRING_PASSWORD", "Password: authentication token manipulation error"),
    # Source code that starts its line with password = and an expression.
    (
        "CONNECTION_STRING_PASSWORD",
        "    password = await reader.readexactly(length - 4)\n    user = x\n"
        "const password = new Password(input)\n",
    ),
    (
        "CONNECTION_STRING_PASSWORD",
        "    connect(\n        host=host,\n        password=lambda: sslpassword,\n    )",
    ),
    # Comparisons and expressions in source code, which would run on to the line's end.
    (
        "CONNECTION_STRING_PASSWORD",
        "        return self.password == getattr(other, 'password', None)\n"
        "        password = password_from(url) or prompt() + suffix\n",
    ),
    # Inside a line, key=value keeps its first word: a log's message goes on after it.
    ("CONNECTION_STRING_PASSWORD", "login failed: password=*** for user bob"),
    # A Kubernetes object's name after a key that names a secret: a volume's secret, a TLS
    # secret, a token Secret's generated name, docker's and gcloud's --secret.
    ("GENERIC_SECRET", "secret: my-tls-secret-v2\nsecret: db-creds2\nsecret: tls-2024"),
    ("GENERIC_SECRET", '{"secret": "my-tls-secret-v2", "token": "default-token-x7k2p"}'),
    ("GENERIC_SECRET", "  auth-secret: basic-auth-2\n  tlsSecret: wildcard.example-2024"),
    ("GENERIC_SECRET", "docker service create --secret db-creds-2 app"),
    # The same flags on other commands, or with no password after them.
    (
        "CONNECTION_STRING_PASSWORD",
        "az vm list -p 2; ps -P 1 x; grep -w error log\n"
        "ipmitool -P $IPMI_PW x; ldapsearch -W -D cn=a; smbclient -L srv -U alice; ls -w 80",
    ),
    ("CONNECTION_STRING_PASSWORD", "rsync -P a b; tar -P x; cp /p:x y; mkdir -p /a/b"),
    ("CONNECTION_STRING_PASSWORD", "the -password flag is deprecated"),
    (
        "CONNECTION_STRING_PASSWORD",
        "Usage of influx:\n  -password string\n    \tPassword to connect to the server.",
    ),
    # A primary key that is a column, a key's name, a region printed by aws configure get.
    ("GENERIC_SECRET", '{"primaryKey": "order_id", "keyName": "key1", "permissions": "FULL"}'),
    ("GENERIC_SECRET", "$ aws configure get region\neu-west-1b2"),
    ("GENERIC_SECRET", "terraform: will output db_password after apply\nPlan: 1 to add"),
    ("GENERIC_SECRET", "$ vault read -field=username database/creds/app\nv-app-x7k2"),
    # The same commands with no password on their line: asked for, or none set.
    (
        "CONNECTION_STRING_PASSWORD",
        "htpasswd -c /etc/nginx/.htpasswd alice\nhtpasswd -v .htpasswd bob\nhtpasswd -bD f carol"
        "\necho 'a:b' | tee x\nrabbitmqctl list_users; chpasswd < users.txt",
    ),
    # Inside a line, a status after "password:", in capitals, or a word of one or two kinds.
    (
        "CONNECTION_STRING_PASSWORD",
        "msg: password: RESET_REQUIRED\nkey password: PKCS12\nerror: password: CHANGEME123",
    ),
    ("CONNECTION_STRING_PASSWORD", "auth: password: Expired-2024 for bob"),
    ("CONNECTION_STRING_PASSWORD", "the password is: required\nroot password is set for root: yes"),
    # cat of a file that names no secret, or of a secret's key file (found as a key).
    ("GENERIC_SECRET", "$ cat /etc/hostname\nweb-01a2b3\n$ cat token_count.txt\n12"),
    # A structured file named for secrets: its first line is a key's, its values found by theirs.
    (
        "GENERIC_SECRET",
        "$ cat k8s/db-secret.yaml\napiVersion: v1\n$ cat secrets.json\n{\n$ cat tokens.env\nA=1",
    ),
    # Colon-separated lines that are no .pgpass: passwd, group, a time, an access line.
    ("CONNECTION_STRING_PASSWORD", "root:x:0:0:root:/root:/bin/bash\ndocker:x:999:alice"),
    ("CONNECTION_STRING_PASSWORD", "12:34:56:789 worker:8080:GET:/healthz 200"),
    ("CONNECTION_STRING_PASSWORD", "web-01:8080:GET:healthz:200\n1:2345:respawn:/sbin/getty"),
    # Dollar signs and braces that are no hash: a shell's positional parameters, a template.
    ("GENERIC_SECRET", "awk '{print $1$2}' f; echo $5$6 ${SHA} {SHA} is deprecated"),
    # A Dockerfile's ENV that sets no secret, or names where it is kept.
    ("GENERIC_SECRET", "ENV NODE_ENV production\nENV PATH /usr/local/bin:$PATH"),
    ("GENERIC_SECRET", "ENV API_TOKEN ${API_TOKEN}\nENV SECRET_KEY_FILE /run/secrets/key"),
    ("GENERIC_SECRET", "ENV PASSWORD_MIN_LENGTH 12"),
    # cmdkey's listing shows no password; sqlplus without one prompts for it.
    ("CONNECTION_STRING_PASSWORD", "cmdkey /list\n    Type: Domain Password\n    User: a\\b"),
    ("CONNECTION_STRING_PASSWORD", "cmdkey /add:srv /user:a /pass\nsqlplus / as sysdba"),
    ("CONNECTION_STRING_PASSWORD", "sqlplus scott@ORCL; jdbc:oracle:thin:@db:1521/ORCL"),
    # A printing command whose output is no secret, or an error in its place.
    ("GENERIC_SECRET", "$ terraform output -raw vpc_id\nvpc-0abc123def4567890"),
    (
        "GENERIC_SECRET",
        '$ terraform output -raw db_password\n╷\n│ Error: Output "db_password" not found',
    ),
    ("GENERIC_SECRET", "$ heroku config:get WEB_CONCURRENCY\n4abc2"),
    ("GENERIC_SECRET", "+ terraform output -raw db_password\n+ echo done2x\ndone2x"),
]


@pytest.mark.parametrize(("entity", "text"), FALSE_POSITIVES)
def test_false_positive(entity: str, text: str) -> None:
    assert found(text, entity) == []


BENIGN_LOG_LINES = [
    "2024-05-01T12:34:56.789Z INFO  [worker-3] request completed in 12.5ms pid=4312 port=8080",
    '{"ts": 1714567890123, "level": "info", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}',
    '{"duration": 0.013, "span_id": "52ee06fdc8426514", "version": "1.17.98"}',
    "request_id=123e4567-e89b-12d3-a456-426614174000",
    "python 3.11.4 / pip 23.2.1 / Chrome/124.0.6367.91",
    "sha256:0337f2143e4f17400fcb44b3fcba4843d2380b6a8c10562b7b994e16150e5651",
    "guild 1222661216587828173 channel 1100000000000000001",
    '  File "/usr/lib/python3.11/site-packages/app/db.py", line 469, in db_handler',
    "\tat com.example.db.ConnectionPool.acquire(ConnectionPool.java:123)",
    "uptime 3d4h, load 0.52 0.48 0.40, mem 16314956 8745620",
    "00000010: 0a1b 2c3d 4e5f 6071 8293 a4b5 c6d7 e8f9  ..,=N_`q........",
    "HTTP/1.1 200 OK Content-Length: 5321",
    "Date: Wed, 01 May 2024 12:34:56 GMT",
    "version 1.2.3-rc.4+build.5, took 1234567 ns, 0.000123 s, 1e-05",
    "api-7d9f8b6c5-x2x9z   1/1     Running   0          3d4h",
    "Mon May  1 12:34:56 UTC 2024 PID 12345 PPID 1 UID 1000 GID 1000",
    "/dev/sda1 102687672 45678912 51234567 48% /",
    "Traceback (most recent call last): TimeoutError: timed out after 14.575s",
    "build 20240501-123456 commit 3f9a1c2 tag v2.14.0",
]


@pytest.mark.parametrize("line", BENIGN_LOG_LINES)
def test_benign_log_line_has_no_hits(line: str) -> None:
    assert SCAN(line) == []


def test_offsets_are_those_of_the_original_text_when_it_is_not_ascii() -> None:
    text = "Grüße 🙂 an jörg@example.de und 10.0.0.1"
    hits = resolve_overlaps(SCAN(text), len(text))
    assert [text[hit.start : hit.end] for hit in hits] == ["jörg@example.de", "10.0.0.1"]


def test_scanner_reports_only_the_enabled_entities() -> None:
    text = "alice@example.com 10.0.0.1"
    hits = Scanner(["IP_ADDRESS"])(text)
    assert [hit.entity_type for hit in hits] == ["IP_ADDRESS"]


def test_scanner_with_no_entities_finds_nothing() -> None:
    assert Scanner([])("alice@example.com") == []


def test_scanner_rejects_an_unknown_entity() -> None:
    with pytest.raises(ValueError, match="PASSPORT"):
        Scanner(["PASSPORT"])


def test_every_entity_type_has_a_recognizer_and_a_true_positive() -> None:
    assert {entity for entity, _, _ in TRUE_POSITIVES} == set(ENTITY_TYPES)


@pytest.mark.parametrize(
    ("digits", "valid"),
    [("4111111111111111", True), ("79927398713", True), ("4111111111111112", False)],
)
def test_luhn(digits: str, valid: bool) -> None:
    assert luhn_ok(digits) is valid


@pytest.mark.parametrize(
    ("digits", "grouped", "valid"),
    [
        ("4111111111111", False, True),
        ("4111111111111111111", False, False),
        ("4111111111111111111", True, True),
        ("5100000000000000", False, True),
        ("5600000000000000", False, False),
        ("340000000000000", False, True),
        ("1234567812345670", False, False),
    ],
)
def test_card_brand(digits: str, grouped: bool, valid: bool) -> None:
    assert card_brand_ok(digits, grouped) is valid


@pytest.mark.parametrize(
    ("iban", "valid"),
    [
        ("DE89370400440532013000", True),
        ("GB82WEST12345698765432", True),
        ("GB82WEST12345698765433", False),
        ("DE8937040044053201300", False),
        ("ZZ89370400440532013000", False),
    ],
)
def test_iban_checksum(iban: str, valid: bool) -> None:
    assert iban_ok(iban) is valid


@pytest.mark.parametrize(
    ("ssn", "valid"),
    [
        (("123", "45", "6789"), True),
        (("000", "45", "6789"), False),
        (("666", "45", "6789"), False),
        (("912", "45", "6789"), False),
        (("123", "00", "6789"), False),
        (("123", "45", "0000"), False),
    ],
)
def test_ssn_validity(ssn: tuple[str, str, str], valid: bool) -> None:
    assert ssn_ok(*ssn) is valid


def test_a_conditional_expression_after_password_is_no_passphrase() -> None:
    # Python's x if y else z, no call in it: the expression's words stay readable.
    text = "x = 1\npassword = prompt_for_password if interactive else None\ny = 2\n"
    assert all(" else " not in value for value in found(text, "CONNECTION_STRING_PASSWORD"))


# A key behind a percent-escaped separator: a URL inside another's query (a login's redirect,
# a proxy's log), where the escape's last hex digit reads as a word's letter before the prefix.
ESCAPED_KEYS = [
    ("GITHUB_TOKEN", "ghp_1234567890abcdefghijABCDEFGHIJ123456"),
    ("STRIPE_KEY", "sk_live_abcdEFGH1234ijklMNOP5678"),
    ("SLACK_TOKEN", "xoxb-1234567890-1234567890-abcdefABCDEF"),
    ("AWS_ACCESS_KEY", "AKIAIOSFODNN7EXAMPLE"),
    ("MAILGUN_API_KEY", "key-aeb30712cf79d734c1b2e0db8bddca41"),
    ("SHOPIFY_TOKEN", "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"),
    ("TWILIO_KEY", "SK33dbf550cbd9cf909cf615cb5856614c"),
    ("AWS_SESSION_TOKEN", "FwoGZXIvYXdzEBYaDHabcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJ"),
]


@pytest.mark.parametrize(("entity", "key"), ESCAPED_KEYS, ids=[e for e, _ in ESCAPED_KEYS])
@pytest.mark.parametrize("escape", ["%3D", "%2f", "%3A", "%22", "%20"])
def test_a_key_after_a_percent_escaped_separator_is_redacted(
    entity: str, key: str, escape: str
) -> None:
    text = f"GET /login?next=https%3A%2F%2Fapp%2Fcb%3Fx%3D1%26k{escape}{key}%26y%3D2 HTTP/1.1"
    assert found(text, entity) == [key]


def test_every_users_password_chpasswd_reads_is_redacted() -> None:
    text = 'echo -e "alice:S3cretOne\\nbob:S3cretTwo" | chpasswd'
    assert found(text, "CONNECTION_STRING_PASSWORD") == ["S3cretOne", "S3cretTwo"]


def test_truncated_private_key_stops_before_blank_lines() -> None:
    text = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n\n\nmore words here"
    assert found(text, "PRIVATE_KEY") == [
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
    ]


def test_two_keys_one_truncated() -> None:
    text = f"-----BEGIN PRIVATE KEY-----\nAAAA\nlog line here\n{RSA_BLOCK}"
    assert found(text, "PRIVATE_KEY") == ["-----BEGIN PRIVATE KEY-----\nAAAA", RSA_BLOCK]


def _adversarial(part: int) -> list[str]:
    """The hostile inputs, each repeated part ``1/part`` as long as in the worst case seen."""

    def n(count: int) -> int:
        return max(1, count // part)

    return [
        "1" * n(100_000),
        "1-" * n(50_000),
        "1." * n(50_000),
        "a@" * n(50_000),
        "1:" * n(50_000),
        "a:" * n(50_000),
        "+1 " * n(30_000),
        'password="' * n(10_000),
        "password=" * n(20_000),
        "password=a;1" * n(16_000),
        "pwd=x,9" * n(10_000),
        "-----BEGIN PRIVATE KEY-----\n" * n(3_000),
        "://a:b" * n(20_000),
        "://" + "a1" * n(50_000),
        "://" + "a1" * n(50_000) + ":" + "b" * n(50_000) + "@",
        "eyJaaaaaaaaa." * n(8_000),
        "API_TOKEN:" + " " * n(100_000),
        "API_TOKEN:" + "\t " * n(50_000) + "\n",
        "mysql -p" + " -p" * n(30_000),
        "sshpass -p " * n(10_000),
        "mysql '" + " -p;" * n(50_000),
        "mysql" + " -p" * n(50_000),
        "docker login" + " -p x" * n(30_000),
        "redis-cli" + " -a" * n(50_000),
        '\\"password\\":\\"' + "\\\\a" * n(50_000),
        '\\"password\\":\\"a' * n(20_000),
        "authorization:" * n(5_000),
        "Authorization: x " * n(4_000),
        "Authorization: Bearer " * n(3_000),
        "Authorization: " + "a1" * n(20_000) + " authorization:" * n(4_000),
        "npm_" * n(25_000),
        "hvs." * n(25_000),
        '"Type": "SecureString", "Value": "' + "\\" * n(100_000),
        '"sensitive": true, "type": "string", "value": "' + "\\" * n(100_000),
        "hf_a1B" * n(20_000),
        "SG.aB1" * n(20_000),
        "pypi-AgEIcHlwaS5vcmc " * n(5_000),
        "- name: A_TOKEN\n  value: " * n(10_000),
        '"name": "A_TOKEN",' + " " * n(50_000) + "\n" + " " * n(50_000),
        "A_PASS=" * n(20_000),
        "Cookie: a=" * n(20_000),
        "Cookie: " + "a=b12345678;" * n(20_000),
        "?" + "&token=" * n(30_000),
        "?" + "a" * n(100_000) + "key=x",
        "PASS" * n(30_000),
        "name:" * n(30_000) + "value",
        "  password: " * n(20_000),
        "  password: x" + " y" * n(50_000),
        "machine " + "login a password " * n(20_000),
        "default " + "password a " * n(20_000),
        "machine a\n" + " login\n" * n(20_000) + "password x",
        "--a-" * n(25_000) + "password x",
        "token=" * n(20_000),
        "api key: " + "a1" * n(50_000) + " secret:" * n(10_000),
        "token" + " " * n(100_000),
        "token:secret=key:credentials=" * n(5_000),
        "monkey:" * n(20_000),
        "SK" * n(50_000),
        "kind: Secret\ndata:\n  a" + " " * n(50_000) + "b\n",
        "kind: Secret\ndata:\n  a: x" + " " * n(50_000) + "y\n",
        "kind: Secret\ndata:" + " " * n(50_000) + "x\n",
        "Key Value\n--- -----\nk v" + " " * n(50_000) + "x\n",
        "kind: Secret\ndata:\n" + "  a: b\n" + " " * n(50_000) + "c: d\n",
        "eyJaaaaaaaaa.b.c.d" * n(8_000),
        "eyJhbGciOiJSU0EtT0FFUCIsImVuYyI6IkEyNTZHQ00ifQ" + ".aaaaaaaa" * n(20_000),
        "<password>" * n(20_000),
        "<a>" + "x" * n(100_000),
        '<add key="' * n(20_000),
        "password :" * n(20_000),
        "password=>" * n(20_000),
        "--token " * n(20_000),
        "--from-literal=" * n(20_000),
        "--from-literal=a=" * n(20_000),
        ("create " * 150 + "--from-literal=a=b ") * n(100) + "--from-literal=a=b " * n(5_000),
        "define('A', " * n(15_000),
        "token: " + "1." * n(30_000) + "x token: " + "1h" * n(30_000) + "!",
        "<password><![CDATA[" * n(8_000) + "<a><![CDATA[" + "]]" * n(20_000),
        "-pass pass:" * n(10_000) + "-storepass " * n(10_000) + "-passin 'pass:" * n(5_000),
        '<property name="a">' * n(10_000) + '<entry key="password">x' * n(5_000),
        'name="a" key="b"   ' * n(10_000),
        "Key Value\n--- -----\n" * n(10_000),
        "====== Data ======\nKey Value\n--- -----\n" + "a b\n" * n(20_000),
        '"SecretString": "' + "\\" * n(100_000),
        "PuTTY-User-Key-File-2: x\nPrivate-Lines: 64\n" * n(5_000),
        "Private-Lines: 9" * n(10_000),
        "AGE-PLUGIN-" * n(10_000),
        "AGE-PLUGIN-X" + "-1Q" * n(10_000),
        "eyJwYXlsb2FkIjoi" * n(10_000),
        "A_PW=" * n(20_000),
        "kind: Secret\n" * n(20_000),
        "kind: Secret\ndata:\n" + "  a: b\n" * n(20_000),
        "- kind: Secret\n  data:\n" * n(10_000),
        "kind: Secret\n" + "  " * n(50_000) + "data:\n",
        '{"kind": "Secret", "data": {' * n(10_000),
        '{"kind":"Secret","data":{"a":"b"}}' * n(10_000),
        '"kind":"Secret"' + '"data":{' * n(20_000),
        # Secrets' kind lines, each less indented than the last, with blank lines between: each
        # object's start lies before all the lines above it.
        "".join(" " * c + "kind: Secret\n" + "\n" * 500 for c in range(n(200), 0, -1)) + "data:\n",
        "".join(" " * c + "kind: Secret\n" + " " * 241 + "x: y\n" for c in range(n(240), 0, -1)) * 2
        + "data:\n",
        '\\"data\\":{' + '\\"a\\":\\"b\\",' * n(20_000),
        "".join(" " * i + "password: |\n" for i in range(n(400))) + "  ${X}\n",
        "password: |\n" + "\n" * n(50_000) + "password: >\n" + "  \n" * n(30_000),
        "FwoGZXIvYXdz" * n(10_000),
        "IQoJb3JpZ2luX2Vj/" * n(10_000),
        "AC" + "a1" * 16 + " " + ("AC" + "b2" * 16 + " ") * n(3_000),
        "key-" * n(25_000),
        "ya29." * n(20_000),
        "1//0" * n(25_000),
        "shpat_" * n(15_000) + "dop_v1_" * n(15_000) + "whsec_" * n(15_000),
        "\n  -p, --password x" * n(20_000),
        '"--password", ' * n(20_000),
        "- --password\n" * n(20_000),
        '"password=a ' * n(20_000),
        '"password=a' + " b" * n(50_000) + '\\"',
        "x=1\npassword=a" + " b" * n(50_000),
        "password = " + "a " * n(50_000),
        "password=a b\n" * n(20_000),
        " " * n(50_000) + "password=a b\n" + "a" * n(50_000),
        "password: a" + " is" * n(50_000),
        "secret: a-" * n(20_000),
        "token: " + "a1-" * n(50_000),
        "a:5432:b:c:" * n(20_000),
        "a:5432:b:c:d\n" * n(20_000),
        ":*:" * n(30_000),
        "$1$" * n(30_000),
        "$2y$05$" * n(15_000),
        "{SHA}" * n(20_000),
        "{PBKDF2}" + "$" * n(100_000),
        "echo " + "a:1234:" * n(14_000),
        "echo " * n(20_000) + "a:5432:b:c:d",
        "echo '" + 'echo "' * n(15_000) + "| chpasswd",
        "echo 'a:12345:b:c:d " * n(7_000),
        "1234:\n" * n(20_000),
        "{SSHA512}" * n(10_000),
        "$argon2id$v=1$m=1,t=1,p=1$" * n(4_000),
        "ENV A_TOKEN " * n(10_000),
        "xoxd-abcdefghij1" + "%2F" * n(30_000),
        "xoxd-abcdefghij1" + "%2f/" * n(25_000) + "=" * n(1_000),
        "xoxd-abcdefghij " * n(6_000),
        "xoxe.x" * n(20_000),
        ("a" * 19 + ".") * n(5_000),
        ("a" * 19 + "." + "a" * 20 + "/") * n(2_500),
        "cat a_secret " * n(10_000) + "\n",
        "x password: aB3" * n(20_000),
        "password is generated for " * n(10_000) + ": aB3dE5fG7hJ9",
        "htpasswd -b" + " -C" * n(50_000),
        "htpasswd -b a b " * n(10_000),
        "echo a:b | chpasswd " * n(10_000),
        "rabbitmqctl change_password a " * n(10_000),
        "ENV A_TOKEN abcdefg " * n(10_000),
        "ENV DB_PASSWORD abcdefg " * n(10_000),
        "ENV " * n(30_000),
        "/pass:" * n(20_000),
        'cmdkey /pass:"' * n(10_000),
        "sqlplus " * n(20_000) + "a/b",
        "thin:a/" * n(20_000),
        "sqlplus a/b" * n(10_000) + "@",
        "terraform output " * n(10_000) + "\n",
        "terraform output a_password" * n(10_000) + "\n",
        "terraform output " + "-a=b " * n(20_000) + "a_password\nx",
        "terraform" + " -xterraform" * n(8_000) + " secret output",
        "tofu output" + " -a=tofu" * n(12_000) + " secret",
        "terraform output" + " -a=output" * n(10_000) + " secret",
        "sqlplus a/b" + "@" * n(100_000),
        "echo " + "a:b\\n" * n(20_000) + " | chpasswd",
        "[client]\npassword = " + "a and " * n(20_000) + "\n",
        "kubectl get secret " * n(10_000) + "\n",
        "config:get " * n(10_000),
        "-field=" * n(20_000),
        "vault -field " * n(8_000) + "secret",
        "key1 FULL " * n(10_000),
        "%3Dghp_%3Dsk_live_%3Dxoxb-%3DAKIA" * n(3_000),
        "%2F" * n(33_000) + "a",
        "%3Dkey-" * n(14_000),
        '"' + "ENV A_PASSWORD x " * n(6_000),
        "keyName: key1\npermissions: FULL\n" * n(3_000),
        "cat -a " * n(14_000) + "secret",
        'cat "' + "a" * n(100_000) + " secret",
        "---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\n" * n(3_000),
        "az login" + " -p" * n(50_000),
        "sqlcmd" + " -P" * n(50_000),
        "ldapsearch" + " -w" * n(50_000),
        "smbclient -U a%" * n(10_000),
        "xfreerdp" + " /p:" * n(30_000),
        " -password" * n(20_000),
        '"keyName": "a", "permissions": "FULL", "value": "' + "\\" * n(100_000),
        "configure get a_secret" * n(10_000) + "\n",
    ]


# Each input at two sizes, the larger about 8 times the smaller (more where lines are indented
# deeper and deeper): a linear scan takes about as many times as long on it, a quadratic one
# that many squared.
ADVERSARIAL = list(zip(_adversarial(32), _adversarial(4), strict=True))


@pytest.mark.parametrize("sizes", ADVERSARIAL, ids=lambda sizes: repr(sizes[1][:12]))
def test_adversarial_input_scans_in_linear_time(sizes: tuple[str, str]) -> None:
    small, large = sizes
    assert_linear(SCAN, small, large, k=len(large) / len(small))


def test_json_escapes_separate_words() -> None:
    text = json.dumps(
        {
            "body": "line one\n4111 1111 1111 1111\tDE89370400440532013000\nAKIAIOSFODNN7EXAMPLE"
            f"\nalice@example.com\r\n10.0.0.1\nghp_{GH_BODY}",
            "key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nAAAA\n",
        }
    )
    hits = resolve_overlaps(SCAN(text), len(text))
    assert [(hit.entity_type, text[hit.start : hit.end]) for hit in hits] == [
        ("CREDIT_CARD", "4111 1111 1111 1111"),
        ("IBAN_CODE", "DE89370400440532013000"),
        ("AWS_ACCESS_KEY", "AKIAIOSFODNN7EXAMPLE"),
        ("EMAIL_ADDRESS", "alice@example.com"),
        ("IP_ADDRESS", "10.0.0.1"),
        ("GITHUB_TOKEN", f"ghp_{GH_BODY}"),
        ("PRIVATE_KEY", "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\nAAAA"),
    ]


def test_empty_text() -> None:
    assert SCAN("") == []


# Invariants the fast paths of the recognizers rely on.


def test_no_secret_label_ends_another() -> None:
    # The reversed-label alternation takes the first label that fits; with one label ending
    # another, "--x-secret_key VALUE" could be judged by the shorter one.
    assert not [(a, b) for a in _SECRET_LABELS for b in _SECRET_LABELS if a != b and b.endswith(a)]


@pytest.mark.parametrize(
    "octets",
    [
        ("10", "0", "0", "1"),
        ("255", "255", "255", "255"),
        ("256", "1", "1", "1"),
        ("01", "2", "3", "4"),
        ("1", "00", "3", "4"),
        ("0", "0", "0", "0"),
        ("999", "1", "1", "1"),
        ("192", "168", "010", "1"),
    ],
)
def test_ipv4_check_agrees_with_ipaddress(octets: tuple[str, ...]) -> None:
    try:
        ipaddress.ip_address(".".join(octets))
        valid = True
    except ValueError:
        valid = False
    assert ipv4_ok(octets) is valid


@pytest.mark.parametrize(
    ("pattern", "anchor"), [(_A_KEYS, "A"), (_JWT, "J"), (_AT_SIGN, "@"), (_INTL_PHONE, "+")]
)
def test_anchored_scan_finds_what_finditer_finds(pattern: re.Pattern[str], anchor: str) -> None:
    text = (
        f"AKIAIOSFODNN7EXAMPLE xAKIAIOSFODNN7EXAMPLE A {JWT} eyJ.eyJ a@b.c @@x.io "
        "+44 20 7946 0958 ++1 555 123 4567 +1-555-0100+ AIzaSyA-1234567890abcdefghijklmnopqrstu"
    )
    expected = [match.span() for match in pattern.finditer(text)]
    assert [match.span() for match in anchored_finditer(pattern, text, anchor)] == expected


def test_a_lone_digit_after_a_word_compiles_no_number_family() -> None:
    """A command's "[exit status 0]" holds a separator and a digit but no number: the families
    (each some 0.6 ms to compile) stay uncompiled in a fresh process."""
    code = (
        "from bot.pii import numbers; from bot.pii.guard import PiiGuard, PiiSettings;"
        "PiiGuard(PiiSettings()).scan_output('restarted checkout\\n[exit status 0] at v 2. 3');"
        "print([f._compiled is None for f in (numbers._DASH, numbers._DOT, numbers._SPACE)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[True, True, True]"


def test_a_plain_prompt_compiles_no_pattern() -> None:
    """A chat prompt with no anchor, label or digit compiles no regex in a fresh process: the
    guard's patterns wait for a text that may hold a match (re's compiler is Python, and two
    patterns compiled on every first scan once took a cold suspend from 6.5 to 8.8 M
    instructions)."""
    code = (
        "import re._compiler as c; from bot.pii.guard import PiiGuard, PiiSettings;"
        "guard = PiiGuard(PiiSettings()); seen = [];"
        "compile = c.compile; c.compile = lambda p, f=0: seen.append(p) or compile(p, f);"
        "guard.scan_output('restart checkout, it is failing for everyone');"
        "print(seen)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_backslash_compiles_no_escaped_at_sign_pattern() -> None:
    """A Windows path or an escaped newline is no ``\\u0040``: the pattern stays uncompiled."""
    code = (
        "from bot.pii import emails; from bot.pii.guard import PiiGuard, PiiSettings;"
        "PiiGuard(PiiSettings()).scan_output('copied C:\\\\Users\\\\ops\\\\x.log\\\\n');"
        "print(emails._AT_ESCAPE._compiled is None)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_the_configuration_guide_names_every_entity_type() -> None:
    guide = (Path(__file__).resolve().parents[3] / "docs" / "configuration.md").read_text()
    assert [name for name in ENTITY_TYPES if f"`{name}`" not in guide] == []


def test_a_recognizer_reports_only_the_types_it_declares() -> None:
    # A recognizer whose every declared type is enabled is read without a filter: a hit of a
    # type it does not declare would pass a `pii.entities` that leaves that type out.
    constants = [value for value in globals().values() if isinstance(value, str) and value]
    for text in [sample for _entity, sample, _found in TRUE_POSITIVES] + constants:
        src = ScanText(text)
        for recognizer in RECOGNIZERS:
            found = {hit.entity_type for hit in load_finder(recognizer.finder)(src)}
            assert found <= recognizer.entities, (recognizer.finder, found, text)
        for entity in {hit.entity_type for hit in SCAN(text)}:
            # Every type but the one found: a recognizer reporting it among others is filtered.
            others = [other for other in ENTITY_TYPES if other != entity]
            assert all(hit.entity_type != entity for hit in Scanner(others)(text)), (entity, text)


def test_the_prose_words_after_password_are_spelled_as_the_scan_reads_them() -> None:
    # Written without ``fold`` (whose table a start would build): they must still agree.
    from bot.pii.labelled import _PROSE_SPELLED, _PROSE_VALUES
    from bot.pii.scantext import fold

    assert {fold(word)[0] for word in _PROSE_SPELLED} == _PROSE_VALUES
