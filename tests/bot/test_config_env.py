"""The environment: unknown KESTREL_ variables are refused, errors blame their real source."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, get_args, get_origin

import msgspec
import pytest

from bot.cli.common import terminal_user
from bot.config.settings import ConfigError, Settings, load_settings
from bot.config.sources import NON_SETTING_VARIABLES
from tests.bot.cli.test_cli import kestrel, one_line_error, write_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of its own (``.env`` is read from it) and no variables of the developer's."""
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith(("KESTREL_", "OPENAI_"))]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("DATABASE", raising=False)
    return tmp_path


def refusal(**variables: str) -> str:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in variables.items():
            patch.setenv(name, value)
        with pytest.raises(ConfigError) as caught:
            load_settings()
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("KESTREL_MODLE__NAME", "environment KESTREL_MODLE__NAME: unknown variable"),
        ("KESTREL_MODEL__NAMME", "environment KESTREL_MODEL__NAMME: unknown variable"),
        ("KESTREL_BUDGETS__MAX_ITERATIONS__X", "KESTREL_BUDGETS__MAX_ITERATIONS__X: unknown"),
        ("KESTREL_DATABASE", "did you mean KESTREL_DATABASE_URL?"),
        ("KESTREL_OPENAI_API_KEY", "did you mean OPENAI_API_KEY?"),
        ("kestrel_modle__name", "kestrel_modle__name: unknown variable"),
        ("KESTREL_BASE_DIR", "KESTREL_BASE_DIR: base_dir is not a setting"),
        # A misspelt key, as the file's keys are: the variable it is nearest.
        ("KESTREL_MODLE__NAME", "unknown variable (did you mean KESTREL_MODEL__NAME?);"),
        ("KESTREL_MODEL__NMAE", "unknown variable (did you mean KESTREL_MODEL__NAME?);"),
        ("KESTREL_POLICY__ONCAL", "unknown variable (did you mean KESTREL_POLICY__ONCALL?);"),
        # One _ where a section's key needs two: the key, not the section set as JSON.
        ("KESTREL_MODEL_NAME", "unknown variable (did you mean KESTREL_MODEL__NAME?);"),
        ("KESTREL_PII_MODE", "unknown variable (did you mean KESTREL_PII__MODE?);"),
        ("KESTREL_DEADLINES_WAIT_EFFECT", "(did you mean KESTREL_DEADLINES__WAIT_EFFECT?);"),
        # A setting whose variable is not KESTREL_<KEY>: that variable, not one refused.
        ("KESTREL_DATABASE_URLL", "unknown variable (did you mean KESTREL_DATABASE_URL?);"),
        ("KESTREL_OPENAI_API_KY", "unknown variable (did you mean OPENAI_API_KEY?);"),
        # A misspelt variable that is read from the environment, not a setting.
        ("KESTREL_LOG_LEVL", "unknown variable (did you mean KESTREL_LOG_LEVEL?);"),
        ("KESTREL_WEB_TOKN", "unknown variable (did you mean KESTREL_WEB_TOKEN?);"),
    ],
)
def test_unknown_variables_are_refused_by_name(name: str, expected: str) -> None:
    assert expected in refusal(**{name: "x"})


@pytest.mark.parametrize(
    "name",
    [
        "KESTREL_ZZZ",
        "KESTREL_MODLE__NAMME",
        "KESTREL_BUDGETS__MAX_ITERATIONS__X",
        # Words an operator's variable shares, not a misspelling of it; the test suite's own.
        "KESTREL_WEB_PORT",
        "KESTREL_POSTGRES_DSN",
        # Too many _ to try each as __.
        "KESTREL_A_B_C_D_E_F_G_H_I_J_K_L_M_N_O_P",
    ],
)
def test_a_variable_near_no_setting_guesses_none(name: str) -> None:
    assert "did you mean" not in refusal(**{name: "x"})


def test_unknown_variables_in_dotenv_are_refused_by_name(clean_environment: Path) -> None:
    (clean_environment / ".env").write_text("OTHER_TOOL=1\nKESTREL_MODLE__NAME=x\n")
    assert ".env KESTREL_MODLE__NAME: unknown variable" in refusal()


def test_the_programs_own_variables_and_nested_mappings_are_allowed(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in NON_SETTING_VARIABLES - {"KESTREL_CONFIG"}:
        if not name.endswith("_FILE"):  # a secret's file variant names a file: tests/deploy
            monkeypatch.setenv(name, "x")
    monkeypatch.setenv("KESTREL_MODEL__NAME", "from-env")
    monkeypatch.setenv("KESTREL_DEADLINES__PER_TOOL__RESTART_UNIT", "60")
    monkeypatch.setenv("KESTREL_DATABASE_URL", "env.db")
    (clean_environment / ".env").write_text("KESTREL_BUDGETS__MAX_ITERATIONS=7\nOTHER=1\n")
    settings = load_settings()
    assert settings.model.name == "from-env"
    assert settings.deadlines.per_tool == {"restart_unit": 60}
    assert settings.database == "env.db"
    assert settings.budgets.max_iterations == 7


def test_dotenv_may_name_the_config_file(clean_environment: Path) -> None:
    (clean_environment / "other.yaml").write_text("model: {name: from-other}\n")
    (clean_environment / ".env").write_text("KESTREL_CONFIG=other.yaml\n")
    assert load_settings().model.name == "from-other"


def test_an_unprefixed_database_variable_does_not_move_the_journal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DATABASE", "/tmp/elsewhere.db")
    assert load_settings().database == "kestrel.db"
    assert Settings().database == "kestrel.db"


def test_the_file_database_key_still_works_and_the_environment_overrides_it(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(clean_environment, database="file.db")
    assert load_settings().database == "file.db"
    monkeypatch.setenv("KESTREL_DATABASE_URL", "env.db")
    assert load_settings().database == "env.db"


def test_base_dir_is_not_settable(clean_environment: Path) -> None:
    write_config(clean_environment, base_dir="/elsewhere")
    assert "kestrel.yaml: base_dir: not a setting" in refusal()
    (clean_environment / "kestrel.yaml").unlink()
    assert load_settings().base_dir == clean_environment


def test_errors_from_the_environment_blame_the_variable(clean_environment: Path) -> None:
    write_config(clean_environment, budgets={"max_tool_calls": 0})
    message = refusal(KESTREL_BUDGETS__MAX_ITERATIONS="0")
    assert "environment KESTREL_BUDGETS__MAX_ITERATIONS: budgets.max_iterations:" in message
    assert "kestrel.yaml: budgets.max_tool_calls:" in message
    assert "kestrel.yaml: budgets.max_iterations" not in message


def test_a_pii_check_of_the_file_is_not_blamed_on_a_pii_variable(
    clean_environment: Path,
) -> None:
    # The pii section is a dataclass: its own checks (entity names, a salt's length) are
    # placed at the field they are about, as a model's validators were, not at the section,
    # where any variable setting a key of the section would take the blame.
    write_config(clean_environment, pii={"entities": ["SHOE_SIZE"]})
    message = refusal(KESTREL_PII__MODE="reject")
    assert "kestrel.yaml: pii.entities: unknown entity type(s) SHOE_SIZE" in message
    assert "KESTREL_PII__MODE" not in message
    write_config(clean_environment, pii={"operators": {"EMAIL_ADDRESS": {"salt": "short"}}})
    message = refusal(KESTREL_PII__OPERATORS__EMAIL_ADDRESS__TYPE="hash")
    assert "KESTREL_PII__OPERATORS" not in message
    assert "kestrel.yaml: pii.operators.EMAIL_ADDRESS.salt: a hash salt" in message


def test_a_section_that_is_not_json_names_the_variable() -> None:
    message = refusal(KESTREL_BUDGETS="max_iterations=3")
    assert message.startswith("environment KESTREL_BUDGETS: budgets: not valid JSON")
    assert "KESTREL_BUDGETS__KEY" in message


def test_lists_and_sections_are_json_and_their_keys_lay_over_them(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_config(clean_environment, budgets={"max_iterations": 2, "max_tokens": 9})
    (clean_environment / ".env").write_text('KESTREL_BUDGETS={"max_iterations": 3}\n')
    monkeypatch.setenv("KESTREL_BUDGETS__MAX_TOOL_CALLS", "5")
    monkeypatch.setenv("KESTREL_POLICY__ONCALL", '["U1", "U2"]')
    monkeypatch.setenv("KESTREL_SYSTEM_PROMPT", '["a string, not JSON"]')
    settings = load_settings()
    budgets = settings.budgets
    assert (budgets.max_iterations, budgets.max_tool_calls, budgets.max_tokens) == (3, 5, 9)
    assert settings.policy.oncall == ["U1", "U2"]
    assert settings.system_prompt == '["a string, not JSON"]'


def test_a_list_that_is_not_json_names_the_variable() -> None:
    message = refusal(KESTREL_POLICY__ONCALL="U1,U2")
    assert message.startswith("environment KESTREL_POLICY__ONCALL: policy.oncall: not valid JSON")


@pytest.mark.parametrize("written", ["off", "Off", "false", "no"])
def test_pii_mode_off_as_yaml_reads_it(clean_environment: Path, written: str) -> None:
    (clean_environment / "kestrel.yaml").write_text(f"pii: {{mode: {written}}}\n")
    assert load_settings().pii.mode.value == "off"


def test_every_variable_is_listed_in_the_example_env_file() -> None:
    listed = set(re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))
    for name in NON_SETTING_VARIABLES | {"KESTREL_DATABASE_URL", "OPENAI_API_KEY"}:
        assert name in listed, name
    for name in listed:
        if name.startswith("KESTREL_") and name not in NON_SETTING_VARIABLES:
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv(name, "1")
                try:
                    load_settings()
                except ConfigError as exc:
                    assert "unknown variable" not in str(exc), name
                    assert "not a setting" not in str(exc), name


def test_environment_errors_are_one_line_from_the_command(tmp_path: Path) -> None:
    message = one_line_error(kestrel(tmp_path, "runs", "list", env={"KESTREL_MODLE__NAME": "x"}))
    assert "KESTREL_MODLE__NAME" in message
    unparsable = one_line_error(kestrel(tmp_path, "runs", "list", env={"KESTREL_POLICY": "{"}))
    assert "KESTREL_POLICY" in unparsable


def test_a_hostile_postgres_schema_is_one_line(tmp_path: Path) -> None:
    write_config(tmp_path, database="postgresql://k@127.0.0.1:1/k?schema=x;DROP TABLE runs")
    message = one_line_error(kestrel(tmp_path, "db", "check"))
    assert "schema" in message and "plain identifier" in message
    write_config(tmp_path, database="postgresql://k@[::1/k")
    assert "not a valid PostgreSQL URL" in one_line_error(kestrel(tmp_path, "db", "check"))


@pytest.mark.parametrize(
    ("written", "meant"),
    [("off", False), ("No", False), ("false", False), ("0", False), ("on", True), ("YES", True)],
)
def test_a_yes_or_no_variable_reads_as_people_write_it(
    monkeypatch: pytest.MonkeyPatch, written: str, meant: bool
) -> None:
    monkeypatch.setenv("KESTREL_HUMAN_IN_THE_LOOP", written)
    monkeypatch.setenv("KESTREL_WEB__METRICS_PUBLIC", written)
    settings = load_settings()
    assert (settings.human_in_the_loop, settings.web.metrics_public) == (meant, meant)


def test_a_variable_that_is_no_yes_or_no_is_named() -> None:
    message = refusal(KESTREL_HUMAN_IN_THE_LOOP="maybe")
    assert message == (
        "environment KESTREL_HUMAN_IN_THE_LOOP: human_in_the_loop: expected true or false,"
        " got a string"
    )


def test_numbers_from_variables_are_read_as_their_settings_type(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KESTREL_MODEL__TIMEOUT", "2.5")
    monkeypatch.setenv("KESTREL_BUDGETS__MAX_ITERATIONS", "7")
    settings = load_settings()
    assert (settings.model.timeout, settings.budgets.max_iterations) == (2.5, 7)


def test_the_api_key_is_never_shown_with_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")
    settings = load_settings()
    assert settings.openai_api_key is not None
    assert settings.openai_api_key.get_secret_value() == "sk-very-secret"
    assert "sk-very-secret" not in repr(settings) and "sk-very-secret" not in str(settings)


@pytest.mark.parametrize("written", ["30\n", " 30 ", "+30", "3_0"])
def test_a_number_from_a_variable_reads_as_python_reads_it(
    monkeypatch: pytest.MonkeyPatch, written: str
) -> None:
    monkeypatch.setenv("KESTREL_MODEL__TIMEOUT", written)
    monkeypatch.setenv("KESTREL_BUDGETS__MAX_ITERATIONS", written)
    monkeypatch.setenv("KESTREL_DEADLINES__PER_TOOL__RESTART", written)
    settings = load_settings()
    assert (settings.model.timeout, settings.budgets.max_iterations) == (30.0, 30)
    assert type(settings.budgets.max_iterations) is int
    assert settings.deadlines.per_tool == {"restart": 30.0}


@pytest.mark.parametrize("variable", ["OPENAI_API_KEY", "OPENAI_BASE_URL"])
@pytest.mark.parametrize("value", ["", "   ", "\t"])
@pytest.mark.parametrize("source", ["environment", ".env"])
def test_a_blank_model_endpoint_is_none_and_the_demo_plays(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, source: str
) -> None:
    # ``OPENAI_API_KEY=`` (a line of .env, a compose file's empty value) turned the demo off
    # and then failed for want of a key; one holding spaces was sent to the server as a key.
    # Empty or blank, either variable is now unset, wherever it is written.
    if source == ".env":
        (clean_environment / ".env").write_text(f"{variable}={value}\n")
    else:
        monkeypatch.setenv(variable, value)
    settings = load_settings()
    assert (settings.openai_api_key, settings.openai_base_url) == (None, None)
    assert settings.provider == "scripted"


def test_a_blank_variable_unsets_the_key_beneath_it(
    clean_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written empty is how one says "no key" over a .env that holds one: the demo plays.
    (clean_environment / ".env").write_text("OPENAI_API_KEY=sk-from-dotenv\n")
    monkeypatch.setenv("OPENAI_API_KEY", " ")
    assert load_settings().provider == "scripted"


def test_an_empty_api_key_is_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    # With the provider named, no key (empty or blank) is said in one line, and no traceback
    # of the provider's reaches anyone.
    from bot.cli.compose import build_model

    monkeypatch.setenv("OPENAI_API_KEY", " ")
    monkeypatch.setenv("KESTREL_MODEL__PROVIDER", "openai")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY is not set"):
        build_model(load_settings())


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("127.0.0.1:11434/v1", "no http:// or https://"),
        ("localhost:11434", "no http:// or https://"),
        ("http://127.0.0.1:114340/v1", "port out of range"),
        ("http://ollama:abc/v1", "port not a number"),
        ("http://[::1/v1", "unclosed IPv6 address"),
        ("http:///v1", "no host"),
        (" http://127.0.0.1:11434/v1", "a space pasted before it"),
    ],
)
def test_an_unusable_model_url_is_refused_at_start_naming_the_variable(url: str, why: str) -> None:
    # Else a run panicked on the first model call (a port over 65535), every run failed after
    # retrying a request that could never be sent, or the CLI died with a traceback.
    message = refusal(OPENAI_BASE_URL=url)
    assert message.startswith("environment OPENAI_BASE_URL: openai_base_url:"), (why, message)
    assert "http(s) URL with a host" in message


def test_an_unusable_model_url_is_refused_without_its_password() -> None:
    # A proxy's basic auth in the URL (as the provider names it, with ***): the refusal goes to
    # the terminal and the service's log, where the password has no business.
    message = refusal(OPENAI_BASE_URL="https://kestrel:Tr0ub4dor3@proxy.example.com:99999/v1")
    assert "Tr0ub4dor3" not in message
    assert "https://kestrel:***@proxy.example.com:99999/v1" in message


def _float_settings(section: type[msgspec.Struct], above: tuple[str, ...] = ()) -> list[str]:
    """Every float setting below ``section``, dotted (a mapping of floats by one key, ``x``)."""
    found = []
    for field in msgspec.structs.fields(section):
        path, kind = (*above, field.encode_name), field.type
        if get_origin(kind) is dict:
            path, kind = (*path, "x"), get_args(kind)[1]
        if get_origin(kind) is Annotated:
            kind = get_args(kind)[0]
        if kind is float:
            found.append(".".join(path))
        elif isinstance(kind, type) and issubclass(kind, msgspec.Struct):
            found += _float_settings(kind, path)
    return found


FLOAT_SETTINGS = _float_settings(Settings)


def test_every_float_setting_is_found() -> None:
    assert {"database_timeout_seconds", "replica.shutdown_grace_seconds"} <= set(FLOAT_SETTINGS)
    assert {"deadlines.per_tool.x", "deadlines.remind_before"} <= set(FLOAT_SETTINGS)


@pytest.mark.parametrize("key", FLOAT_SETTINGS)
@pytest.mark.parametrize("written", [".inf", ".nan", "-.inf"])
def test_a_float_setting_that_is_not_finite_is_refused_in_the_file(
    clean_environment: Path, key: str, written: str
) -> None:
    *above, last = key.split(".")
    text = f"{last}: {written}"
    for name in reversed(above):
        text = f"{name}: {{{text}}}"
    (clean_environment / "kestrel.yaml").write_text(text + "\n")
    message = refusal()
    assert f"kestrel.yaml: {key}: must be a finite number" in message, message


@pytest.mark.parametrize("key", FLOAT_SETTINGS)
@pytest.mark.parametrize("written", ["inf", "nan", "-inf", " Infinity\n"])
def test_a_float_setting_that_is_not_finite_is_refused_from_a_variable(
    key: str, written: str
) -> None:
    name = "KESTREL_" + key.upper().replace(".", "__")
    message = refusal(**{name: written})
    assert message == f"environment {name}: {key.lower()}: must be a finite number", message


def test_a_database_url_no_parser_reads_is_refused_without_its_password(tmp_path: Path) -> None:
    # urlsplit's own message quotes the whole host part, password and all.
    database = "postgresql://kestrel:s3cr\u2100et@db:5432/k"
    message = refusal(KESTREL_DATABASE_URL=database)
    assert "database: not a valid PostgreSQL URL: " in message, message
    assert "s3cr" not in message
    write_config(tmp_path, database=database)
    message = one_line_error(kestrel(tmp_path, "db", "migrate"))
    assert "not a valid PostgreSQL URL" in message and "s3cr" not in message, message


def test_a_line_of_dotenv_that_cannot_be_read_is_warned_of_once_without_its_value(
    clean_environment: Path,
) -> None:
    # It was skipped without a word (python-dotenv's own warning, naming no file, went to a log
    # a one-shot command does not show): the setting it meant was simply not there.
    (clean_environment / ".env").write_text(
        'OPENAI_API_KEY="sk-live-f00d\nKESTREL_MODEL__NAME=other-model\nexport BAD NAME=1\n'
    )
    listed = kestrel(clean_environment, "runs", "list")
    assert listed.returncode == 0, listed.stderr
    warnings = listed.stderr.splitlines()
    assert [line.split(" WARNING kestrel.config: ")[1] for line in warnings] == [
        ".env:1: skipped: not NAME=VALUE (a quote left open? a space in the name?)",
        ".env:3: skipped: not NAME=VALUE (a quote left open? a space in the name?)",
    ]
    assert "f00d" not in listed.stderr
    # The lines between are read as before.
    assert load_settings().model.name == "other-model"


def test_a_variable_dotenv_does_not_give_is_warned_of_by_name(clean_environment: Path) -> None:
    # KESTREL_USER, KESTREL_LOG_LEVEL and the like are read from the environment alone; written
    # in .env (which .env.example, "every variable Kestrel reads", invites) they were ignored
    # without a word: `kestrel run` asked as the login name, not as the .env's user.
    (clean_environment / ".env").write_text(
        "KESTREL_USER=bob\nKESTREL_MODEL__NAME=other-model\nKESTREL_LOG_FORMAT=json\n"
    )
    ran = kestrel(clean_environment, "run", "--defer", "checkout is failing, can you look?")
    assert ran.returncode == 3, ran.stderr
    said = [line.partition(" WARNING kestrel.config: ") for line in ran.stderr.splitlines()]
    assert [warning for _, found, warning in said if found] == [
        ".env:1: skipped: KESTREL_USER is read from the environment only: export it",
        ".env:3: skipped: KESTREL_LOG_FORMAT is read from the environment only: export it",
    ]
    # What the warning says is so: the run was asked for by the login name, not by bob.
    listed = kestrel(clean_environment, "runs", "list", "--json")
    assert [run["requested_by"] for run in json.loads(listed.stdout)] == [terminal_user()]
    assert load_settings().model.name == "other-model"
