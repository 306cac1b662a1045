"""Secrets found from their labels: passwords (in URLs, key=value pairs, YAML, command lines),
bearer and basic tokens, authorization headers, environment secrets (NAME=value, or a name and
a value) and AWS secret keys."""

from __future__ import annotations

import re
import string
from bisect import bisect_right
from collections.abc import Iterator

from bot.patterns import finditer_with, on_use
from bot.pii.checks import run_start, word_before
from bot.pii.credentials import looks_random
from bot.pii.encoded import (
    decode_base64,
    looks_secret,
    names_a_location,
    page_cursor_name,
    page_token_before,
)
from bot.pii.scantext import PiiHit, ScanText

# The slashes may come JSON-escaped (PHP's json_encode writes postgresql:\/\/app:...).
_URL_CREDENTIALS = on_use(
    r":(?:\\?/){2}(?P<user>[^\s:/@\"'<>]{0,256})(?::(?P<password>[^\s/\"'<>]{1,256}))?@"
)
_URL_TOKEN_USER = 20  # a user this long, letters and digits mixed, is a token (git's remotes)


def find_url_passwords(src: ScanText) -> Iterator[PiiHit]:
    """The password of scheme://user:password@host, and a token given as the user
    (https://TOKEN@github.com, https://TOKEN:x-oauth-basic@github.com)."""
    if "@" not in src.text:  # memchr: most outputs have no "@" at all
        return
    for match in _URL_CREDENTIALS.finditer(src.text):
        user = match.group("user")
        if len(user) >= _URL_TOKEN_USER and looks_secret(user):
            yield PiiHit("GENERIC_SECRET", *match.span("user"))
        if match.group("password") is not None:
            yield PiiHit("CONNECTION_STRING_PASSWORD", *match.span("password"))


# key=value (and Ruby's and Perl's key => value), and a quoted key with a quoted value
# ("password": "x", PHP's 'password' => 'x'): a colon after a bare word ("password:
# required") is prose as often as it is YAML, so that form must start its line (see
# _yaml_password). JSON inside a JSON string (a
# container's log line, an applied manifest) escapes its quotes, once or more: \"password\";
# and whatever the value escapes (Go's \\u0026 for &, PHP's \\/), which is part of it.
_PASSWORD_KEY = on_use(
    r"p(?:ass(?:word|wd)?|wd)"
    r"(?:[ \t]*+=>?[ \t]*+|\\*[\"'][ \t]*+(?::|=>)[ \t]*+(?=\\*[\"'])|(?P<yaml>[ \t]*+:[ \t]*+))"
)
_PASSWORD_VALUE = on_use(
    r"\\+\"(?P<edq>(?:[^\"\\\r\n]|\\++[^\"\\\r\n]){1,256}+)\\+\""
    r"|\"(?P<dq>(?:[^\"\\\r\n]|\\[^\r\n]){1,256}+)\"|'(?P<sq>[^'\r\n]{1,256})'"
    r"|\{(?P<br>[^}\r\n]{1,256})\}"
    r"|(?P<bare>[^\s;&,\"'<>]+)"
)

_NEXT_KEY = on_use(r"[A-Za-z_][A-Za-z0-9_]*=")
_BARE_MORE = on_use(r"[^\s;&,\"'<>]+")
# The key of the next pair, as connection strings spell keys ("User Id=", "Data Source=").
_NEXT_PAIR = on_use(r"[A-Za-z_][A-Za-z0-9_ .-]*=")


def _bare_end(text: str, end: int) -> int:
    """Where a bare value ends: at a ``;``, ``&`` or ``,`` that separates the next key
    (``&user=``, ``;Database=``) or ends the text or a word; one inside a value is part of it
    (``Tr0ub4dor&3``)."""
    while end + 1 < len(text) and text[end] in ";&," and not _NEXT_PAIR.match(text, end + 1):
        more = _BARE_MORE.match(text, end + 1)
        if more is None:
            break
        end = more.end()
    return end


def find_keyvalue_passwords(src: ScanText) -> Iterator[PiiHit]:
    """The value of password=, passwd=, pwd= or a name's _pass= in key=value connection
    strings, quoted keys and YAML."""
    text = src.text
    covered = 0  # the end of the last value: a key inside it is part of that secret
    lower = src.lower
    if not (src.holds("pass") or src.holds("pwd")):
        return
    for key in _PASSWORD_KEY.finditer(lower):
        if key.start() < covered:
            continue  # each key scanning to the end again would be quadratic in the text
        if not _password_key(text, key.start()):
            continue
        if key.group("yaml") is not None and _BLOCK_INDICATOR.match(text, key.end()):
            block = _block_scalar(text, key.start(), key.end())
            if block is not None:
                covered = block[1]  # a key in the block is its content: each would read on
                if not text.startswith(PLACEHOLDER_STARTS, block[0]) and not _prose(text, block[0]):
                    yield PiiHit("CONNECTION_STRING_PASSWORD", *block)
            continue
        value = _PASSWORD_VALUE.match(text, key.end())
        group = "bare" if value is None else value.lastgroup or "bare"
        start, end = (key.end(), key.end()) if value is None else value.span(group)
        if group == "bare":
            end = _bare_end(text, end)  # a value may start with a separator (&Tr0ub4dor3)
            end = _escape_trimmed(text, start, end)
        if end == start:
            continue
        covered = end
        secret = text[start:end]
        if set(secret) in ({"*"}, {"\\"}):
            continue  # already masked; or an empty value's escaped quote (\"password\": \"\")
        yaml = key.group("yaml") is not None
        if group == "bare" and not yaml and key.group()[-1] in " \t" and _NEXT_KEY.match(secret):
            continue  # "password= dbname=app": the password is empty, the next key follows
        if key.group().startswith("pwd") and secret[0] in "/~.":
            continue  # PWD=/home/... is the shell's working directory, not a password
        if group == "bare" and _named_elsewhere(lower, key.start(), secret):
            continue
        if group == "bare" and _code_expression(text, secret, end):
            continue  # source code: Password: cfg.DBPassword, password = models.CharField(
        if _SHOWN_WITHHELD.match(text, start):
            continue  # terraform plan's "(sensitive value)": nothing is shown
        if yaml:
            if not _yaml_password(text, key.start(), secret, end, bare=group == "bare"):
                continue
            if group == "bare":
                end = covered = _yaml_plain_end(text, end)
        elif group == "bare" and (separator := key.group().rstrip(" \t")).endswith("="):
            if secret[0] == "=":
                continue  # a comparison in source code: password == other.password
            if not any(char in secret for char in "([="):  # a call, an index: code
                spaced = separator[-2] in " \t"  # password = x
                end = covered = _pair_value_end(text, key.start(), end, spaced=spaced)
        yield PiiHit("CONNECTION_STRING_PASSWORD", start, end)


# An expression's operators: a value with one of them among its words is source code's
# (password = a + b), read no further.
_CODE_OPERATORS = frozenset({"+", "*", "/", "%", "==", "!=", "?", ":", "||", "&&", "??", "=>"})
# Its keywords, which a passphrase holds as words too ("salt and pepper - 42"): code's only
# beside a call or an index among the words (password = pw or prompt()), or as a conditional
# expression's pair (password = x if y else z).
_CODE_KEYWORDS_IN_VALUE = frozenset({"or", "and", "if", "else", "not", "in", "is", "-"})
_CONDITIONAL = frozenset({"if", "else"})
# The next word of a pair's value, up to a comment or a shell's operator.
_PAIR_WORD = on_use(r"[ \t]++(?P<word>[^\s#\"'\\|&;<>][^\s\"'\\]*+)")
_QUOTED_PAIR_REACH = 256


def _pair_value_end(text: str, key: int, end: int, *, spaced: bool) -> int:
    """Where a bare ``key=value``'s value whose first word ends at ``end`` ends, the password
    word at ``key``. A variable of docker inspect's Env is a JSON string of its own
    ("DB_PASSWORD=two words"): its value runs to the closing quote. A pair that starts its
    line in a listing of them (an INI file, my.cnf, .properties, .env, env's output), or
    whose "=" has blanks before it (INI's "password = x", which no shell writes), runs to the
    line's end, a comment or the next key=. Elsewhere the value is its first word: a
    shell's command goes on after it (PGPASSWORD=x psql), a log's message."""
    name = run_start(text, key, _KEY_NAME_CHARS, 64)
    name = key if name < 0 else name
    if name > 0 and text[name - 1] == '"':
        close = text.find('"', end, end + _QUOTED_PAIR_REACH)
        if close > end and text[close - 1] == "\\":
            close -= 1  # JSON inside a JSON string: \"DB_PASSWORD=two words\"
        if close < 0 or any(char in text[end:close] for char in "\\\r\n"):
            return end  # an escape: a log line's message ("password=x\nnext line")
        return close
    if not _starts_line(text, name) or text.startswith(",", end):
        return end  # inside a line, or an argument list's item (password=x,)
    if not (spaced or _in_listing(text, name)):
        return end
    first, stop = end, end
    keywords: set[str] = set()
    called = False
    while (word := _PAIR_WORD.match(text, stop)) is not None:
        value = word.group("word")
        if _NEXT_KEY.match(value):
            break  # password=x dbname=app: a connection string's next key
        if value in _CODE_OPERATORS:
            return first  # source code's expression: password = a + b
        if value in _CODE_KEYWORDS_IN_VALUE:
            keywords.add(value)
        called = called or "(" in value or "[" in value
        stop = word.end()
    if (keywords and called) or keywords >= _CONDITIONAL:
        return first  # source code's expression: password = x or prompt(), x if y else z
    return stop


# An INI file's or a listing's line: a key, perhaps blanks, and "=".
_LISTED_PAIR = on_use(r"[ \t]*+[A-Za-z_][A-Za-z0-9_.-]*+[ \t]*+=")


def _in_listing(text: str, name: int) -> bool:
    """Whether the pair whose key name starts its line at ``name`` is one of a listing: the
    line before or after it holds a pair too."""
    line = text.rfind("\n", 0, name) + 1
    after = text.find("\n", name)
    if after >= 0 and _LISTED_PAIR.match(text, after + 1):
        return True
    before = text.rfind("\n", 0, max(0, line - 1)) + 1
    return line > 0 and _LISTED_PAIR.match(text, before, line) is not None


# A shell variable in capitals ($DB_PASSWORD, ${DB_PASSWORD}): a password of the same shape
# ($ecretPass1) has small letters.
_SHELL_VARIABLE = on_use(r"\$(?:\{[A-Z_][A-Z0-9_]*\}|[A-Z_][A-Z0-9_]*)")
# Source code's right-hand side, cut where its quote starts: a call or a subscript of a name
# in small letters (getpass(), os.environ[, config.get(), or a constant.
_CODE_VALUE = on_use(r"[a-z_][a-z0-9_]*+(?:\.[a-z_][a-z0-9_]*+)*+(?:\(\)?|\[)")
_CODE_CONSTANTS = frozenset({"None", "True", "False", "nil", "null", "undefined"})
# Source code's keywords that start an expression (password = await get_secret()).
_CODE_KEYWORDS = frozenset({"await", "yield", "new", "lambda", "not", "typeof"})


def _named_elsewhere(lower: str, key: int, value: str) -> bool:
    """Whether a bare value names the password rather than gives it: a shell variable
    (helm --set auth.password=$DB_PASSWORD), source code's expression (password =
    getpass(), password = await vault.read()), or a usage text's --password=PASSWORD."""
    if value in _CODE_CONSTANTS or value.rstrip(":") in _CODE_KEYWORDS:
        return True
    if _SHELL_VARIABLE.fullmatch(value) or _CODE_VALUE.fullmatch(value):
        return True
    option = run_start(lower, key, _OPTION_CHARS, 64)
    return option >= 0 and lower.startswith("--", option) and _metavar(value)


def _password_key(text: str, key: int) -> bool:
    """Whether the key word at ``key`` names a password: password, passwd and pwd do; "pass"
    as the last word of a name (ansible_become_pass, db-pass, smtpPass) or a quoted key of its
    own ("pass": "x"), not in "bypass=" or "pass=12 fail=0"."""
    if text[key + 1] not in "aA" or text[key + 4] in "wW":
        return True
    if key == 0:
        return False
    before = text[key - 1]
    if before in "_-" or (text[key] == "P" and before.islower()):
        return True
    return before in "\"'" and text[key + 4] == before


_KEY_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-.")
# What YAML writes for no value, a reference or a value on the lines below.
_YAML_NOT_VALUES = ("~", "|", ">", "&", "*", "!")
# A flag's value in a schema or a chart's values (show_password: false), not a password.
_YAML_BOOLEANS = frozenset({"null", "true", "false", "yes", "no", "on", "off"})
# kubectl describe secret gives a value's size alone ("password:  8 bytes").
_SIZE_ONLY = on_use(r"[ \t]+bytes?[ \t]*(?:\r?\n|\Z)")
# A plain scalar runs to its line's end, over its blanks, up to a comment (" #"); a quote or
# a backslash (a JSON string's escaped line end, read as "\ ") ends it too.
_YAML_MORE = on_use(r"(?:[ \t]++[^\s#\"'\\][^\s\"'\\]*+)*+")
# A field's type in source code or a schema (Python's "password: str", TypeScript's
# "password: string;", an API doc's "password: string"), not its value.
_TYPE_NAMES = frozenset(
    {"str", "string", "bytes", "secretstr", "secretbytes", "text", "any", "int", "number"}
)
_TYPE_OPENERS = ("optional[", "annotated[", "union[", "str|", "string|")
# Words in brackets shown in a password's place, nothing of it: terraform plan's "(sensitive
# value)" and "(known after apply)", a tool's "(hidden)" or "(not set)", Kafka's "[hidden]",
# a log's "[REDACTED]".
_SHOWN_WITHHELD = on_use(r"\([a-z ]{1,32}\)|\[[A-Za-z ]{1,32}\]")


# A block scalar's header (password: |, >-, |2+), perhaps a comment, and its line's end.
_BLOCK_INDICATOR = on_use(r"[|>](?:[+-]?[1-9]?|[1-9][+-])[ \t]*+(?:#[^\r\n]*+)?\r?\n")


def _block_scalar(text: str, key: int, header: int) -> tuple[int, int] | None:
    """Where the content of the block scalar whose header is at ``header`` starts and ends: the
    lines after it indented deeper than its key (the password word at ``key``), which must
    start its line. None if the key does not, or the block is empty."""
    name = run_start(text, key, _KEY_NAME_CHARS, 64)
    name = key if name < 0 else name
    line = name
    while line > 0 and text[line - 1] in " \t-":
        line -= 1
    if line > 0 and text[line - 1] not in "\r\n":
        return None  # inside a line: prose ("error: password: |")
    column = name - line
    position = text.index("\n", header) + 1
    first = last = -1
    while position < len(text):
        line_end = text.find("\n", position)
        line_end = len(text) if line_end < 0 else line_end
        body = position
        while body < line_end and text[body] == " ":
            body += 1
        content_end = line_end
        while content_end > body and text[content_end - 1] in " \t\r":
            content_end -= 1
        if content_end > body:
            if body - position <= column:
                break  # the next key of the mapping, or less indented
            first = body if first < 0 else first
            last = content_end
        position = line_end + 1
    return None if first < 0 else (first, last)


# Source code's value for a field named password (Go's and JavaScript's objects, schemas): a
# name or a chain of names (cfg.DBPassword, process.env.DB_PASSWORD), perhaps called or
# subscripted (os.Getenv(, z.string().min(8), Mapped[str]).
_CODE_EXPRESSION = on_use(
    r"(?P<chain>[A-Za-z_][A-Za-z0-9_]*+(?:\.[A-Za-z_][A-Za-z0-9_]*+)*+)"
    r"(?:(?P<call>\()|\[(?P<type>[A-Za-z_][A-Za-z0-9_.]*+)[],])?"
)
_CODE_TRAILER = on_use(r",[ \t]*+(?:\r?\n|\Z)")
_PASSWORD_NAME = on_use(r"pass|pwd")


def _code_expression(text: str, value: str, end: int) -> bool:
    """Whether a plain value (its first word ``value``, ending at ``end``) is source code's
    expression rather than a password: a call of a chain or of a name in small letters
    (os.Getenv(, constr(), a generic type (Mapped[str]), a chain that names a password or
    ends an object's line with a comma (this.password, cfg.Secret,), or a name that does both
    (hashedPassword,). A word alone stays a password, whatever it says (Passw0rd)."""
    code = _CODE_EXPRESSION.match(value)
    if code is None:
        return False
    chain = code.group("chain")
    if code.group("call"):
        return "." in chain or chain.islower()
    if code.group("type"):
        return True
    if code.end() != len(value):
        return False
    dotted = "." in chain
    names_password = _PASSWORD_NAME.search(chain.rpartition(".")[2].lower()) is not None
    trailer = _CODE_TRAILER.match(text, end) is not None
    return (dotted and (names_password or trailer)) or (names_password and trailer)


def _yaml_plain_end(text: str, end: int) -> int:
    """Where a plain scalar whose first word ends at ``end`` ends ("correct horse battery")."""
    more = _YAML_MORE.match(text, end)
    return end if more is None else more.end()


def _yaml_password(text: str, key: int, value: str, end: int, *, bare: bool) -> bool:
    """Whether ``key: value`` (the password word at ``key``, the value ending at ``end``) is
    a YAML password.

    The key must start its line: inside a line a colon is prose ("error: password: x"). There,
    nested or not, named or not, a plain value is a password unless its first word is one
    that prose or a status puts there ("Password: incorrect", "password: is too short",
    nsswitch's "passwd: files"): a leak costs more than a word hidden from the model.
    """
    lower = value.lower()
    if value.startswith(PLACEHOLDER_STARTS + _YAML_NOT_VALUES) or lower in _YAML_BOOLEANS:
        return False
    if value.isdigit() and _SIZE_ONLY.match(text, end):
        return False
    if lower.rstrip(";,!?") in _TYPE_NAMES or lower.startswith(_TYPE_OPENERS):
        return False
    name = run_start(text, key, _KEY_NAME_CHARS, 64)
    name = key if name < 0 else name
    line = name
    while line > 0 and text[line - 1] in " \t-":
        line -= 1
    if not (_line_start(text, line) or _JSON_STRING_START.search(text, max(0, line - 8), line)):
        return bare and generated_alone(text, value, end)
    return not (bare and _prose(text, end - len(value)))


_GENERATED_SHORTEST = 8
# A line end; a terminal's CR may end the text (kubectl exec -t's output, its last newline cut).
_LINE_END = on_use(r"[ \t\r]*+(?:\n|\\ |\Z)")


def generated_alone(text: str, value: str, end: int) -> bool:
    """Whether a password value inside a line, where a colon is mostly prose, is an
    installer's generated one ("Generated root password: Xk9#mP2$vL7"): the line's last word,
    mixing three of capitals, small letters, digits and symbols. A status ("RESET_REQUIRED")
    or a word and a number ("hunter22") mixes fewer."""
    if len(value) < _GENERATED_SHORTEST or not _LINE_END.match(text, end):
        return False
    kinds = (
        any(char.isupper() for char in value),
        any(char.islower() for char in value),
        any(char.isdigit() for char in value),
        any(not char.isalnum() for char in value),
    )
    return sum(kinds) >= 3


# A JSON string's start is a line's (a container's log line: {"log":"password: x\n"}).
_JSON_STRING_START = on_use(r"[:\[,][ \t]*+\"\Z")


_WORD_MARKS = "[]()<>.,;:!?"
# The rest of a value's line: up to a line end, real or a JSON string's escaped one.
_VALUE_LINE = on_use(r"[^\r\n\\]*+")


def _prose(text: str, start: int) -> bool:
    """Whether the plain value at ``start``, to its line's end or comment, is prose: a prose
    or status word at either end ("Login incorrect", "must be 12 characters"), prose words a
    third of its words or more ("size must be between 8 and 64"), or a colon and a blank,
    which YAML's plain scalars never hold ("su: Authentication failure"). A prose word inside
    a passphrase does not make it prose ("open sesame and more")."""
    line = _VALUE_LINE.match(text, start)
    end = start if line is None else line.end()
    comment = text.find(" #", start, end)
    value = text[start : end if comment < 0 else comment].lower()
    if ": " in value:
        return True
    prose = [word.strip(_WORD_MARKS) in _PROSE_VALUES for word in value.split()]
    return bool(prose) and (prose[0] or prose[-1] or 3 * sum(prose) >= len(prose))


# The words of a value after "password:" that say something about the password rather than
# give it: an error's or a form's status, prose, nsswitch.conf's sources.
_PROSE_SPELLED = (
    {"required", "incorrect", "invalid", "wrong", "missing", "expired", "empty", "unset"}
    | {"changed", "reset", "updated", "accepted", "rejected", "denied", "ok"}
    | {"hidden", "redacted", "masked", "optional", "disabled", "enabled", "provided", "none"}
    | {"protected", "unknown", "saved", "sent", "needed", "too", "please", "enter", "mismatch"}
    | {"verified", "failed", "error", "weak", "strong", "valid", "blank", "set", "match"}
    | {"n/a", "unchanged", "generated", "never", "expires", "locked", "unlocked", "succeeded"}
    | {"successful", "failure", "sorry", "try", "again", "see", "below", "above", "same", "as"}
    | {"from", "have", "at", "least", "between", "than"}
    # The same in German, French, Italian, Spanish and Portuguese interfaces.
    | {"falsch", "ungültig", "erforderlich", "abgelaufen", "geändert", "fehlt", "leer"}
    | {"incorrect", "incorrecte", "invalide", "requis", "obligatoire", "expiré", "modifié"}
    | {"errata", "sbagliata", "non", "valida", "richiesta", "obbligatoria", "scaduta"}
    | {"incorrecta", "incorrecto", "inválida", "requerida", "obligatoria", "caducada"}
    | {"incorreta", "obrigatória", "expirada", "alterada", "vazia"}
    | {"files", "systemd", "sss", "ldap", "nis", "compat", "winbind"}
    | {"is", "or", "and", "to", "of", "in", "if", "for", "with", "the", "a", "an", "was", "are"}
    | {"must", "can", "cannot", "should", "will", "may", "not", "has", "does", "did", "be"}
)
# Spelled as the scan reads them: a letter outside ASCII is one "?" (ungültig: ung?ltig), as
# ``fold`` reads these; not by ``fold`` itself, whose table would be built at every start.
_PROSE_VALUES = frozenset(word.encode("ascii", "replace").decode() for word in _PROSE_SPELLED)


# curl's -u/--user and -U/--proxy-user USER:PASSWORD on a command line. The flag is a word
# of its own; the value may be quoted or glued to the short flag (-uuser:pass).
_USER_FLAG = on_use(
    r"(?:--(?:proxy-)?user[ \t]+|-[uU][ \t]*)"
    r"(?:\"(?P<dq>[^\"\r\n]{1,256})\"|'(?P<sq>[^'\r\n]{1,256})'|(?P<bare>[^\s\"'`;|&)]{1,256}))"
)
_FLAG_OPENERS = frozenset(" \t\r\n\"'`=(")
PLACEHOLDER_STARTS = ("$", "<", "{{", "%")


_DASH_U = on_use(r"-u")


def _user_flags(text: str, lower: str) -> Iterator[re.Match[str]]:
    """The -u, -U, --user and --proxy-user flags with their values, found from "-u".

    A regex that starts with a lookbehind gets no literal prefix to skip to; the two-character
    literal on the lower-case text, shared with other recognizers, is found in one C pass.
    """
    for dash in finditer_with(_DASH_U, lower, "-u"):
        start = position = dash.start()
        if text.startswith("--user", position - 1):
            start = position - 1
        elif text.startswith("--proxy-user", position - 7):
            start = position - 7
        if start == 0 or text[start - 1] in _FLAG_OPENERS:
            found = _USER_FLAG.match(text, start)
            if found is not None:
                yield found


def find_user_flag_passwords(src: ScanText) -> Iterator[PiiHit]:
    """The password of -u USER:PASSWORD, --user USER:PASSWORD (curl) and the proxy forms.

    uid:gid (docker run -u 1000:1000) and user:group (-u app:app) are not credentials, and
    $PASS, <password> or an already masked *** give nothing away.
    """
    text = src.text
    for match in _user_flags(text, src.lower):
        group = match.lastgroup or "bare"
        start, end = match.span(group)
        user, colon, password = text[start:end].partition(":")
        if not colon or not password or password == user or set(password) == {"*"}:
            continue
        if password.startswith(PLACEHOLDER_STARTS) or (user.isdigit() and password.isdigit()):
            continue
        yield PiiHit("BASIC_AUTH", start + len(user) + 1, end)


# A password on a command line: glued to -p for the MySQL and MariaDB clients (a -p alone asks
# for one; -P is the port), or after sshpass -p.
# The password may be quoted after the flag (-p'S3cr3t!', sshpass -p "two words").
_P_VALUE = r"(?:\"(?P<dq>[^\"\r\n]{1,256})\"|'(?P<sq>[^'\r\n]{1,256})'|(?P<bare>[^\s'\"]{1,256}))"
_GLUED_P = on_use(rf"(?<=[ \t'\"])-p{_P_VALUE}")
_SSHPASS_P = on_use(rf"sshpass[ \t]+-p[ \t]*{_P_VALUE}")
_MYSQL_CLIENT = on_use(r"(?<![A-Za-z0-9_])(?:mysql[a-z]*|mariadb[a-z-]*)(?![A-Za-z0-9_])")
_COMMAND_REACH = 512  # how far back on its line a -p looks for the client: linear in the text


# Options whose value names a container, host, namespace or user, which may be "mysql".
_NAMING_OPTIONS = frozenset(
    {"--name", "--hostname", "--namespace", "--network", "--container", "--link", "--user"}
    | {"-n", "-c", "-u", "-h"}
)


def _option_value(text: str, start: int) -> bool:
    """Whether the word at ``start`` is a naming option's value (docker run --name mysql,
    kubectl -n mysql, --name=mysql): a container or namespace named for the client, whose -p
    is another's. A flag that takes no value (sudo -E mysql, exec -it … -- mysql) is not one."""
    if start > 0 and text[start - 1] == "=":
        return True
    end = start
    while end > 0 and text[end - 1] in " \t":
        end -= 1
    if end == start:
        return False
    word = end
    while word > 0 and not text[word - 1].isspace():
        word -= 1
    return text[word:end] in _NAMING_OPTIONS


# Text that stays in one command: no line end, and no ;, | or & outside quotes (a quote still
# open at the -p runs to it). One C pass where a loop over characters would cost 512 per -p.
_ONE_COMMAND = on_use(r"(?:[^'\"\r\n;|&]++|'[^'\r\n]*+(?:'|\Z)|\"[^\"\r\n]*+(?:\"|\Z))*+")


def _one_command(between: str) -> bool:
    """Whether a client and a -p with ``between`` them are one command: ``mysql -e 'select 1;'
    -pX`` is one; ``mysql -p; ss -plnt`` is two."""
    return _ONE_COMMAND.fullmatch(between) is not None


# A registry login's -p (docker, podman, nerdctl login), MongoDB's tools' -p and redis-cli's -a
# take the password as the next word; redis-cli's -p is its port, docker run's a port mapping.
_LOGIN_CLIENT = on_use(
    r"(?<![a-z0-9_-])(?:(?:docker|podman|nerdctl|az|oc|cf)[ \t]+login"
    r"|mongo(?:sh|dump|restore|export|import|stat|top)?|cqlsh)(?![a-z0-9_-])"
)
_LOGIN_P = on_use(rf"(?<=[ \t])-p[ \t]+{_P_VALUE}")
_REDIS_CLIENT = on_use(r"(?<![a-z0-9_-])redis-cli(?![a-z0-9_-])")
_REDIS_A = on_use(rf"(?<=[ \t])-a[ \t]+{_P_VALUE}")
# SQL Server's sqlcmd and bcp and ipmitool take it after -P; OpenLDAP's clients after -w
# (-W asks for it); Samba's after the user's "%" (-U alice%pw); FreeRDP after /p:.
_UPPER_P_CLIENT = on_use(r"(?<![a-z0-9_-])(?:sqlcmd|bcp|ipmitool)(?![a-z0-9_-])")
_UPPER_P = on_use(rf"(?<=[ \t])-P[ \t]+{_P_VALUE}")
_LDAP_CLIENT = on_use(r"(?<![a-z0-9_-])ldap[a-z]{3,8}+(?![a-z0-9_-])")
_LDAP_W = on_use(rf"(?<=[ \t])-w[ \t]*+{_P_VALUE}")  # getopt's: glued too (-wPASSWORD)
_SAMBA_CLIENT = on_use(r"(?<![a-z0-9_-])(?:smbclient|rpcclient|smbcacls|smbget)(?![a-z0-9_-])")
_SAMBA_USER = on_use(
    r"(?<=[ \t])(?:-U[ \t]*+|--user[= \t][ \t]*+)"
    r"(?:\"[^\"%\r\n]{1,256}+%(?P<dq>[^\"\r\n]{1,256}+)\"|'[^'%\r\n]{1,256}+%(?P<sq>[^'\r\n]{1,256}+)'"
    r"|[^\s%\"']{1,256}+%(?P<bare>[^\s\"']{1,256}+))"
)
_FREERDP_CLIENT = on_use(r"(?<![a-z0-9_-])[a-z]*freerdp[0-9]?(?![a-z0-9_-])")
_FREERDP_P = on_use(rf"(?<=[ \t])/p:{_P_VALUE}")
# The flags, with their blank (Samba's -U and OpenLDAP's -w perhaps glued to their value,
# Samba's --user read as "--"), in one pass in C before the clients' names are looked for: a
# text without them compiles and searches nothing more.
_CLIENT_FLAG = on_use(r"-(?:[paP][ \t]|[wU]|-user[= \t])")
# Each flag's clients: the flag as the pass finds it, a literal the client's name holds, the
# client's pattern and the flag's with its value.
_FLAG_CLIENTS: tuple[tuple[str, str, re.Pattern[str], re.Pattern[str]], ...] = (
    ("-a", "redis-cli", _REDIS_CLIENT, _REDIS_A),
    ("-P", "sqlcmd", _UPPER_P_CLIENT, _UPPER_P),
    ("-P", "bcp", _UPPER_P_CLIENT, _UPPER_P),
    ("-P", "ipmitool", _UPPER_P_CLIENT, _UPPER_P),
    ("-w", "ldap", _LDAP_CLIENT, _LDAP_W),
    ("-U", "smb", _SAMBA_CLIENT, _SAMBA_USER),
    ("-U", "rpcclient", _SAMBA_CLIENT, _SAMBA_USER),
    ("--", "smb", _SAMBA_CLIENT, _SAMBA_USER),
    ("--", "rpcclient", _SAMBA_CLIENT, _SAMBA_USER),
)


def _client_flags(
    text: str, lower: str, client: re.Pattern[str], flag: re.Pattern[str]
) -> Iterator[re.Match[str]]:
    """The matches of ``flag`` that stand in a command of the ``client`` named before them."""
    clients = [c.end() for c in client.finditer(lower) if not _option_value(text, c.start())]
    if not clients:
        return
    for match in flag.finditer(text):
        # The nearest client named before the flag, in its command and within reach.
        before = bisect_right(clients, match.start()) - 1
        if before < 0 or match.start() - clients[before] > _COMMAND_REACH:
            continue
        if _one_command(text[clients[before] : match.start()]):
            yield match


def find_cli_passwords(src: ScanText) -> Iterator[PiiHit]:
    """The password of mysql -pPASSWORD (and its kin), sshpass -p PASSWORD, docker, podman,
    az, oc and cf login -p PASSWORD, mongosh (and MongoDB's other tools) and cqlsh -p
    PASSWORD, redis-cli -a PASSWORD, sqlcmd, bcp and ipmitool -P PASSWORD, OpenLDAP's -w
    PASSWORD, Samba's -U (or --user) USER%PASSWORD and FreeRDP's /p:PASSWORD."""
    text, lower = src.text, src.lower
    found = list(finditer_with(_SSHPASS_P, text, "sshpass"))
    if "mysql" in lower or "mariadb" in lower:
        found += _client_flags(text, lower, _MYSQL_CLIENT, _GLUED_P)
    flags = {flag.group()[:2] for flag in _CLIENT_FLAG.finditer(text)} if "-" in text else set()
    if "-p" in flags and (" login" in lower or "mongo" in lower or "cqlsh" in lower):
        found += _client_flags(text, lower, _LOGIN_CLIENT, _LOGIN_P)
    searched: set[re.Pattern[str]] = set()  # sqlcmd, bcp and ipmitool share theirs
    for flag, literal, client, pattern in _FLAG_CLIENTS:
        if flag in flags and client not in searched and literal in lower:
            searched.add(client)
            found += _client_flags(text, lower, client, pattern)
    if "/p:" in text and "freerdp" in lower:
        found += _client_flags(text, lower, _FREERDP_CLIENT, _FREERDP_P)
    for match in found:
        group = match.lastgroup or "bare"
        # "-p --authenticationDatabase admin": a -p with no value asks for the password.
        if not match.group(group).startswith((*PLACEHOLDER_STARTS, "-")):
            yield PiiHit("CONNECTION_STRING_PASSWORD", *match.span(group))


# A password after a word: a long option (--password x, --db-password x, redis-cli's --pass x,
# redis-server's --requirepass x), redis.conf's requirepass line, SQL (IDENTIFIED BY 'x',
# PASSWORD 'x': quoted, as SQL writes a string) and .netrc (machine h login bob password x, on
# one line or consecutive ones). Found from the word's literal, which the regex engine skips
# to, and read backwards from there.
# The word's blanks, or the next item of a list: an option and its value as an argv, in JSON
# (docker inspect's "Args": ["--password", "x"]) or YAML (a pod's args: - --password, - x).
_PASSWORD_WORD = on_use(
    r"pass(?:word|wd|(?<=requirepass)|(?<=--pass))"
    r"(?:[ \t]+|(?P<item>[\"'][ \t]*,[ \t]*(?=[\"'])|\r?\n[ \t]*-[ \t]+))"
)
# OpenSSL's -pass, -passin and -passout with a pass: argument (env:, file: and stdin name
# where the password is), and keytool's and jarsigner's -storepass, -keypass and their
# -src and -dest forms (-storepass:env names a variable), each before its value.
_SINGLE_DASH_PASS = on_use(
    r"(?<![a-z0-9_-])-(?:pass(?:in|out)?[ \t]+(?:pass:|(?=[\"']pass:))"
    r"|(?:src|dest)?(?:store|key)pass[ \t]+)"
)
_IDENTIFIED_BY = on_use(r"identified[ \t]+(?:with[ \t]+[a-z0-9_]+[ \t]+)?by[ \t]+(?=['\"])")
# Before a .netrc's password, reversed: its machine (or the default entry) and perhaps its
# login and account, each token separated by blanks or one line end ("machine h\n  login u\n
# password"). Not blank lines: they would join prose below to a paragraph naming a machine.
_NETRC_GAP = r"(?:[ \t]++|[ \t]*+\n\r?[ \t]*+)"
_NETRC_BEFORE = on_use(
    rf"{_NETRC_GAP}(?:[^\s]++{_NETRC_GAP}(?:nigol|tnuocca){_NETRC_GAP}){{0,2}}"
    rf"(?:[^\s]++{_NETRC_GAP}enihcam|tluafed)(?![a-z0-9_])"
)
_NETRC_REACH = 300
_OPTION_CHARS = frozenset(string.ascii_lowercase + string.digits + "-")
_WORDED_VALUE = on_use(_P_VALUE)


# Before an option that starts a line of a --help text or a man page, reversed: perhaps a short
# form ("-p, "), the indent, and a line end not after a backslash (a command continued).
_HELP_INDENT_REVERSED = on_use(r"(?:[ \t]*+,[a-z0-9]-)?[ \t]++\n\r?+(?![ \t]*+\\)")
_HELP_REACH = 40


def _help_line(lower: str, option: int) -> bool:
    """Whether the option at ``option`` starts a line of a --help text, where the word after
    it names what it takes (string, PASSWORD) or describes it."""
    low = max(0, option - _HELP_REACH)
    before = lower[low:option][::-1] + ("\n" if low == 0 else "")
    return _HELP_INDENT_REVERSED.match(before) is not None


def _worded_password(lower: str, word: re.Match[str], netrc: bool) -> bool:
    """Whether the password word ``word`` (with its blanks) is followed by a password."""
    start, after = word.start(), lower[word.end() : word.end() + 1]
    option = run_start(lower, start, _OPTION_CHARS, 64)
    if option == start - 1 and lower[option] == "-" and (option == 0 or lower[option - 1] in " \t"):
        # A single-dash long option (influx -password x), not in Go's usage text ("  -password
        # string\n    \tPassword to ...").
        return after not in ("", "-") and not _help_line(lower, option)
    if option >= 0 and lower.startswith("--", option):
        if lower.startswith("--no-", option) or _help_line(lower, option):
            return False  # pg_dump's --no-password; "  -p, --password string   Password..."
        return after not in ("", "-")  # "--password -" reads it from the standard input
    if word.group("item") is not None:
        return False  # a list's item that is no option: ["password", "x"] names two things
    if lower.endswith("require", 0, start):
        return _starts_line(lower, start - len("require"))  # redis.conf's requirepass line
    if option >= 0 or word_before(lower, start):
        return False  # part of a longer word: "bypass", "-password"
    if after == "'" and word.group().startswith("password"):
        return True  # SQL's PASSWORD 'x'
    if not netrc:
        return False
    before = lower[max(0, start - _NETRC_REACH) : start][::-1]
    return _NETRC_BEFORE.match(before) is not None  # machine HOST [login USER] password


def find_worded_passwords(src: ScanText) -> Iterator[PiiHit]:
    """The password after --password, SQL's IDENTIFIED BY or PASSWORD, or .netrc's password."""
    text, lower = src.text, src.lower
    passwords = src.holds("pass")
    # C searches for the netrc words only where a password could be.
    netrc = passwords and ("machine" in lower or "default" in lower)
    words = _PASSWORD_WORD.finditer(lower) if passwords else ()
    keys = [w.end() for w in words if _worded_password(lower, w, netrc)]
    keys += [by.end() for by in finditer_with(_IDENTIFIED_BY, lower, "identified")]
    if passwords:  # the pattern starts at every "-": these literals first, one in each match
        dashes = finditer_with(_SINGLE_DASH_PASS, lower, "-pass", "storepass", "keypass")
        keys += [dash.end() for dash in dashes]
    for end in keys:
        value = _WORDED_VALUE.match(text, end)
        if value is None:
            continue
        group = value.lastgroup or "bare"
        secret = value.group(group)
        start, stop = value.span(group)
        if secret.startswith("pass:"):
            start, secret = start + len("pass:"), secret[len("pass:") :]  # 'pass:two words'
        if secret.startswith((*PLACEHOLDER_STARTS, "-")) or _metavar(secret):
            continue  # "-" reads it from the standard input; "--port" is the next option
        if group == "bare" and secret in _PROSE_WORDS:
            continue  # an error's "--password is required", "pass --password or set X"
        if secret:
            yield PiiHit("CONNECTION_STRING_PASSWORD", start, stop)


# Words that follow an option named in prose; no password is one of them.
_PROSE_WORDS = frozenset(
    {"is", "or", "and", "to", "of", "in", "if", "for", "with", "the", "a", "an", "was", "are"}
    | {"must", "can", "cannot", "should", "will", "may", "not", "has", "option", "flag"}
)


def _metavar(value: str) -> bool:
    """Whether a value is a usage text's name for one: PASSWORD, [PASSWORD], DB_PASS."""
    name = value.strip("[]")
    return name.replace("_", "").isalpha() and name.isupper()


# One pass for both schemes: "b" is rarer in logs than two separate six-letter scans cost.
_AUTH_SCHEME = on_use(r"b(?:earer|asic)[ \t]+")
_BEARER_TOKEN = on_use(r"[A-Za-z0-9._~+/-]{12,}+=*")
_BASIC_TOKEN = on_use(r"[A-Za-z0-9+/]{4,}+=*(?![A-Za-z0-9_.~-])")


def find_bearer_and_basic(src: ScanText) -> Iterator[PiiHit]:
    """The token after "Bearer", and the credentials after "Basic" (as in Authorization)."""
    text, lower = src.text, src.lower
    if "bearer" not in lower and "basic" not in lower:  # str's search skips most of the text
        return
    for label in _AUTH_SCHEME.finditer(lower):
        if word_before(lower, label.start()):
            continue
        if lower[label.start() + 1] == "e":
            token = _BEARER_TOKEN.match(text, label.end())
            # "Bearer authentication" is prose; tokens carry digits or capitals.
            if token and any(char.isdigit() or char.isupper() for char in token.group()):
                yield PiiHit("BEARER_TOKEN", token.start(), token.end())
            continue
        token = _BASIC_TOKEN.match(text, label.end())
        if token is None:
            continue
        decoded = decode_base64(token.group(), shortest=3)
        # "Basic authentication" is prose; credentials decode to user:password.
        if (decoded is not None and ":" in decoded) or (
            len(token.group()) >= 12 and looks_random(token.group())
        ):
            yield PiiHit("BASIC_AUTH", token.start(), token.end())


_AUTHORIZATION = on_use(r"authorization(?:\\*[\"'])?[ \t]*[:=][ \t]*(?:\\*[\"'])?")
_AUTH_VALUE = on_use(r"[^\s\"'\\]++(?:[ \t]++[^\s\"'\\]++)*+")
# Schemes whose credentials follow them; Bearer and Basic have recognizers of their own.
_AUTH_SCHEMES = frozenset(
    {"token", "digest", "apikey", "api-key", "key", "sso-key", "ssws", "splunk", "negotiate"}
    | {"ntlm", "hoba", "mutual", "aws4-hmac-sha256", "vapid", "dpop", "gosso", "otp"}
)


_LONGEST_SCHEME = max(map(len, _AUTH_SCHEMES))  # str.lower() never shortens a string


class _AuthValue:
    """An Authorization value's run of text, read once for every label that starts in it: a
    label inside a value ("authorization:" repeated on one line) ends where that value ends,
    and reading the value again from each one took time quadratic in the line."""

    def __init__(self, text: str, start: int, end: int) -> None:
        self.text, self.start, self.end = text, start, end
        self._space = start - 1  # the first space at or after the last label asked about
        self._rest = (-1, -1)  # a space, and where the blanks after it end
        self._tail: tuple[int, int, int] | None = None

    def hit(self, start: int) -> PiiHit | None:
        """The credentials of the value as read from ``start`` (a label's end inside it)."""
        text, end = self.text, self.end
        if self._space < start:
            found = text.find(" ", start, end)
            self._space = end if found < 0 else found
        space = self._space
        if space < end:  # a scheme, then its credentials
            if space - start > _LONGEST_SCHEME or text[start:space].lower() not in _AUTH_SCHEMES:
                return None
            if self._rest[0] != space:
                rest = space + 1
                while text[rest] in " \t":  # the value ends in neither
                    rest += 1
                self._rest = (space, rest)
            return PiiHit("GENERIC_SECRET", self._rest[1], end)
        if end - start >= 12 and self._looks_secret_from(start):
            return PiiHit("GENERIC_SECRET", start, end)
        return None

    def _looks_secret_from(self, start: int) -> bool:
        """``looks_secret(text[start:end])``, from where the tail's last digit and letter stand
        and where its fifth distinct character from the end does, read once."""
        if self._tail is None:
            digit = letter = fifth = -1
            seen: set[str] = set()
            for index in range(self.end - 1, self.start - 1, -1):
                char = self.text[index]
                if digit < 0 and char.isdigit():
                    digit = index
                if letter < 0 and char.isalpha():
                    letter = index
                if fifth < 0:
                    seen.add(char)
                    fifth = index if len(seen) > 4 else -1
                if digit >= 0 and letter >= 0 and fifth >= 0:
                    break
            self._tail = (digit, letter, fifth)
        return min(self._tail) >= start


def find_authorization(src: ScanText) -> Iterator[PiiHit]:
    """The credentials of an Authorization header in a scheme other than Bearer or Basic."""
    text = src.text
    if "authorization" not in src.lower:  # a long literal: str's search skips most of the text
        return
    value: _AuthValue | None = None
    for label in _AUTHORIZATION.finditer(src.lower):
        start = label.end()
        if value is None or not value.start <= start < value.end:
            found = _AUTH_VALUE.match(text, start)
            if found is None:
                continue
            value = _AuthValue(text, found.start(), found.end())
        # A label inside the last value starts at a character of it (the label's blanks
        # taken, and a value holds no quote): read from there, it ends where that value does.
        hit = value.hit(start)
        if hit is not None:
            yield hit


# An environment variable named for a secret, as .env files, ``env`` and ``docker inspect``
# print it: whatever it holds is the secret, random-looking or not (a passphrase, a UUID). Found
# from the end of the name, in capitals; a colon form only at a line's start (YAML, describe),
# where "INVALID_TOKEN: the session expired" in a log line is not one. Possessive blanks: the
# colon's and the value's would share a long run of them, quadratically.
_ENV_NAME_END = on_use(
    r"(?P<word>SECRET|TOKEN|PASSPHRASE|CREDENTIALS?|KEY|PW)"
    r"(?P<colon>:[ \t]++|[ \t]*+=|(?P<blank>[ \t]++))[ \t]*+"
    r"(?:\"(?P<dq>[^\"\r\n]{6,256})\"|'(?P<sq>[^'\r\n]{6,256})'|(?P<bare>[^\s\x00-\x1f\"',;]{6,256}))"
)
_ENV_NAME_CHARS = frozenset(string.ascii_uppercase + string.digits + "_")
_ENV_NAME_WORDS = ("SECRET", "TOKEN", "PASSPHRASE", "CREDENTIAL", "KEY", "PW")
# KEY alone ends too many names that hold none (PRIMARY_KEY, SORT_KEY): these do.
_ENV_SECRET_KEYS = (
    *("API_KEY", "APIKEY", "ACCESS_KEY", "PRIVATE_KEY", "SECRET_KEY", "SIGNING_KEY"),
    *("MASTER_KEY", "ENCRYPTION_KEY", "LICENSE_KEY", "AUTH_KEY", "APP_KEY", "APPLICATION_KEY"),
    "FERNET_KEY",  # Airflow's, which encrypts its connections' passwords
)
# PASS ends a password's name as a word of its own (DB_PASS); inside one it is "BYPASS".
_ENV_SECRET_PASS = "_PASS"


# A file's path, in lower-case names of two parts or more: a generated secret with a slash in
# it is base64, which mixes cases.
SECRET_PATH = on_use(r"(?:~|\.{1,2})?(?:/[a-z0-9._-]++){2,}+/?")


def _env_name_start(text: str, end: int) -> int:
    """Where the capitals-and-underscores name ending at ``end`` starts; -1 if it is part of a
    longer word or does not start with a letter."""
    start = run_start(text, end, _ENV_NAME_CHARS, 128)
    if start < 0 or word_before(text, start) or not text[start].isalpha():
        return -1
    return start


def _starts_line(text: str, index: int) -> bool:
    """Whether only blanks stand between the line's start and ``index``."""
    while index > 0 and text[index - 1] in " \t":
        index -= 1
    return _line_start(text, index)


def _line_start(text: str, index: int) -> bool:
    """Whether a line starts at ``index``: after a line end, or after a JSON string's escaped
    one (a config map's YAML in kubectl -o json), which ScanText reads as "\\ "."""
    if index == 0 or text[index - 1] in "\r\n":
        return True
    return text[index - 1] == "\\" and text[index] == " "


def _escape_trimmed(text: str, start: int, end: int) -> int:
    """The end of a bare value without the backslash of a JSON escape after it: redacting
    "hunter22\\" of "password=hunter22\\n" would leave the model "nnext line"."""
    if end - start > 1 and text[end - 1] == "\\" and text.startswith(" ", end):
        return end - 1
    return end


def _env_name_ends(text: str) -> Iterator[re.Match[str]]:
    """The pattern's matches, from each place one of its words stands: capitals are rare in
    output, and str.find skips to them in C, where the regex would try every character."""
    for word in _ENV_NAME_WORDS:
        position = text.find(word)
        while position >= 0:
            found = _ENV_NAME_END.match(text, position)  # compiled once a word is there
            if found is not None:
                yield found
            position = text.find(word, position + len(word))


def find_env_secrets(src: ScanText) -> Iterator[PiiHit]:
    """The value of an environment variable whose name ends in SECRET, TOKEN, PASSPHRASE,
    CREDENTIAL(S), a secret's KEY (API_KEY, SECRET_KEY...) or _PW, a Dockerfile's ENV NAME
    value too."""
    text = src.text
    for match in _env_name_ends(text):
        start = _env_name_start(text, match.end("word"))
        if start < 0:
            continue
        name = text[start : match.end("word")]
        if name.endswith("KEY") and not name.endswith(_ENV_SECRET_KEYS):
            continue
        if name.endswith("PW") and not name.endswith("_PW"):
            continue  # a password's short name is a word of its own (LDAP_BIND_PW), not SPW
        if match.group("colon").startswith(":") and not _starts_line(text, start):
            continue  # a colon after a name inside a line is a log's error code, not YAML
        if match.group("blank") is not None and not _docker_env_name(text, start):
            continue  # a name and a value apart only in a Dockerfile's ENV NAME value
        group = "dq" if match.group("dq") else "sq" if match.group("sq") else "bare"
        value = match.group(group)
        if value.startswith(PLACEHOLDER_STARTS) or set(value) <= {"*", "x", "X"}:
            continue
        if SECRET_PATH.fullmatch(value):
            continue  # where the secret is kept (GOOGLE_APPLICATION_CREDENTIALS=/var/...json)
        start, end = match.span(group)
        if match.group("blank") is not None and group == "bare":
            rest = _ENV_LINE_REST.match(text, end)  # ENV's value runs to the line's end
            end = docker_env_value_end(text, start, rest.end() if rest else end)
        yield PiiHit("GENERIC_SECRET", start, _escape_trimmed(text, start, end))


# The rest of a legacy ENV's line, up to a line end (real or a JSON string's escaped one).
_ENV_LINE_REST = on_use(r"[^\r\n\\]{0,256}+")


_ENV_QUOTE_REACH = 256  # how far back on its line a JSON string's quote is looked for


def docker_env_value_end(text: str, start: int, end: int) -> int:
    """Where a legacy ENV's value at ``start``, read to its line's end ``end``, ends: before
    the quote that closes a JSON string holding the instruction (docker inspect's
    "CreatedBy": "... ENV NAME value"), and before blanks."""
    low = max(0, start - _ENV_QUOTE_REACH)
    line = text.rfind("\n", low, start) + 1 or low
    if text.find('"', line, start) >= 0:
        close = text.rfind('"', start, end)
        end = close if close > start else end
    while end > start and text[end - 1] in " \t\r":
        end -= 1
    return end


def _docker_env_name(text: str, start: int) -> bool:
    """Whether the name at ``start`` is a Dockerfile's ENV's in its legacy form, ``ENV NAME
    value`` (docker history shows it after ``#(nop)``)."""
    keyword = start - len("ENV ")
    return (
        text.startswith("ENV", keyword)
        and text[start - 1] in " \t"
        and not (word_before(text, keyword))
    )


# An environment variable given as a name and a value: YAML on two lines (a pod's spec), or
# JSON with the value next, on the same line or, pretty-printed, the next (kubectl -o json, an
# ECS task definition).
_NAMED_VALUE = on_use(
    r"name[\"']?[ \t]*:[ \t]*[\"']?(?P<name>[A-Za-z_][A-Za-z0-9_]{0,127})[\"']?"
    r"[ \t]*(?:,[ \t]*+(?:\r?\n)?|\r?\n)[ \t]*[\"']?value[\"']?[ \t]*:[ \t]*"
    r"(?:\"(?P<dq>[^\"\r\n]{1,256})\"|'(?P<sq>[^'\r\n]{1,256})'|(?P<bare>[^\s\"',}]{1,256}))"
)
_SECRET_NAME_ENDS = (
    *("PASSWORD", "PASSWD", "SECRET", "TOKEN", "PASSPHRASE", "CREDENTIAL"),
    _ENV_SECRET_PASS,
)


def secret_name(name: str) -> bool:
    """Whether an environment variable's name says its value is a secret."""
    upper = name.upper()
    if upper.endswith(_ENV_SECRET_PASS):
        return True  # before the plural's S comes off: SMTP_PASS
    upper = upper.removesuffix("S")
    return upper.endswith(_SECRET_NAME_ENDS) or upper.endswith(_ENV_SECRET_KEYS)


def find_named_values(src: ScanText) -> Iterator[PiiHit]:
    """The value of a secret-named environment variable given as ``name:`` and ``value:``."""
    if "value" not in src.text:  # most outputs name things without giving values
        return
    for match in finditer_with(_NAMED_VALUE, src.text, "name"):
        if not secret_name(match.group("name")):
            continue
        group = match.lastgroup or "bare"
        if match.group(group).startswith(PLACEHOLDER_STARTS):
            continue
        start, end = match.span(group)
        if group == "bare" and "\n" in match.group():
            end = _yaml_plain_end(src.text, end)  # YAML's value: every word to the line's end
        yield PiiHit("GENERIC_SECRET", start, end)


# XML elements named for a secret (Maven's settings.xml <password>, <apiKey>), their text
# perhaps in a CDATA section; an element whose key or name attribute names one, with the
# value as an attribute (.NET's <add key="ApiKey" value="..."/>, Spring's <property
# name="password" value="..."/>) or as its text (Hibernate's <property
# name="connection.password">, Java's <entry key="db.password">); and PHP's constants
# (WordPress's define('DB_PASSWORD', '...')).
_XML_ELEMENT = on_use(
    r"<(?P<name>[A-Za-z_][A-Za-z0-9_.:-]{0,63}+)>"
    r"(?:<!\[CDATA\[(?P<cdata>(?:[^\]\r\n]|\](?!\]>)){1,256}+)\]\]>|(?P<value>[^<\r\n]{1,256}+))"
    r"</(?P=name)>"
)
_NAMED_ATTRIBUTE = on_use(
    r"(?<![A-Za-z0-9_-])(?:key|name)=\"(?P<name>[^\"\r\n]{1,64}+)\"[ \t]+"
    r"value=\"(?P<value>[^\"\r\n]{1,256}+)\""
)
_NAMED_ELEMENT = on_use(
    r"<(?P<tag>entry|property)[ \t]+(?:key|name)=\"(?P<name>[^\"\r\n]{1,64}+)\"[ \t]*>"
    r"(?P<value>[^<\r\n]{1,256}+)</(?P=tag)>"
)
_PHP_DEFINE = on_use(
    r"define\([ \t]*['\"](?P<name>[A-Za-z_][A-Za-z0-9_]{0,63}+)['\"][ \t]*,[ \t]*"
    r"(?:'(?P<sq>[^'\r\n]{1,256}+)'|\"(?P<dq>[^\"\r\n]{1,256}+)\")"
)
# Each with whether its matches hold key=" or name=" (looked for once for both), and literals
# one of which each of its matches holds besides (none: those are all it needs).
_NAMED_LITERALS = ('key="', 'name="')
_MARKUP_PATTERNS = (
    (_XML_ELEMENT, False, ("</",)),
    (_NAMED_ATTRIBUTE, True, ()),
    (_NAMED_ELEMENT, True, ("<entry", "<property")),
    (_PHP_DEFINE, False, ("define(",)),
)


def find_markup_secrets(src: ScanText) -> Iterator[PiiHit]:
    """The text of an XML element named for a secret, the value of an element whose key or
    name attribute is one, and of a PHP constant so named."""
    text = src.text
    named = any(literal in text for literal in _NAMED_LITERALS)  # C searches, once for two
    for pattern, needs_named, literals in _MARKUP_PATTERNS:
        if needs_named and not named:
            continue
        found = finditer_with(pattern, text, *literals) if literals else pattern.finditer(text)
        for match in found:
            name = match.group("name").rpartition(":")[2]
            group = match.lastgroup or "value"
            value = match.group(group)
            if secret_name(name) and not stand_in(value) and not page_cursor_name(name):
                yield PiiHit("GENERIC_SECRET", *match.span(group))


def stand_in(value: str) -> bool:
    """Whether a value stands in for a secret in docs or a masked output: a placeholder
    ($TOKEN, <token>, {{ .token }}), an ellipsis, stars or x's, a usage text's VALUE."""
    if value.startswith(PLACEHOLDER_STARTS) or value.endswith("..."):
        return True
    return set(value) <= {".", "*", "x", "X"} or _metavar(value.rstrip(":"))


# A value its own metadata marks secret, printed in the clear: an SSM parameter read with
# --with-decryption (the CLI prints its Type just before its Value), and terraform output
# -json's sensitive outputs (sensitive, type and value, in that order).
_JSON_STRING = r"\"(?P<value>(?:[^\"\\\r\n]|\\.){1,4096}+)\""
_SECURE_STRING = on_use(
    r"\"Type\"[ \t]*:[ \t]*\"SecureString\"[ \t]*,\s*+\"Value\"[ \t]*:[ \t]*" + _JSON_STRING
)
_SENSITIVE_OUTPUT = on_use(
    r"\"sensitive\"[ \t]*:[ \t]*true[ \t]*,\s*+\"type\"[ \t]*:[ \t]*\"string\"[ \t]*,\s*+"
    r"\"value\"[ \t]*:[ \t]*" + _JSON_STRING
)


# aws secretsmanager get-secret-value: the secret is the SecretString, whatever it holds.
_SECRET_STRING = on_use(r"\"SecretString\"[ \t]*:[ \t]*" + _JSON_STRING)
# az storage account keys list: each key's name and permissions, then its value.
_AZURE_STORAGE_KEY = on_use(
    r"\"keyName\"[ \t]*:[ \t]*\"[^\"\r\n]{0,64}+\"[ \t]*,\s*+\"permissions\"[ \t]*:[ \t]*"
    r"\"[A-Za-z]{1,16}+\"[ \t]*,\s*+\"value\"[ \t]*:[ \t]*" + _JSON_STRING
)
# The same as -o yaml prints it, and a row of -o tsv's or -o table's (key1, FULL, the value).
_AZURE_STORAGE_KEY_YAML = on_use(
    r"keyName:[ \t]*+key[0-9]\r?\n[ \t]*+permissions:[ \t]*+[A-Za-z]{1,16}+\r?\n"
    r"[ \t]*+value:[ \t]*+(?P<value>[^\s]{1,4096}+)"
)
_AZURE_STORAGE_KEY_ROW = on_use(
    r"(?<![A-Za-z0-9_-])key[0-9][ \t]++(?:FULL|READ)[ \t]++(?P<value>[A-Za-z0-9+/]{20,4096}+=*+)"
)
# Each with the literals of which every match holds one.
_SECURE_PATTERNS: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = (
    (_SECURE_STRING, ("SecureString",)),
    (_SENSITIVE_OUTPUT, ('"sensitive"',)),
    (_SECRET_STRING, ('"SecretString"',)),
    (_AZURE_STORAGE_KEY, ('"keyName"',)),
    (_AZURE_STORAGE_KEY_YAML, ("keyName:",)),
    (_AZURE_STORAGE_KEY_ROW, ("FULL", "READ")),
)


def find_secure_strings(src: ScanText) -> Iterator[PiiHit]:
    """The value of an AWS SSM SecureString parameter (aws ssm get-parameter
    --with-decryption), of a Secrets Manager secret (aws secretsmanager get-secret-value), of
    terraform's sensitive string outputs (terraform output -json) and of an Azure storage
    account's keys (az storage account keys list, as JSON, YAML, TSV or a table)."""
    text = src.text
    for pattern, literals in _SECURE_PATTERNS:
        for match in finditer_with(pattern, text, *literals):
            yield PiiHit("GENERIC_SECRET", *match.span("value"))


# Vault's table output: "Key  Value", "---  -----", then a row a key. Every value of the table
# under "====== Data ======" (vault kv get) is a secret; in another (vault read of a dynamic
# secret's lease, a token's lookup) the rows whose key names one.
_VAULT_TABLE = on_use(r"Key[ \t]+Value[ \t]*\r?\n-{3}[ \t]+-{5}[ \t]*(?:\r?\n|\Z)")
_VAULT_ROW = on_use(r"(?P<key>[^\s=][^ \t\r\n]*+)[ \t]++(?P<value>[^\r\n]*+)(?:\r?\n|\Z)")
_VAULT_DATA = on_use(r"=+[ \t]+(?:Secret[ \t]+)?Data[ \t]+=+[ \t]*\r?\n")


def find_vault_data(src: ScanText) -> Iterator[PiiHit]:
    """The values of vault kv get's Data table, and the secret-named rows of Vault's others."""
    text = src.text
    covered = 0  # the end of the last table's rows: a header inside them is a row
    for table in finditer_with(_VAULT_TABLE, text, "Key"):
        if table.start() < covered:
            continue
        low = max(0, table.start() - 80)  # a header's line is short
        line = text.rfind("\n", low, max(low, table.start() - 1)) + 1
        data = _VAULT_DATA.fullmatch(text, line or low, table.start()) is not None
        position = table.end()
        while (row := _VAULT_ROW.match(text, position)) is not None and row.end() > position:
            position = row.end()
            start, end = row.span("value")
            while end > start and text[end - 1] in " \t\r":
                end -= 1  # the row's trailing blanks, trimmed here: a lazy value cost O(n²)
            if end > start and (data or secret_name(row.group("key"))):
                yield PiiHit("GENERIC_SECRET", start, end)
        covered = position


_AWS_SECRET_LABEL = on_use(r"secret_?(?:access_?)?key")
_AWS_SECRET_VALUE = on_use(
    r"(?:\\*[\"'])?[ \t]*(?:=>|[:=])[ \t]*(?:\\*[\"'])?"
    r"(?P<key>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
)


def find_aws_secret(src: ScanText) -> Iterator[PiiHit]:
    """A 40-character AWS secret access key after an aws_secret_access_key-like label."""
    lower = src.lower
    if not src.holds("secret"):  # a long literal: str's search skips most of the text
        return
    for label in _AWS_SECRET_LABEL.finditer(lower):
        aws_named = lower[max(0, label.start() - 4) : label.start()].rstrip("_-").endswith("aws")
        if "access" not in label.group() and not aws_named:
            continue  # a bare secret_key is too generic to call an AWS key
        value = _AWS_SECRET_VALUE.match(src.text, label.end())
        if value:
            yield PiiHit("AWS_SECRET_KEY", *value.span("key"))


# A key in any case that names a secret (client_secret=, "api key:", "apiKey": ", token:) and
# a value that looks generated: one shorter than the 20 characters the encoded-run finder needs,
# or one its dashes cut into short runs (a UUID). Found from the key's last word, which str.find
# skips to in C; "key" counts only after a word that makes it a secret's (api, access, app...).
# Each word with what may follow it (credentials' plural, Rails's secret_key_base) and the
# separator after that: one pattern a word, whose literal prefix the engine skips to in C, so a
# "key" inside "monkey" or "keys" costs no Python.
_KEYED_WORDS = ("secret", "token", "passphrase", "credential", "key", "auth")
_KEYED_LABELS = tuple(
    (word, on_use(rf"{word}(?:s(?<=credentials))?+(?:_base)?+(?=[:=>\"' \t\\])"))
    for word in _KEYED_WORDS
)
_KEYED_VALUE = on_use(
    r"(?:\\*[\"'])?[ \t]*+(?:=>|[:=])[ \t]*+(?:\\*[\"'])?"
    r"(?P<value>[^\s\x00-\x1f\"'`\\,;&<>()\[\]{}|]{6,}+)"
)
_KEYED_OPTION_VALUE = on_use(
    r"[ \t]++(?:\\*[\"'])?(?P<value>[^\s\x00-\x1f\"'`\\,;&<>()\[\]{}|]{6,}+)"
)
_KEYED_KEY_WORDS = (
    *("api", "access", "secret", "private", "signing", "encryption", "master", "license"),
    *("auth", "app", "application", "account", "client", "subscription", "session", "fernet"),
)
# Azure's primaryKey and secondaryKey (Service Bus, Event Hubs, IoT Hub), written as one word:
# a database's "primary key" or primary_key is a column.
_KEYED_GLUED_WORDS = ("primary", "secondary")
_KEYED_NAME_CHARS = frozenset(string.ascii_lowercase + string.digits + "_-.")
_LETTERS = frozenset(string.ascii_lowercase)
# Keys that name where a secret is kept (a chart's existingSecret, a pod's imagePullSecrets).
_KEYED_REFERENCES = ("existing", "pullsecret")


# What a clock, a timer or a release says, which no generated secret looks like: a version
# or a number with its unit (v1.2.3, 12.5ms), a duration (1h30m0s), a date and time.
_MEASURE = on_use(
    r"v?[0-9]++(?:\.[0-9]++)++[a-z]{0,2}"
    r"|(?:[0-9]++(?:\.[0-9]++)?(?:ns|us|ms|s|m|h|d))++"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9:.]++(?:Z|[+-][0-9:]++)?)?"
)


# A Kubernetes object's name (DNS-1123: small letters, digits, "-" and "."), in parts that read
# as words ("tls", "creds2", "v2") or short numbers ("2024"), the last perhaps the five
# characters kubernetes appends to a generated name ("x7k2p"). A generated value's parts mix
# letters and digits ("a1b2-c3d4", a UUID's "e89b") or run long ("abcdef-123456").
_NAME_PART = on_use(r"[a-z]++[0-9]*+|[0-9]{1,4}+")
_GENERATED_SUFFIX = on_use(r"[bcdfghjklmnpqrstvwxz2456789]{5}")
_NAME_SEPARATORS = on_use(r"[-.]")


def _object_name(value: str) -> bool:
    """Whether a value after a key that names a secret is the name of one, in two parts or
    more: a Secret's as a volume or a TLS section names it, a token Secret's, docker's."""
    if len(value) > 253 or ("-" not in value and "." not in value):
        return False
    *parts, last = _NAME_SEPARATORS.split(value)
    if not all(_NAME_PART.fullmatch(part) for part in parts):
        return False
    return bool(_NAME_PART.fullmatch(last) or _GENERATED_SUFFIX.fullmatch(last))


# The owners of a secret that is always a value: a client's, an API's, a webhook's secret is
# no Secret's name (client_secret: purple-monkey-dishwasher-42).
_VALUE_OWNERS = (
    *("client", "api", "app", "consumer", "jwt", "session", "webhook", "signing", "shared"),
    *("encryption", "master", "private", "access", "account"),
)


def _names_object(key: str, word: str) -> bool:
    """Whether a key may name a Kubernetes object rather than give a secret: the word alone
    (secret:, token:) or a secret of a volume, a TLS section or an ingress (tlsSecret,
    auth-secret), not of a client or an API."""
    if key == word:
        return True
    return word == "secret" and not key[: -len(word)].rstrip("_-.").endswith(_VALUE_OWNERS)


def _keyed_labels(src: ScanText) -> list[tuple[int, str]]:
    """Where each secret-naming key's last word ends, and the word, in the order of the text."""
    lower = src.lower
    ends: list[tuple[int, str]] = []
    for word, label in _KEYED_LABELS:
        if not src.holds(word):
            continue  # a C search, and the pattern left uncompiled
        for match in label.finditer(lower):
            if word != "key" or _secret_key_name(lower, match.start()):
                ends.append((match.end(), word))
    return sorted(ends)


def _secret_key_name(lower: str, key: int) -> bool:
    """Whether the word before the "key" at ``key`` makes it a secret's: api_key, apiKey,
    "api key", x-api-key, primaryKey; not sort_key, primary key or monkey."""
    if lower.endswith(_KEYED_GLUED_WORDS, 0, key):
        return True
    end = key - 1 if key and lower[key - 1] in " _-." else key
    start = run_start(lower, end, _LETTERS, 24)
    return start >= 0 and lower[start:end].endswith(_KEYED_KEY_WORDS)


def find_keyed_secrets(src: ScanText) -> Iterator[PiiHit]:
    """A generated-looking value after a key that names a secret, in any case and however
    short (six characters or more): token: 9f8e7d6c5b4a, "api key: <a UUID>"."""
    text, lower = src.text, src.lower
    covered = 0  # the end of the last value: a key inside it is part of that value
    for label, word in _keyed_labels(src):
        if label < covered:
            continue
        name = run_start(lower, label, _KEYED_NAME_CHARS, 64)
        name = label if name < 0 else name  # a name longer than any key's
        match = _KEYED_VALUE.match(text, label)
        if match is None and lower.startswith("--", name):
            match = _KEYED_OPTION_VALUE.match(text, label)  # --client-secret VALUE
        if match is None or match.group("value").startswith("-"):
            continue
        covered = match.end()
        if name > 0 and lower[name - 1] == "=":
            continue  # a value that holds a key (?q=token=abc123), not a key of its own
        if any(ref in lower[name:label] for ref in _KEYED_REFERENCES):
            continue  # names a Secret object (existingSecret: db-secret-2), holds none
        if word == "token" and page_token_before(lower, match.start("value")):
            continue  # a page's cursor (next_token: ...), which the next call needs
        start, end = match.span("value")
        while end > start and text[end - 1] in ".:":
            end -= 1  # a sentence's full stop
        value = text[start:end]
        if value.startswith(PLACEHOLDER_STARTS) or SECRET_PATH.fullmatch(value):
            continue
        if names_a_location(value):
            continue  # where the secret is kept (secret: projects/p/secrets/db/versions/2)
        if _MEASURE.fullmatch(value):
            continue  # a time, a duration or a version (token: 2024-05-01T12:00:00Z, 12.5ms)
        if _names_object(lower[name:label], word) and _object_name(value):
            continue  # names a Secret (secret: my-tls-secret-v2, token: default-token-x7k2p)
        if word == "auth":
            decoded = decode_base64(value, shortest=3)
            if decoded is None or ":" not in decoded:
                continue  # a docker config's auth is user:password in base64; "auth: md5" not
        if looks_secret(value):
            yield PiiHit("GENERIC_SECRET", start, end)
