"""The PII guard: modes, operators, failed scans, settings validation and overlaps."""

from __future__ import annotations

import hashlib
import sys
from typing import TypeVar

import msgspec
import pytest
from presidio_anonymizer import AnonymizerEngine, OperatorConfig, RecognizerResult

from bot.pii.guard import (
    WITHHELD_MESSAGE,
    OperatorSpec,
    PiiBuildError,
    PiiGuard,
    PiiHit,
    PiiMode,
    PiiSettings,
    ScanOutcome,
    resolve_overlaps,
)
from bot.plain import Invalid, Problem, convert

EMAIL_TEXT = "mail alice@example.com or call +44 20 7946 0958."


T = TypeVar("T", bound=msgspec.Struct)


def unchecked(cls: type[T], **fields: object) -> T:
    """A settings struct as no check would let through: the guard's own defences."""
    made = cls()
    for name, value in fields.items():
        msgspec.structs.force_setattr(made, name, value)
    return made


def guard(mode: PiiMode = PiiMode.REDACT, **operators: OperatorSpec) -> PiiGuard:
    return PiiGuard(PiiSettings(mode=mode, operators=operators))


def failing_scanner(text: str) -> list[PiiHit]:
    raise RuntimeError("boom")


def fixed_scanner(*hits: PiiHit) -> PiiGuard:
    return PiiGuard(PiiSettings(), scanner=lambda text: list(hits))


# --- off ---------------------------------------------------------------------------------------


def test_off_leaves_text_untouched() -> None:
    pii = guard(PiiMode.OFF)
    assert pii.mode is PiiMode.OFF
    for outcome in (pii.scan_prompt(EMAIL_TEXT), pii.scan_output(EMAIL_TEXT)):
        assert outcome == ScanOutcome(True, EMAIL_TEXT, (), None)


def test_off_never_calls_the_scanner() -> None:
    pii = PiiGuard(PiiSettings(mode=PiiMode.OFF), scanner=failing_scanner)
    assert pii.scan_output("x") == ScanOutcome(True, "x", (), None)


def test_off_builds_nothing_so_nothing_fails() -> None:
    settings = unchecked(PiiSettings, mode=PiiMode.OFF, entities=["NOPE"], operators={})
    assert PiiGuard(settings).scan_prompt("x").allowed


# --- redact --------------------------------------------------------------------------------------


def test_redact_replaces_with_the_entity_type_by_default() -> None:
    outcome = guard().scan_output(EMAIL_TEXT)
    assert outcome.allowed
    assert outcome.error is None
    assert outcome.text == "mail <EMAIL_ADDRESS> or call <PHONE_NUMBER>."
    assert [hit.entity_type for hit in outcome.hits] == ["EMAIL_ADDRESS", "PHONE_NUMBER"]


def test_redact_applies_to_prompts_too() -> None:
    outcome = guard().scan_prompt("my card is 4111 1111 1111 1111")
    assert outcome == ScanOutcome(
        True, "my card is <CREDIT_CARD>", (PiiHit("CREDIT_CARD", 11, 30),), None
    )


def test_redact_without_hits_returns_the_text_itself() -> None:
    text = "2024-05-01T12:00:00Z INFO all good pid=4312"
    assert guard().scan_output(text) == ScanOutcome(True, text, (), None)


def test_redact_replaces_registry_and_service_tokens() -> None:
    """npm, PyPI, SendGrid and Hugging Face tokens are found by their prefixes; names that
    share a prefix (npm_config_cache, hf_hub_download) and "SG." in prose are left alone."""
    pypi = (
        "pypi-AgEIcHlwaS5vcmcCJGU4OGY0MGEyLTNiZDQtM2U5NC1hMTE0LWYyN2VhYjE5NWI0NwACKlsxLFsia2Vz"
        "dHJlbC1jaGF0b3BzIl1dAAAGIHIP6UZWAVHkK4RWrFubZGdSvE7JKliZj3xEcBTP4bnY"
    )
    text = (
        "npm_config_cache=/home/runner/.npm npm_lifecycle_event=publish\n"
        "//registry.npmjs.org/:_authToken=npm_38AibNyyurlGFb0EkjKWREhbiGjlvhkTp3SK\n"
        f"twine upload -u __token__ -p {pypi} dist/*\n"
        "sgMail.setApiKey('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')\n"
        "signed off by SG. Tan\n"
        "hf_hub_download(repo_id, token='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') # hf_transfer on\n"
    )
    outcome = guard().scan_output(text)
    assert outcome.text == (
        "npm_config_cache=/home/runner/.npm npm_lifecycle_event=publish\n"
        "//registry.npmjs.org/:_authToken=<NPM_TOKEN>\n"
        "twine upload -u __token__ -p <PYPI_TOKEN> dist/*\n"
        "sgMail.setApiKey('<SENDGRID_API_KEY>')\n"
        "signed off by SG. Tan\n"
        "hf_hub_download(repo_id, token='<HUGGINGFACE_TOKEN>') # hf_transfer on\n"
    )


def test_redact_keeps_the_json_escape_after_a_password() -> None:
    text = '{"log": "password=hunter22\\nnext line", "env": "API_TOKEN=abcdef123456\\tX=1"}'
    outcome = guard().scan_output(text)
    assert outcome.text == (
        '{"log": "password=<CONNECTION_STRING_PASSWORD>\\nnext line", '
        '"env": "API_TOKEN=<GENERIC_SECRET>\\tX=1"}'
    )


def test_redact_keeps_non_ascii_text_around_hits() -> None:
    outcome = guard().scan_output("Grüße, jörg@example.de! 🙂")
    assert outcome.text == "Grüße, <EMAIL_ADDRESS>! 🙂"


def test_redact_replace_with_a_configured_value() -> None:
    pii = guard(EMAIL_ADDRESS=OperatorSpec(new_value="[email]"))
    assert pii.scan_output(EMAIL_TEXT).text == "mail [email] or call <PHONE_NUMBER>."


def test_replace_fast_path_matches_presidio() -> None:
    text = "ip 10.0.0.1 and alice@example.com and 10.0.0.2"
    outcome = guard(IP_ADDRESS=OperatorSpec(new_value="IP")).scan_output(text)
    spans = [RecognizerResult(h.entity_type, h.start, h.end, 1.0) for h in outcome.hits]
    expected = AnonymizerEngine().anonymize(  # type: ignore[no-untyped-call]
        text, spans, {"IP_ADDRESS": OperatorConfig("replace", {"new_value": "IP"})}
    )
    assert outcome.text == expected.text == "ip IP and <EMAIL_ADDRESS> and IP"


def test_redact_mask() -> None:
    spec = OperatorSpec(type="mask", masking_char="#", chars_to_mask=4, from_end=True)
    outcome = guard(EMAIL_ADDRESS=spec).scan_output("to alice@example.com")
    assert outcome.text == "to alice@example####"


def test_redact_mask_everything_by_default() -> None:
    outcome = guard(US_SSN=OperatorSpec(type="mask")).scan_output("ssn 123-45-6789")
    assert outcome.text == "ssn ***********"


def test_redact_hash_is_stable_within_the_process() -> None:
    pii = guard(EMAIL_ADDRESS=OperatorSpec(type="hash"))
    first = pii.scan_output("a alice@example.com").text
    again = pii.scan_output("b alice@example.com").text
    other = pii.scan_output("a bob@example.com").text
    rebuilt = guard(EMAIL_ADDRESS=OperatorSpec(type="hash")).scan_output("a alice@example.com")
    assert first[2:] == again[2:]
    assert first != other
    assert rebuilt.text == first
    assert len(first[2:]) == 64
    assert "alice" not in first


def test_redact_hash_with_a_configured_salt() -> None:
    salt = "0123456789abcdef-kestrel"
    pii = guard(EMAIL_ADDRESS=OperatorSpec(type="hash", salt=salt))
    digest = hashlib.sha256(b"alice@example.com" + salt.encode()).hexdigest()
    assert pii.scan_output("alice@example.com").text == digest


def test_redact_mixes_operators_per_entity() -> None:
    pii = guard(
        EMAIL_ADDRESS=OperatorSpec(type="mask", chars_to_mask=5),
        PHONE_NUMBER=OperatorSpec(new_value="[phone]"),
    )
    assert pii.scan_output(EMAIL_TEXT).text == "mail *****@example.com or call [phone]."


# --- reject --------------------------------------------------------------------------------------


def test_reject_denies_a_prompt_with_a_hit() -> None:
    outcome = guard(PiiMode.REJECT).scan_prompt(EMAIL_TEXT)
    assert not outcome.allowed
    assert outcome.text == EMAIL_TEXT
    assert {hit.entity_type for hit in outcome.hits} == {"EMAIL_ADDRESS", "PHONE_NUMBER"}
    assert outcome.error is None


def test_reject_withholds_an_output_with_a_hit() -> None:
    outcome = guard(PiiMode.REJECT).scan_output(EMAIL_TEXT)
    assert outcome.allowed
    assert outcome.text == WITHHELD_MESSAGE
    assert len(outcome.hits) == 2


def test_reject_passes_clean_text() -> None:
    pii = guard(PiiMode.REJECT)
    assert pii.scan_prompt("deploy v1.2.3 please") == ScanOutcome(
        True, "deploy v1.2.3 please", (), None
    )
    assert pii.scan_output("ok") == ScanOutcome(True, "ok", (), None)


# --- failed scans --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "prompt", "allowed"),
    [
        (PiiMode.REDACT, True, True),
        (PiiMode.REDACT, False, True),
        (PiiMode.REJECT, True, False),
        (PiiMode.REJECT, False, True),
    ],
)
def test_a_failed_scan_is_a_hit(mode: PiiMode, prompt: bool, allowed: bool) -> None:
    pii = PiiGuard(PiiSettings(mode=mode), scanner=failing_scanner)
    outcome = pii.scan_prompt(EMAIL_TEXT) if prompt else pii.scan_output(EMAIL_TEXT)
    assert outcome == ScanOutcome(allowed, WITHHELD_MESSAGE, (), "RuntimeError: boom")


def test_a_span_outside_the_text_fails_the_scan() -> None:
    outcome = fixed_scanner(PiiHit("EMAIL_ADDRESS", 2, 99)).scan_output("short")
    assert outcome.text == WITHHELD_MESSAGE
    assert outcome.error is not None
    assert outcome.error.startswith("ValueError: the scanner returned a span outside the text")


def test_a_failing_operator_fails_the_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    pii = guard(EMAIL_ADDRESS=OperatorSpec(type="mask"))

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("operator")

    monkeypatch.setattr(AnonymizerEngine, "anonymize", broken)
    outcome = pii.scan_output(EMAIL_TEXT)
    assert outcome == ScanOutcome(True, WITHHELD_MESSAGE, (), "KeyError: 'operator'")


def test_a_long_error_is_cut() -> None:
    def scanner(text: str) -> list[PiiHit]:
        raise ValueError("x" * 1000)

    outcome = PiiGuard(PiiSettings(), scanner=scanner).scan_output("a")
    assert outcome.error is not None
    assert len(outcome.error) == 300
    assert outcome.error.endswith("...")


# --- settings and build errors -------------------------------------------------------------------


def test_settings_defaults() -> None:
    settings = PiiSettings()
    assert settings.mode is PiiMode.REDACT
    assert settings.entities is None
    assert settings.operators == {}


def test_settings_from_yaml_like_data() -> None:
    settings = convert(
        {
            "mode": "reject",
            "entities": ["EMAIL_ADDRESS", "CREDIT_CARD"],
            "operators": {"CREDIT_CARD": {"type": "mask", "chars_to_mask": 12}},
        },
        PiiSettings,
    )
    assert settings.mode is PiiMode.REJECT
    assert settings.operators["CREDIT_CARD"].chars_to_mask == 12


def test_settings_reject_an_unknown_entity_by_name() -> None:
    with pytest.raises(ValueError, match="PASSPORT"):
        PiiSettings(entities=["EMAIL_ADDRESS", "PASSPORT"])


def test_settings_reject_an_operator_for_an_unknown_entity() -> None:
    with pytest.raises(Invalid, match=r"operators: unknown entity type\(s\) PASSPORT"):
        convert({"operators": {"PASSPORT": {"type": "mask"}}}, PiiSettings)


def test_settings_reject_an_unknown_field_by_name() -> None:
    with pytest.raises(Invalid) as caught:
        convert({"mode": "redact", "entitys": ["EMAIL_ADDRESS"]}, PiiSettings)
    assert caught.value.problems == [Problem(("entitys",), "unknown key (did you mean entities?)")]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"type": "encrypt"}, "type"),
        ({"masking_char": "**"}, "masking_char"),
        ({"chars_to_mask": -1}, "chars_to_mask"),
        ({"type": "hash", "salt": "too short"}, "salt"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_operator_spec_validation(data: dict[str, object], field: str) -> None:
    with pytest.raises(Invalid) as caught:
        convert(data, OperatorSpec)
    assert [problem.loc for problem in caught.value.problems] == [(field,)]


def test_unknown_mode_is_a_validation_error() -> None:
    with pytest.raises(Invalid, match="mode: 'scream' is not one of off, redact, reject"):
        convert({"mode": "scream"}, PiiSettings)


def test_settings_built_in_code_refuse_an_operator_of_an_unknown_entity() -> None:
    with pytest.raises(ValueError, match="PASSPORT"):
        PiiSettings(mode=PiiMode.REJECT, operators={"PASSPORT": OperatorSpec()})


def test_an_operator_built_in_code_refuses_a_short_salt() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        OperatorSpec(type="hash", salt="short")


def test_build_error_for_an_operator_presidio_refuses() -> None:
    spec = unchecked(
        OperatorSpec,
        type="hash",
        new_value=None,
        masking_char="*",
        chars_to_mask=100,
        from_end=False,
        salt="short",
    )
    settings = PiiSettings(operators={"EMAIL_ADDRESS": spec})
    with pytest.raises(PiiBuildError, match=r"EMAIL_ADDRESS.*16 bytes"):
        PiiGuard(settings)


def test_build_error_when_the_anonymizer_cannot_be_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "presidio_anonymizer", None)
    settings = PiiSettings(operators={"EMAIL_ADDRESS": OperatorSpec(type="mask", chars_to_mask=3)})
    with pytest.raises(PiiBuildError, match="presidio-anonymizer cannot be imported"):
        PiiGuard(settings)


def test_replacing_does_not_need_the_anonymizer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "presidio_anonymizer", None)
    guard = PiiGuard(PiiSettings(mode=PiiMode.REDACT))
    assert guard.scan_output(EMAIL_TEXT).text == "mail <EMAIL_ADDRESS> or call <PHONE_NUMBER>."


def test_reject_does_not_need_the_anonymizer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "presidio_anonymizer", None)
    assert not PiiGuard(PiiSettings(mode=PiiMode.REJECT)).scan_prompt(EMAIL_TEXT).allowed


def test_entities_limit_what_is_found() -> None:
    pii = PiiGuard(PiiSettings(entities=["PHONE_NUMBER"]))
    assert pii.scan_output(EMAIL_TEXT).text == "mail alice@example.com or call <PHONE_NUMBER>."


# --- overlaps ------------------------------------------------------------------------------------


def test_contained_hit_is_dropped() -> None:
    hits = resolve_overlaps([PiiHit("PHONE_NUMBER", 5, 10), PiiHit("JWT", 0, 20)], 30)
    assert hits == (PiiHit("JWT", 0, 20),)


def test_partial_overlap_keeps_the_longer_name_and_covers_both() -> None:
    hits = resolve_overlaps([PiiHit("IP_ADDRESS", 0, 12), PiiHit("EMAIL_ADDRESS", 8, 30)], 40)
    assert hits == (PiiHit("EMAIL_ADDRESS", 0, 30),)


def test_equal_spans_keep_the_higher_priority_type() -> None:
    hits = resolve_overlaps([PiiHit("BEARER_TOKEN", 3, 9), PiiHit("GITHUB_TOKEN", 3, 9)], 10)
    assert hits == (PiiHit("GITHUB_TOKEN", 3, 9),)


def test_adjacent_hits_stay_apart_and_sorted() -> None:
    hits = resolve_overlaps([PiiHit("US_SSN", 5, 9), PiiHit("IP_ADDRESS", 0, 5)], 9)
    assert hits == (PiiHit("IP_ADDRESS", 0, 5), PiiHit("US_SSN", 5, 9))


def test_overlapping_injected_hits_are_redacted_once() -> None:
    text = "0123456789abcdefghij"
    pii = fixed_scanner(
        PiiHit("EMAIL_ADDRESS", 2, 8), PiiHit("PHONE_NUMBER", 4, 12), PiiHit("US_SSN", 15, 17)
    )
    outcome = pii.scan_output(text)
    assert outcome.text == "01<PHONE_NUMBER>cde<US_SSN>hij"
    assert outcome.hits == (PiiHit("PHONE_NUMBER", 2, 12), PiiHit("US_SSN", 15, 17))


def test_bearer_jwt_is_redacted_once() -> None:
    jwt = (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0"
        ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
    )
    outcome = guard().scan_output(f"Authorization: Bearer {jwt}\n")
    assert outcome.text == "Authorization: Bearer <JWT>\n"


def test_url_credentials_are_not_an_email() -> None:
    outcome = guard().scan_output("DATABASE_URL=postgres://app:s3cr3t@db.example.com:5432/app")
    assert outcome.text == (
        "DATABASE_URL=postgres://app:<CONNECTION_STRING_PASSWORD>@db.example.com:5432/app"
    )


def test_build_error_for_an_operator_type_presidio_does_not_know() -> None:
    spec = unchecked(
        OperatorSpec,
        type="scramble",  # what the settings would refuse
        new_value=None,
        masking_char="*",
        chars_to_mask=1,
        from_end=False,
        salt=None,
    )
    with pytest.raises(PiiBuildError, match="operator for IBAN_CODE"):
        PiiGuard(PiiSettings(operators={"IBAN_CODE": spec}))


@pytest.mark.parametrize("mode", list(PiiMode))
def test_empty_text_passes(mode: PiiMode) -> None:
    assert guard(mode).scan_output("") == ScanOutcome(True, "", (), None)


def test_build_error_for_an_unknown_mode() -> None:
    settings = unchecked(
        PiiSettings,
        mode="scream",  # what the settings would refuse
        entities=None,
        operators={},
    )
    with pytest.raises(PiiBuildError, match="scream"):
        PiiGuard(settings)
