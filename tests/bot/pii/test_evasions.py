"""Forms of PII and secrets written to slip past the guard, and ops output it must leave alone.

Every case goes through the guard in redact mode, as a tool output would: the expected text is
what reaches the model. Evasions were found reaching the model before folding and the
recognizers for them (issue 9, item 4).
"""

# The look-alike characters are the point of these cases.
# ruff: noqa: RUF001

from __future__ import annotations

import base64
import random

import pytest

from bot.pii.guard import PiiGuard, PiiMode, PiiSettings, resolve_overlaps
from bot.pii.recognizers import Scanner
from bot.pii.scantext import fold
from tests.fakes.growth import assert_linear

GUARD = PiiGuard(PiiSettings(mode=PiiMode.REDACT))
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
RSA_BLOCK = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx4UbaDzY1W2YBkV\n"
    "q8T0jDdbB2xY1ZkLd0==\n-----END RSA PRIVATE KEY-----\n"
)
HEX_SECRET = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def wrapped(data: bytes, width: int = 76) -> str:
    """``data`` in base64 over lines of ``width``, as base64(1) writes it."""
    encoded = base64.b64encode(data).decode()
    return "\n".join(encoded[i : i + width] for i in range(0, len(encoded), width))


def binary(size: int) -> bytes:
    """``size`` bytes that read as no text (the same on every run)."""
    return random.Random(size).randbytes(size)


def redacted(text: str) -> str:
    return GUARD.scan_output(text).text


# (case id, text, what reaches the model)
EVASIONS: list[tuple[str, str, str]] = [
    # Cards: separators, invisible and look-alike characters, odd groupings.
    ("card-dots", "card 4111.1111.1111.1111 exp", "card <CREDIT_CARD> exp"),
    ("card-nbsp", "card 4111\u00a01111\u00a01111\u00a01111", "card <CREDIT_CARD>"),
    ("card-narrow-nbsp", "card 4111\u202f1111\u202f1111\u202f1111", "card <CREDIT_CARD>"),
    ("card-zwsp", "card 4111\u200b1111\u200b1111\u200b1111!", "card <CREDIT_CARD>!"),
    ("card-zwsp-run", "card 41\u200b111111\u200b11111111", "card <CREDIT_CARD>"),
    ("card-soft-hyphen", "4111\u00ad1111\u00ad1111\u00ad1111", "<CREDIT_CARD>"),
    ("card-word-joiner", "4111\u20601111\u20601111\u20601111", "<CREDIT_CARD>"),
    ("card-bom", "\ufeff4111111111111111", "\ufeff<CREDIT_CARD>"),
    ("card-fullwidth", "カード ４１１１ １１１１ １１１１ １１１１", "カード <CREDIT_CARD>"),
    ("card-fullwidth-run", "４１１１１１１１１１１１１１１１", "<CREDIT_CARD>"),
    ("card-math-digits", "𝟒𝟏𝟏𝟏 𝟏𝟏𝟏𝟏 𝟏𝟏𝟏𝟏 𝟏𝟏𝟏𝟏", "<CREDIT_CARD>"),
    ("card-arabic-digits", "٤١١١ ١١١١ ١١١١ ١١١١", "<CREDIT_CARD>"),
    ("card-en-dash", "4111–1111–1111–1111", "<CREDIT_CARD>"),
    ("card-minus-sign", "4111\u22121111\u22121111\u22121111", "<CREDIT_CARD>"),
    ("card-ideographic-space", "4111\u30001111\u30001111\u30001111", "<CREDIT_CARD>"),
    ("card-pairs", "card 41 11 11 11 11 11 11 11", "card <CREDIT_CARD>"),
    ("card-threes", "card 411 111 111 111 1111", "card <CREDIT_CARD>"),
    ("card-digit-by-digit", "4 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1", "<CREDIT_CARD>"),
    ("card-odd-dashes", "4111-111111-111111", "<CREDIT_CARD>"),
    ("card-amex-dots", "3782.822463.10005", "<CREDIT_CARD>"),
    ("card-keycaps", "4\ufe0f\u20e31\ufe0f\u20e3" + "1" * 14, "<CREDIT_CARD>"),
    # Cards beside another digit group, which joins their run.
    ("card-after-time", "12:00:01 4111 1111 1111 1111", "12:00:01 <CREDIT_CARD>"),
    ("card-after-quantity", "qty 2 4111 1111 1111 1111", "qty 2 <CREDIT_CARD>"),
    ("card-after-word-digit", "card2 4111 1111 1111 1111", "card2 <CREDIT_CARD>"),
    ("card-before-year", "4111 1111 1111 1111 2024", "<CREDIT_CARD> 2024"),
    ("card-amex-after-digit", "amex2 x 1 3782 822463 10005", "amex2 x 1 <CREDIT_CARD>"),
    ("card-after-epoch-ms", "1714567890123 4111 1111 1111 1111", "1714567890123 <CREDIT_CARD>"),
    ("card-after-date-dashes", "2024-05-01-4111-1111-1111-1111", "2024-05-01-<CREDIT_CARD>"),
    (
        "card-two-in-a-row",
        "4111 1111 1111 1111 5555 5555 5555 4444",
        "<CREDIT_CARD> <CREDIT_CARD>",
    ),
    ("card-before-status", "card 4111 1111 1111 1111 200 OK", "card <CREDIT_CARD> 200 OK"),
    (
        "card-fullwidth-after-time",
        "１２:００:０１ ４１１１ １１１１ １１１１ １１１１",
        "１２:００:０１ <CREDIT_CARD>",
    ),
    # Emails: written out, encoded, spaced, look-alike "@" and ".".
    ("email-at-dot-words", "mail jane at example dot com now", "mail <EMAIL_ADDRESS> now"),
    ("email-at-dot-caps", "JANE AT EXAMPLE DOT COM", "<EMAIL_ADDRESS>"),
    ("email-brackets", "jane[at]example[dot]com", "<EMAIL_ADDRESS>"),
    ("email-parens", "jane (at) example (dot) co (dot) uk", "<EMAIL_ADDRESS>"),
    ("email-braces", "jane{at}example{dot}com", "<EMAIL_ADDRESS>"),
    ("email-bracket-at-plain-dot", "jane.doe[at]example.com", "<EMAIL_ADDRESS>"),
    ("email-bracketed-dot", "jane@example[.]com", "<EMAIL_ADDRESS>"),
    ("email-at-sign-dot-word", "jane@example dot com", "<EMAIL_ADDRESS>"),
    ("email-percent-40", "?email=jane%40example.com&x=1", "?email=<EMAIL_ADDRESS>&x=1"),
    ("email-percent-40-upper", "JANE%40EXAMPLE.COM", "<EMAIL_ADDRESS>"),
    ("email-percent-2540", "?to=jane%2540example.com&x=1", "?to=<EMAIL_ADDRESS>&x=1"),
    ("email-percent-252540", "jane%252540example%25252ecom", "<EMAIL_ADDRESS>"),
    ("email-json-escape", '{"to": "jane\\u0040example.com"}', '{"to": "<EMAIL_ADDRESS>"}'),
    ("email-json-escape-dot", "JANE\\u0040EXAMPLE\\u002eCOM", "<EMAIL_ADDRESS>"),
    ("email-hex-escape", "to='jane\\x40example.com'", "to='<EMAIL_ADDRESS>'"),
    ("email-html-entity", "jane&#64;example.com", "<EMAIL_ADDRESS>"),
    ("email-html-hex-entity", "jane&#x40;example.com", "<EMAIL_ADDRESS>"),
    ("email-html-named-entity", "jane&commat;example.com", "<EMAIL_ADDRESS>"),
    ("email-spaced-at", "reach jane @ example.com", "reach <EMAIL_ADDRESS>"),
    ("email-fullwidth-at", "jane＠example.com", "<EMAIL_ADDRESS>"),
    ("email-fullwidth-dot", "jane＠example．com", "<EMAIL_ADDRESS>"),
    ("email-small-at", "jane\ufe6bexample.com", "<EMAIL_ADDRESS>"),
    ("email-zwsp", "ja\u200bne@exa\u200bmple.com", "<EMAIL_ADDRESS>"),
    ("email-ideographic-stop", "jane@example。com", "<EMAIL_ADDRESS>"),
    # Authorization headers.
    (
        "basic-auth",
        "Authorization: Basic dXNlcjpwYXNzd29yZA==",
        "Authorization: Basic <BASIC_AUTH>",
    ),
    (
        "basic-auth-short",
        "-H 'Authorization: Basic YTpi'",
        "-H 'Authorization: Basic <BASIC_AUTH>'",
    ),
    (
        "proxy-basic-auth",
        "Proxy-Authorization: basic dXNlcjpwYXNz",
        "Proxy-Authorization: basic <BASIC_AUTH>",
    ),
    (
        "auth-token-scheme",
        "Authorization: Token 9a8b7c6d5e4f3a2b1c0d",
        "Authorization: Token <GENERIC_SECRET>",
    ),
    (
        "auth-no-scheme",
        '"authorization": "k3yAbc123456789xyz"',
        '"authorization": "<GENERIC_SECRET>"',
    ),
    # Basic-auth credentials on a command line.
    (
        "curl-u",
        "curl -u user:hunter2 https://api.example.com/v1",
        "curl -u user:<BASIC_AUTH> https://api.example.com/v1",
    ),
    ("curl-user", "curl --user user:hunter2 -X POST", "curl --user user:<BASIC_AUTH> -X POST"),
    ("curl-u-glued", "curl -uadmin:s3cr3t x", "curl -uadmin:<BASIC_AUTH> x"),
    ("curl-u-quoted", "curl -u 'ops:pa ss' x", "curl -u 'ops:<BASIC_AUTH>' x"),
    ("curl-proxy-user", "curl --proxy-user px:hunter2 x", "curl --proxy-user px:<BASIC_AUTH> x"),
    # AWS secret keys without a label, next to their key id.
    ("aws-pair-space", f"{AWS_ID} {AWS_SECRET}", "<AWS_ACCESS_KEY> <AWS_SECRET_KEY>"),
    (
        "aws-pair-csv",
        f"Access key ID,Secret access key\n{AWS_ID},{AWS_SECRET}\n",
        "Access key ID,Secret access key\n<AWS_ACCESS_KEY>,<AWS_SECRET_KEY>\n",
    ),
    (
        "aws-pair-lines",
        f"key: {AWS_ID}\nsecret: {AWS_SECRET}",
        "key: <AWS_ACCESS_KEY>\nsecret: <AWS_SECRET_KEY>",
    ),
    ("aws-pair-secret-first", f"{AWS_SECRET} / {AWS_ID}", "<AWS_SECRET_KEY> / <AWS_ACCESS_KEY>"),
    ("aws-id-fullwidth", "ＡＫＩＡＩＯＳＦＯＤＮＮ７ＥＸＡＭＰＬＥ", "<AWS_ACCESS_KEY>"),
    # Secrets encoded in base64 or hex.
    ("b64-password", f"blob {b64('password=hunter2')}", "blob <CONNECTION_STRING_PASSWORD>"),
    ("b64-aws-id", f"v={b64(AWS_ID)};", "v=<AWS_ACCESS_KEY>;"),
    (
        "b64-aws-secret",
        f"data {b64('aws_secret_access_key = ' + AWS_SECRET)}",
        "data <AWS_SECRET_KEY>",
    ),
    ("b64-private-key", f"tls.key: {b64(RSA_BLOCK)}", "tls.key: <PRIVATE_KEY>"),
    (
        "b64-url-safe",
        "x " + base64.urlsafe_b64encode(b'{"password": "correct>horse?battery>staple"}').decode(),
        "x <CONNECTION_STRING_PASSWORD>",
    ),
    ("b64-twice", f"x {b64(b64('password=hunter2'))}", "x <CONNECTION_STRING_PASSWORD>"),
    ("b64-password-colon", "cGFzc3dvcmQ6IGh1bnRlcjI=", "<CONNECTION_STRING_PASSWORD>"),
    (
        "b64-yaml-password",
        f"config.yaml: {b64('db:' + chr(10) + '  password: hunter2' + chr(10))}",
        "config.yaml: <CONNECTION_STRING_PASSWORD>",
    ),
    ("b64-email", f"user {b64('jane.doe@example.com')}", "user <EMAIL_ADDRESS>"),
    (
        "b64-wrapped",
        "key\n"
        + "\n".join(b64(RSA_BLOCK * 2)[i : i + 76] for i in range(0, len(b64(RSA_BLOCK * 2)), 76))
        + "\nend",
        "key\n<PRIVATE_KEY>\nend",
    ),
    (
        "hex-password",
        f"hex {b'password=hunter2'.hex()}",
        "hex <CONNECTION_STRING_PASSWORD>",
    ),
    (
        "hex-upper-aws",
        f"{('aws_secret_access_key=' + AWS_SECRET).encode().hex().upper()}",
        "<AWS_SECRET_KEY>",
    ),
    # Secrets given in a secret-ish context.
    ("hex-after-secret", f"api_secret: {HEX_SECRET}", "api_secret: <GENERIC_SECRET>"),
    (
        "hex-json-camel",
        f'{{"clientSecret": "{HEX_SECRET[:32]}"}}',
        '{"clientSecret": "<GENERIC_SECRET>"}',
    ),
    ("hex-env", f"WEBHOOK_SIGNING_KEY={HEX_SECRET}", "WEBHOOK_SIGNING_KEY=<GENERIC_SECRET>"),
    (
        "token-flag",
        f"cli --auth-token {HEX_SECRET[:40]} --verbose",
        "cli --auth-token <GENERIC_SECRET> --verbose",
    ),
    (
        "token-yaml",
        "  refresh_token: 1//0gAbCdEfGhIjKlMnOpQrStUvWxYz",
        "  refresh_token: <GENERIC_SECRET>",
    ),
    (
        "api-key-header",
        "X-Api-Key: 6f1ed002ab5595859014ebf0951522d9",
        "X-Api-Key: <GENERIC_SECRET>",
    ),
    (
        "json-password",
        '{"user": "app", "password": "hunter2"}',
        '{"user": "app", "password": "<CONNECTION_STRING_PASSWORD>"}',
    ),
    # Colours read as a terminal shows them: grep --color=always between a key's name and its
    # value, an application's coloured log inside a key; tput's ESC(B; a hyperlink's target.
    (
        "colour-in-name",
        "db_\x1b[01;31m\x1b[Kpassword\x1b[m\x1b[K=hunter2hunter2",
        "db_\x1b[01;31m\x1b[Kpassword\x1b[m\x1b[K=<CONNECTION_STRING_PASSWORD>",
    ),
    (
        "colour-in-key",
        f"key \x1b[1m{AWS_ID[:8]}\x1b[0m{AWS_ID[8:]} ok",
        "key \x1b[1m<AWS_ACCESS_KEY> ok",
    ),
    (
        "colour-after-prefix",
        "api_token=\x1b[01;31m\x1b[Kghp_\x1b[m\x1b[KaBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
        "api_token=\x1b[01;31m\x1b[K<GITHUB_TOKEN>",
    ),
    (
        "charset-reset-in-name",
        "x\x1b(B\x1b[mpassword\x1b(B\x1b[m=hunter2hunter2 ok",
        "x\x1b(B\x1b[mpassword\x1b(B\x1b[m=<CONNECTION_STRING_PASSWORD> ok",
    ),
    # UTF-16 text as cat prints it (a NUL after each ASCII character), and other controls a
    # terminal shows as nothing.
    (
        "utf-16",
        "k\x00e\x00y\x00 \x00" + "\x00".join(AWS_ID) + "\x00\n\x00",
        "k\x00e\x00y\x00 \x00<AWS_ACCESS_KEY>\x00\n\x00",
    ),
    (
        "utf-16-password",
        "\x00".join("password=hunter2hunter2") + "\x00",
        "\x00".join("password=") + "\x00<CONNECTION_STRING_PASSWORD>\x00",
    ),
    ("bell-in-key", f"{AWS_ID[:6]}\x07\x7f{AWS_ID[6:]}", "<AWS_ACCESS_KEY>"),
    (
        "hyperlink-target",
        "see \x1b]8;;https://app:hunter2@db/x\x1b\\db\x1b]8;;\x1b\\ ok",
        "see \x1b]8;;https://app:<CONNECTION_STRING_PASSWORD>@db/x\x1b\\db\x1b]8;;\x1b\\ ok",
    ),
]


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in EVASIONS], ids=[c[0] for c in EVASIONS]
)
def test_evasion_is_redacted(text: str, expected: str) -> None:
    assert redacted(text) == expected


# Ordinary ops output: it must reach the model as it is.
OPS_OUTPUT: list[tuple[str, str]] = [
    ("iso-timestamp", "2024-05-01T12:34:56.789123+02:00 INFO started"),
    ("syslog-timestamp", "May  1 12:34:56 web-01 systemd[1]: Started nginx.service."),
    ("epoch-ms", '{"ts": 1714567890123, "took_ns": 1234567890123456}'),
    ("git-sha", "commit 3f9a1c2e4b5d6f708192a3b4c5d6e7f8091a2b3c (HEAD -> main)"),
    ("git-short-shas", "3f9a1c2 fix, 8d0e4b1 revert, merge a1b2c3d4e5f6a7b8c9d0"),
    ("uuid", "request_id=123e4567-e89b-12d3-a456-426614174000"),
    ("uuid-digits", "id 12345678-1234-1234-1234-123456789012"),
    (
        "trace-ids",
        '{"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"}',
    ),
    (
        "docker-digest",
        "image nginx@sha256:0337f2143e4f17400fcb44b3fcba4843d2380b6a8c10562b7b994e16150e5651",
    ),
    ("etag", 'ETag: "33a64df551425fcc55e4d42a148795d9f25f89d4"'),
    ("checksums", "sha1sum: 2fd4e1c67a2d28fced849ee1bb76e7391b93eb12  app.tar.gz"),
    ("cache-key", "cache key: 5d41402abc4b2a76b9719d911017c592 miss"),
    ("percentages", "cpu 99.95% mem 12.5% disk 100% p99 0.25%"),
    ("hostnames", "connected to db-primary.eu-west-1.internal at 10:02"),
    ("aws-hostname", "ip-10-0-1-23.ec2.internal ec2-54-12-34-56.compute-1.amazonaws.com"),
    ("deployed-at", "deployed at api.example.com, listening at :8080 since 12:00"),
    ("version-ip-ish", "version 10.2.3.4, firmware: 1.0.0.12, kernel 5.15.0.1051"),
    ("versions", "python 3.11.4, v1.2.3.4, Chrome/124.0.6367.91, 1.17.98-rc.1+build.5"),
    ("durations", "took 1h2m3.5s (3723.5s), p50 12.5ms, p99 1.234s, 450µs, 3d4h"),
    ("k8s-pods", "api-7d9f8b6c5-x2x9z   1/1     Running   0          3d4h"),
    ("k8s-cronjob-pod", "backup-28472910-abcde   0/1     Completed   0    12m"),
    ("k8s-statefulset", "db-0 db-1 kafka-2 zookeeper-0"),
    ("java-frames", "\tat com.example.billing.InvoiceService.render(InvoiceService.java:42)"),
    ("java-exception", "java.lang.IllegalStateException: pool exhausted at startup"),
    ("python-decorator-matmul", "@app.route('/x')  # y = a @ b"),
    ("scoped-npm", "npm i @types/node@20.11.5"),
    ("at-prose", "failed at step 3 at 12:00, retry at 12:05 dot release"),
    ("basic-prose", "Basic authentication is disabled; basic usage below"),
    ("authorization-prose", "authorization: required; Authorization: none"),
    ("www-authenticate", 'WWW-Authenticate: Basic realm="example"'),
    ("bearer-placeholder", "Authorization: Bearer ${TOKEN}"),
    ("df", "/dev/sda1 102687672 45678912 51234567 48% /"),
    ("proc-stat", "cpu  4705 356 584 3699 23 23 0 0 0 0"),
    ("load-average", "load average: 0.52, 0.48, 0.40"),
    ("floats", '{"duration": 3.7123456789012, "ratio": 4.123456789012345}'),
    ("dates", "2024-05-01 2024.05.01 01.05.2024 20240501-123456"),
    ("paths", "/usr/lib/python3.11/site-packages/app/db.py /api/v2/invoices/12345/lines"),
    ("base64-benign", f"content: {b64('hello world, this is fine')}"),
    ("base64-binary", "nonce: q9s8d7f6g5h4j3k2l1m0n9b8v7c6x5z4"),
    ("token-counts", "tokens: 1234, max_tokens=4096, token_count: 98765"),
    ("secret-name", "secretName: db-credentials-v2, tokenRef: api-token-store"),
    ("masked", "password=*** api_key: ************************"),
    ("non-ascii-prose", "Grüße aus Köln — “quotes” … 日本語のログ ✓ → done"),
    ("ipv6-like-times", "12:34:56 std::vector<int> Foo::bar"),
    ("pid-list", "pgrep: 4123 4211 4310 4402 4511 4630"),
    ("time-and-counts", "12:00:01 1234 5678 9012 3456 2024"),
    ("docker-user", "docker run -u 1000:1000 img; docker exec -u app:app web sh"),
    ("user-flag-placeholders", "curl -u $USER:$API_TOKEN x; curl -u admin x; git push -u origin"),
    ("sort-uniq", "sort -u hosts.txt | uniq -c"),
    ("k8s-secret-volume", "volumes:\n- name: certs\n  secret:\n    secretName: tls-2024"),
    ("k8s-secret-names", "secret: my-tls-secret-v2\ntoken: default-token-x7k2p"),
    ("etc-passwd", "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/sbin/nologin"),
    ("colon-fields", "web-01:8080:GET:healthz:200 12:34:56:789"),
    ("dockerfile", "FROM node:20\nENV NODE_ENV production\nENV PORT 8080\nCMD node ."),
    ("shell-dollars", "awk '{print $1$2}' x; echo $5$6"),
    ("terraform-outputs", "$ terraform output -raw vpc_id\nvpc-0abc123def4567890"),
    ("password-prose", "password: the same one as before\nPassword: it has been changed"),
    ("env-listing", "HOME=/root\nPATH=/usr/bin:/bin\nLANG=C.UTF-8"),
    ("coloured-ls", "\x1b[0m\x1b[01;34mbin\x1b[0m  \x1b[01;32mrun.sh\x1b[0m  notes.txt"),
    ("coloured-log", "\x1b[36m12:00:01\x1b[0m \x1b[1;33mWARN\x1b[0m pool 9/10 \x1b[?25h"),
]


@pytest.mark.parametrize("text", [c[1] for c in OPS_OUTPUT], ids=[c[0] for c in OPS_OUTPUT])
def test_ops_output_passes_untouched(text: str) -> None:
    assert GUARD.scan_output(text).hits == ()
    assert redacted(text) == text


# --- folding and offsets ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("abc", "abc"),
        ("４\u200b２", "42"),
        ("a\u00a0b", "a b"),
        ("a\x1b[01;31m\x1b[Kb\x1b[m", "ab"),
        ("a\x1b(Bb\x1b", "ab"),
        ("\x1b]8;;u\x1b\\", "8;;u"),
        ("a\x00b\x01\x1fc\x7f\td\r\n\x0b\x0c", "a\x00bc\td\r\n\x0b\x0c"),
        ("x=\x00a\x00b\x00c\x00d\x00", "x=abcd"),  # UTF-16's NULs are nothing
        ("A=1\x00B=2\x00", "A=1\x00B=2\x00"),  # environ's separate values
        ("４\x1b[1mé", "4?"),
        ("x½y", "x1?2y"),
        ("Grüße", "Gr??e"),
        ("e\u0301", "e"),
        ("\u2028", "\n"),
    ],
)
def test_fold(text: str, expected: str) -> None:
    assert fold(text)[0] == expected


def test_hits_are_mapped_back_over_expansions_and_dropped_characters() -> None:
    text = (
        "½\u200b\u200b card ４\u200b１１１ １１１１ １１１１ １１１１\u200b then ﬁ jane@example.com"
    )
    hits = resolve_overlaps(Scanner()(text), len(text))
    assert [(h.entity_type, text[h.start : h.end]) for h in hits] == [
        ("CREDIT_CARD", "４\u200b１１１ １１１１ １１１１ １１１１"),
        ("EMAIL_ADDRESS", "jane@example.com"),
    ]


def test_a_hit_inside_an_expansion_covers_the_whole_character() -> None:
    # "⑴" folds to "(1)": a hit that ends inside it still covers the character.
    text = "call (555) 123-4567 ok ⑽"
    assert redacted(text) == "call <PHONE_NUMBER> ok ⑽"


def test_decoded_hits_follow_the_enabled_entities() -> None:
    blob = b64("password=hunter2")
    only_emails = PiiGuard(PiiSettings(entities=["EMAIL_ADDRESS"]))
    assert only_emails.scan_output(f"x {blob}").text == f"x {blob}"
    only_passwords = PiiGuard(PiiSettings(entities=["CONNECTION_STRING_PASSWORD"]))
    assert only_passwords.scan_output(f"x {blob}").text == "x <CONNECTION_STRING_PASSWORD>"


def test_nesting_deeper_than_the_limit_is_not_decoded() -> None:
    blob = b64(b64(b64("password=hunter2")))
    assert redacted(f"x {blob}") == f"x {blob}"


def test_reject_mode_withholds_an_evasion() -> None:
    guard = PiiGuard(PiiSettings(mode=PiiMode.REJECT))
    assert not guard.scan_prompt("my card: 4111\u200b1111\u200b1111\u200b1111").allowed


def _adversarial(part: int) -> list[str]:
    """The hostile inputs, each repeated part ``1/part`` as long as in the worst case seen."""

    def n(count: int) -> int:
        return max(1, count // part)

    return [
        "at " * n(40_000),
        "a at b dot " * n(15_000),
        "[at]" * n(30_000),
        "%40" * n(40_000),
        "%25" * n(40_000),
        "a%2540" * n(20_000),
        "\\u0040" * n(20_000),
        "&#64;" * n(25_000),
        "a @ " * n(30_000),
        "4 " * n(60_000),
        "4." * n(60_000),
        "A" * n(120_000),
        "QUFB" * n(30_000),
        b64("password=x " * n(9_000)),
        "\u200b" * n(100_000),
        "４" * n(100_000),
        "½" * n(100_000),
        "\x1b[1mx" * n(50_000),
        "x\x00" * n(50_000),
        "\x1b[" + "1;" * n(50_000),
        "AKIAIOSFODNN7EXAMPLE " * n(5_000),
        "4111 " * n(30_000),
        "1 4111 1111 1111 1111 " * n(6_000),
        "-u a:b " * n(20_000),
        "-u" * n(60_000),
        b64("password: x " * n(9_000)),
        # A block wrapped over lines was read again from each of its lines to its end.
        wrapped(binary(n(200_000))),
        wrapped(("status: ok, " * n(20_000)).encode()),
        wrapped(binary(n(100_000)) + b"password: hunter2 " * n(5_000), 64),
        # Lines of text that each end on a byte that is not UTF-8: a text tail was tried from
        # each, and each try that failed copied the rest of the block into its error.
        wrapped((b"abc" * 14 + b"x\xff") * n(64_000), 60),
    ]


# Each input at two sizes, the larger about 8 times the smaller (more where lines are indented
# deeper and deeper): a linear scan takes about as many times as long on it, a quadratic one
# that many squared.
ADVERSARIAL = list(zip(_adversarial(32), _adversarial(4), strict=True))


@pytest.mark.parametrize("sizes", ADVERSARIAL, ids=lambda sizes: repr(sizes[1][:12]))
def test_adversarial_input_scans_in_linear_time(sizes: tuple[str, str]) -> None:
    small, large = sizes
    assert_linear(Scanner(), small, large, k=len(large) / len(small))


@pytest.mark.parametrize("width", [64, 76])
@pytest.mark.parametrize("words", ["# the settings, ", "naïve café, "], ids=["ascii", "utf-8"])
def test_a_text_after_binary_data_in_one_wrapped_block_is_found(width: int, words: str) -> None:
    # One block may hold binary data and then text (an archive's header, then a config): the
    # text is read from the first line after the binary part that starts a character (with
    # UTF-8 text, most lines start inside one).
    head = binary(3_000)
    block = wrapped(head + (words * 40 + "\npassword: hunter2\n").encode(), width)
    out = redacted(f"key\n{block}\nend")
    kept, placeholder, _ = out.partition("<CONNECTION_STRING_PASSWORD>")
    assert placeholder and out.endswith(">\nend"), out
    # The binary part's lines stay as they were; no line of the text does.
    lines = kept.removeprefix("key\n").splitlines()
    assert lines == block.splitlines()[: len(lines)]
    assert len(head) * 4 // 3 // width - 1 <= len(lines) <= (len(head) + 200) * 4 // 3 // width


@pytest.mark.parametrize("width", [64, 76])
def test_a_text_after_binary_data_is_found_before_a_line_that_reads_as_control_bytes(
    width: int,
) -> None:
    # A block that ends on a full line takes the next line as its last, as base64 of a
    # colored "ok" is: its ESC is the block's last control byte, and the line it falls in
    # is no text of the block's. The tail before it is still the config's.
    config = ("# the settings, " * 40 + "\npassword: hunter2\n").encode()
    data = binary(3_000) + config
    data += b" " * (-len(data) % (width * 3 // 4))  # the block ends on a full line
    colored_ok = b64("\x1b[32mok\x1b[0m")
    out = redacted(f"key\n{wrapped(data, width)}\n{colored_ok}\nend")
    assert "<CONNECTION_STRING_PASSWORD>" in out, out
