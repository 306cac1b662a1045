"""Secrets that no label names, known by the shape of the file or output that holds them:
.pgpass lines, password hashes (.htpasswd, /etc/shadow), a Dockerfile's legacy ENV, Windows's
cmdkey, Oracle's user/password@db logins, and the line a secret-printing command printed
under its own echoed command line (a shell's transcript, ``set -x``, a CI log)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from bot.patterns import finditer_with, on_use
from bot.pii.checks import anchored_finditer, word_before
from bot.pii.labelled import (
    PLACEHOLDER_STARTS,
    SECRET_PATH,
    docker_env_value_end,
    generated_alone,
    secret_name,
)
from bot.pii.scantext import PiiHit, ScanText

# .pgpass: hostname:port:database:username:password, a line each, any field but the password
# perhaps "*"; or the line echo or printf writes to one. Found from a port of four or five
# digits or a "*" between colons, in the shape view (every digit a "0"), where a time's
# two-digit fields and a URL's port ("host:8080/") never match.
_PGPASS_LINE = on_use(
    r"[ \t]*+(?P<host>[A-Za-z0-9*][A-Za-z0-9_.*-]{0,252}+|/[^\s:]{1,252}+):(?P<port>[0-9]{1,5}|\*)"
    r":(?P<db>[A-Za-z0-9_.*-]{1,63}+):(?P<user>[A-Za-z0-9_.@*-]{1,63}+)"
    r":(?P<password>(?:[^\r\n:\\]|\\.){1,256}+)\r?"
)
_PGPASS_PORT = b"0000:"  # the end of a port of four digits or five: the line's match decides
_PGPASS_ANY_PORT = b":*:"
# What echo or printf prints, its argument quoted or bare: a .pgpass line, chpasswd's input.
_ECHO_ARGUMENT = (
    r"(?:echo|printf)[ \t]++(?:-[en]{1,2}+[ \t]++)?"
    r"(?:\"(?P<dq>[^\"\r\n]{1,1024}+)\"|'(?P<sq>[^'\r\n]{1,1024}+)'"
    r"|(?P<bare>[^\s\"'|;&<>]{1,1024}+))"
)
_ECHO = on_use(_ECHO_ARGUMENT)
# Ports a .pgpass is written for (PostgreSQL's, PgBouncer's); with another, the line must say
# otherwise that it is one: a host with a dot or localhost, or a field that is "*".
_PGPASS_PORTS = frozenset({"*", "5432", "5433", "5434", "5435", "6432"})


def _pgpass_lines(src: ScanText) -> Iterator[PiiHit]:
    """The passwords of the .pgpass lines, each line read once whichever anchor found it."""
    text, shape = src.text, src.shape
    read: set[int] = set()  # the starts of the lines read: a line both anchors find, once
    anchors = (_PGPASS_PORT, _PGPASS_ANY_PORT) if "*" in text else (_PGPASS_PORT,)  # memchr
    for anchor in anchors:
        position = shape.find(anchor)
        while position >= 0:
            start = text.rfind("\n", 0, position) + 1
            end = text.find("\n", position)
            end = len(text) if end < 0 else end
            if start not in read:
                read.add(start)
                yield from _pgpass_line(text, start, end)
            position = shape.find(anchor, end)


def _pgpass_line(text: str, start: int, end: int) -> Iterator[PiiHit]:
    """The password of the line at [start, end) if it is a .pgpass line, or echo writes one."""
    line = _PGPASS_LINE.fullmatch(text, start, end) or _echoed_pgpass(text, start, end)
    if line is None:
        return
    host, port = line.group("host"), line.group("port")
    stars = "*" in (host, line.group("db"), line.group("user"))
    if port in _PGPASS_PORTS or stars or "." in host or host == "localhost":
        stop = line.end("password")
        yield PiiHit("CONNECTION_STRING_PASSWORD", line.start("password"), stop)


def _echoed_pgpass(text: str, start: int, end: int) -> re.Match[str] | None:
    """The .pgpass line that an echo or a printf on the line at [start, end) prints."""
    for echo in _ECHO.finditer(text, start, end):
        line = _PGPASS_LINE.fullmatch(text, *echo.span(echo.lastgroup or "bare"))
        if line is not None:
            return line
    return None


# Password hashes: MD5-crypt ($1$, Apache's $apr1$), SHA-crypt ($5$, $6$, with rounds=),
# bcrypt ($2a$, $2b$, $2y$), yescrypt ($y$), argon2 ($argon2id$v=19$m=...,t=...,p=...$) and
# LDAP's schemes: {SHA}/{SSHA}, pw-sha2's {SSHA512} and kin, {MD5}, 389 Directory Server's and
# FreeIPA's {PBKDF2_SHA256}. A hash is offline-crackable: the model needs to know one is
# there, not what it is.
_CRYPT_HASH = on_use(
    r"\$(?:(?:apr1|1|5|6)\$(?:rounds=[0-9]{1,9}+\$)?[./A-Za-z0-9]{1,16}+\$[./A-Za-z0-9]{22,}+"
    r"|2[abxy]\$[0-9]{2}\$[./A-Za-z0-9]{53}"
    r"|y\$[./A-Za-z0-9]{1,16}+\$[./A-Za-z0-9]{1,64}+\$[./A-Za-z0-9]{43}"
    r"|argon2(?:id|i|d)\$v=[0-9]{1,3}+\$m=[0-9]{1,10}+,t=[0-9]{1,10}+,p=[0-9]{1,3}+"
    r"\$[A-Za-z0-9+/]{8,}+\$[A-Za-z0-9+/]{16,}+)"
    r"(?![./A-Za-z0-9])"
)
_LDAP_HASH = on_use(
    r"\{(?:S?SHA(?:256|384|512)?|S?MD5)\}[A-Za-z0-9+/]{22,}+=*"
    r"|\{PBKDF2(?:[-_]SHA(?:1|256|512))?\}[A-Za-z0-9+/.$-]{20,}+=*"
)
_LDAP_SCHEME_ENDS = ("SHA}", "SHA256}", "SHA384}", "SHA512}", "MD5}", "{PBKDF2")


def _password_hashes(text: str) -> Iterator[PiiHit]:
    """Crypt-style and LDAP password hashes, whole."""
    # From each "$" (memchr: a few in most outputs, and the pattern compiled only after one).
    for match in anchored_finditer(_CRYPT_HASH, text, "$"):
        yield PiiHit("GENERIC_SECRET", match.start(), match.end())
    if "{" in text:  # memchr before the longer search
        for match in finditer_with(_LDAP_HASH, text, *_LDAP_SCHEME_ENDS):
            yield PiiHit("GENERIC_SECRET", match.start(), match.end())


# A Dockerfile's ENV in its legacy form, ``ENV NAME value``: the value is the rest of the line
# (``docker history`` shows it after ``#(nop)``). A name that ends in SECRET, TOKEN or KEY is
# found with the environment's variables; this finds a password's (DB_PASSWORD, SMTP_PASS).
_DOCKER_ENV = on_use(
    r"ENV[ \t]++(?P<name>[A-Za-z_][A-Za-z0-9_]{0,127}+)[ \t]++(?P<value>[^\s=][^\r\n]{0,255}+)"
)
_PASSWORD_ENDS = ("PASSWORD", "PASSWD", "_PASS", "_PWD")


def _docker_env_passwords(text: str) -> Iterator[PiiHit]:
    """The value of a legacy ENV NAME value whose name is a password's."""
    for match in finditer_with(_DOCKER_ENV, text, "ENV "):
        name = match.group("name").upper().removesuffix("S")
        if word_before(text, match.start()) or not name.endswith(_PASSWORD_ENDS):
            continue
        start = match.start("value")
        end = docker_env_value_end(text, start, match.end("value"))
        value = text[start:end]
        if value.startswith(PLACEHOLDER_STARTS) or SECRET_PATH.fullmatch(value):
            continue
        yield PiiHit("GENERIC_SECRET", start, end)


# Windows's cmdkey /add or /generic with /pass:PASSWORD (quoted when it holds a blank); and an
# Oracle login, user/password@database, in a thin JDBC URL or on sqlplus's command line
# (its options before it: -s, -l, -m "...").
_CMDKEY_PASS = on_use(
    r"/pass:(?<![^\s]/pass:)(?:\"(?P<dq>[^\"\r\n]{1,256}+)\"|(?P<bare>[^\s\"]{1,256}+))"
)
_ORACLE_LOGIN = on_use(
    r"(?:thin:|sqlplus[ \t]++(?:-[a-z]++[ \t]++)*+)[\"']?"
    r"[a-z0-9_$#]{1,128}+/(?P<password>[^\s@/\"']{1,256}+)@"
)


_ORACLE_CLIENTS = ("thin:", "sqlplus")
_LINE_REACH = 256  # how far back on its line a login or a command is looked for


def _cmdkey_passwords(lower: str) -> Iterator[PiiHit]:
    """The password of cmdkey's /pass:, quoted or bare."""
    for match in finditer_with(_CMDKEY_PASS, lower, "/pass:"):
        group = match.lastgroup or "bare"
        if not match.group(group).startswith(PLACEHOLDER_STARTS):
            yield PiiHit("CONNECTION_STRING_PASSWORD", *match.span(group))


def _oracle_passwords(text: str, lower: str) -> Iterator[PiiHit]:
    """Found from each "@" (memchr: rare in most outputs), then the client on its line before
    it, within reach: two searches of the text for the clients' names cost more."""
    done = 0  # the end of the last login: an "@" inside it is part of it
    at = text.find("@")
    while at >= 0:
        low = max(done, at - _LINE_REACH)
        line = lower.rfind("\n", low, at) + 1 or low
        for client in _ORACLE_CLIENTS:
            begin = lower.rfind(client, line, at)
            login = _ORACLE_LOGIN.match(lower, begin, at + 1) if begin >= 0 else None
            if login is not None and not login.group("password").startswith(PLACEHOLDER_STARTS):
                done = login.end()
                yield PiiHit("CONNECTION_STRING_PASSWORD", *login.span("password"))
                break
        at = text.find("@", at + 1)


# A password as a command's positional argument: htpasswd in batch mode (-b: FILE USER
# PASSWORD, or USER PASSWORD with -n), chpasswd reading echo's or printf's USER:PASSWORD lines,
# rabbitmqctl change_password or add_user USER PASSWORD. But add_user, each command's name
# holds "pass", which the text is searched for anyway.
_HTPASSWD = on_use(r"htpasswd(?<![A-Za-z0-9_.-]htpasswd)(?P<rest>[^\r\n|;&]{0,256}+)")
_ARGUMENT = on_use(r"\"(?P<dq>[^\"]*+)\"|'(?P<sq>[^']*+)'|(?P<bare>[^\s\"']++)")
_HTPASSWD_VALUED = frozenset({"-C", "-r"})  # options that take a value: bcrypt's cost, rounds
_CHPASSWD = on_use(_ECHO_ARGUMENT + r"[ \t]*+\|[ \t]*+(?:sudo[ \t]++)?chpasswd")
# One USER:PASSWORD line of chpasswd's input; the lines apart by an escaped line end ("\n").
_CHPASSWD_LINE = on_use(r"[^:\s\\]{1,64}+:(?P<password>[^\s\\]{1,256}+)")
_RABBITMQ_PASSWORD = on_use(
    r"(?:change_password|add_user)[ \t]++(?:\"[^\"\r\n]*+\"|'[^'\r\n]*+'|[^\s\"']++)[ \t]++"
    r"(?:\"(?P<dq>[^\"\r\n]{1,256}+)\"|'(?P<sq>[^'\r\n]{1,256}+)'|(?P<bare>[^\s\"']{1,256}+))"
)


def _htpasswd_password(text: str) -> Iterator[PiiHit]:
    """The password htpasswd -b takes as its last positional argument."""
    for command in finditer_with(_HTPASSWD, text, "htpasswd"):
        flags, takes_value = "", False
        positionals: list[re.Match[str]] = []
        for argument in _ARGUMENT.finditer(text, *command.span("rest")):
            word = argument.group()
            if takes_value:
                takes_value = False
            elif word.startswith("-") and not positionals:
                flags += word[1:]
                takes_value = word in _HTPASSWD_VALUED
            else:
                positionals.append(argument)
        place = 1 if "n" in flags else 2
        if "b" in flags and len(positionals) > place:
            group = positionals[place].lastgroup or "bare"
            yield PiiHit("CONNECTION_STRING_PASSWORD", *positionals[place].span(group))


def _positional_passwords(text: str) -> Iterator[PiiHit]:
    """The passwords htpasswd -b, chpasswd and rabbitmqctl take as arguments."""
    yield from _htpasswd_password(text)
    for match in finditer_with(_CHPASSWD, text, "chpasswd"):
        for line in _CHPASSWD_LINE.finditer(text, *match.span(match.lastgroup or "bare")):
            yield PiiHit("CONNECTION_STRING_PASSWORD", *line.span("password"))
    for match in finditer_with(_RABBITMQ_PASSWORD, text, "change_password", "add_user"):
        group = match.lastgroup or "bare"
        if not match.group(group).startswith(PLACEHOLDER_STARTS):
            yield PiiHit("CONNECTION_STRING_PASSWORD", *match.span(group))


# An installer's generated password in a sentence: "A temporary password is generated for
# root@localhost: X" (MySQL's first start), "The admin password is: X".
_ANNOUNCED_PASSWORD = on_use(
    r"password[ \t]++is(?:[ \t]++generated)?+(?:[ \t]++for[ \t]++[^\s:]{1,128}+)?+:[ \t]++"
    r"(?P<value>[^\s]{1,256}+)"
)


def _announced_passwords(text: str, lower: str) -> Iterator[PiiHit]:
    """A generated password a sentence announces, alone at its line's end."""
    for match in finditer_with(_ANNOUNCED_PASSWORD, lower, "password"):
        start, end = match.span("value")
        if generated_alone(text, text[start:end], end):
            yield PiiHit("CONNECTION_STRING_PASSWORD", start, end)


def find_shaped_secrets(src: ScanText) -> Iterator[PiiHit]:
    """.pgpass passwords, password hashes, a Dockerfile's ENV NAME value for a password,
    cmdkey's /pass:, Oracle's user/password@db, the passwords htpasswd -b, chpasswd and
    rabbitmqctl change_password take as arguments, and a generated one a sentence announces."""
    text = src.text
    yield from _pgpass_lines(src)
    yield from _password_hashes(text)
    if src.holds("pass") or src.holds("pwd"):  # C searches, shared with other recognizers
        yield from _docker_env_passwords(text)
    if src.holds("pass"):  # a C search, shared with other recognizers
        yield from _cmdkey_passwords(src.lower)
        yield from _positional_passwords(text)
        yield from _announced_passwords(text, src.lower)
    elif "add_user" in text:
        yield from _positional_passwords(text)
    if "@" in text:
        yield from _oracle_passwords(text, src.lower)


# A command that prints a secret alone, echoed on its line, and the line it printed: terraform
# (or tofu) output of a secret-named output, heroku config:get and aws configure get of a
# secret-named variable, vault's -field (any of kv get's, a secret-named one of the other
# commands'), kubectl's jsonpath or go-template of a Secret,
# gcloud secrets versions access, cat of a secret-named file. Each found from a literal and
# read no further than its line (bounded: a long line of repeated command words costs a
# constant each).
_PRINTED = r"[^\r\n]{0,256}+\r?\n(?P<value>[^\r\n]++)"
# Global options (-chdir=) may stand between terraform (or tofu) and output; a few of them and
# of output's own, so that each name of the client costs a bounded read.
_TERRAFORM_OUTPUT = on_use(
    r"(?:terraform|tofu)(?:[ \t]++-[^\s]{1,256}+){0,8}+[ \t]++output[ \t]++"
    r"(?:-[a-z-]{1,16}+(?:=[^\s]{0,256}+)?[ \t]++){0,8}+"
    r"[\"']?(?P<name>[a-z0-9_-]{1,128}+)[\"']?(?![a-z0-9_-])" + _PRINTED
)
_CONFIG_GET = on_use(
    r"config(?::get|ure[ \t]+get)[ \t]+(?P<name>[a-z0-9_.-]{1,128}+)(?![a-z0-9_.-])" + _PRINTED
)
_VAULT_FIELD = on_use(r"-field(?:=|[ \t]++)(?P<field>[a-z0-9_.-]{1,128}+)" + _PRINTED)
_SECRET_TEMPLATE = on_use(
    r"get[ \t]+secrets?[ \t][^\r\n]{0,256}?(?:jsonpath|go-template)" + _PRINTED
)
_GCLOUD_ACCESS = on_use(r"secrets[ \t]+versions[ \t]+access[ \t]" + _PRINTED)
# cat of a file named for a secret (Jenkins's secrets/initialAdminPassword, a token file), with
# its options, the name perhaps quoted, perhaps an echo after it for the line end the file lacks.
_CAT_FILE = on_use(
    r"cat(?<![A-Za-z0-9_.-]cat)[ \t]++(?:-[a-z]{1,8}+[ \t]++)*+"
    r"(?:(?P<q>[\"'])(?P<quoted>(?:(?!(?P=q))[^\r\n]){1,256}+)(?P=q)|(?P<name>[^\s|;&<>\"']{1,256}+))"
    r"[ \t]*+(?:(?:;|&&)[ \t]*+echo[ \t]*+)?\r?\n(?P<value>[^\r\n]++)"
)
# The words of which a secret-printing command's line holds one: the secret's name, or its kind.
_GATE_WORDS = ("secret", "pass", "token", "key", "credential")
_SECRET_WORD = ("secret",)
_FILE_GATE_WORDS = ("secret", "pass", "token", "credential")  # a key file is found as a key
# Each with its literal, the words its line must hold before it (none: the pattern says them),
# and the words of which the text holds one if it can hold the command's secret (all searched
# for by other recognizers too).
_PRINTING_COMMANDS: tuple[tuple[re.Pattern[str], str, tuple[str, ...], tuple[str, ...]], ...] = (
    (_TERRAFORM_OUTPUT, "output", (), _GATE_WORDS),
    (_CONFIG_GET, "config", (), _GATE_WORDS),  # heroku config:get, aws configure get
    (_VAULT_FIELD, "-field", ("vault",), _GATE_WORDS),
    (_SECRET_TEMPLATE, "get secret", ("kubectl",), _SECRET_WORD),
    (_GCLOUD_ACCESS, "secrets versions", ("gcloud",), _SECRET_WORD),
    (_CAT_FILE, "cat ", (), _FILE_GATE_WORDS),
)
# What a command prints when it prints no secret: an error, a warning, a placeholder, set -x's
# trace of the next command; and terraform's error box, whose first line (a lone "╷") the scan
# reads as "?".
_NOT_PRINTED = (
    *("error", "warning", "usage", "no outputs", "(sensitive", "+ "),
    *PLACEHOLDER_STARTS,
)
_ERROR_BOX = "?"


# Files of many lines in a structured format: the first line cat prints is a key's or a
# brace, and a secret in them is found by its key (password: x, "token": "x", API_TOKEN=x).
_STRUCTURED_EXTENSIONS = frozenset(
    {"yaml", "yml", "json", "toml", "ini", "conf", "cfg", "properties", "xml", "env", "tf"}
    | {"tfvars", "hcl", "sh", "py", "js", "ts", "go", "rb", "md"}
)


def _structured_file(name: str) -> bool:
    """Whether a file's name says it holds structured text (secrets.yaml, tokens.env)."""
    return name.rpartition("/")[2].rpartition(".")[2].lower() in _STRUCTURED_EXTENSIONS


def _file_stem(name: str) -> str:
    """A path's last part without its extension, as a name (secrets/db_password.txt:
    db_password); a plain name as it is."""
    return name.rpartition("/")[2].partition(".")[0] or name


def _line_holds(lower: str, position: int, words: tuple[str, ...]) -> bool:
    """Whether the line before ``position``, within reach, holds one of ``words``."""
    low = max(0, position - _LINE_REACH)
    start = lower.rfind("\n", low, position) + 1 or low
    return any(lower.find(word, start, position) >= 0 for word in words)


def _vault_secret_field(lower: str, match: re.Match[str]) -> bool:
    """Whether a vault command's -field printed a secret: any of a kv secret's, a secret-named
    one of the others' (vault read's password, vault token create's token); True for other
    commands."""
    field = match.groupdict().get("field")
    if field is None or secret_name(field):
        return True
    return _line_holds(lower, match.start(), ("vault kv",))


def find_printed_secrets(src: ScanText) -> Iterator[PiiHit]:
    """The line a secret-printing command printed under its echoed command line."""
    text, lower = src.text, src.lower
    for pattern, literal, words, gate in _PRINTING_COMMANDS:
        if not any(src.holds(word) for word in gate):
            continue  # C searches, shared with other recognizers
        for match in finditer_with(pattern, lower, literal):
            groups = match.groupdict()
            name = groups.get("name") or groups.get("quoted")
            if name is not None and not (secret_name(name) or secret_name(_file_stem(name))):
                continue  # terraform output -raw vpc_id, cat /etc/hostname
            if pattern is _CAT_FILE and name is not None and _structured_file(name):
                continue  # cat secrets.yaml: its first line is "apiVersion: v1"
            if words and not _line_holds(lower, match.start(), words):
                continue
            if not _vault_secret_field(lower, match):
                continue
            start, end = match.span("value")
            while end > start and text[end - 1] in " \t":
                end -= 1
            while start < end and text[start] in " \t":
                start += 1
            if (
                start < end
                and text[start:end] != _ERROR_BOX
                and not lower.startswith(_NOT_PRINTED, start)
            ):
                yield PiiHit("GENERIC_SECRET", start, end)
