# TEMPORARY stand-in until the PII module lands; overwritten by it.
from __future__ import annotations
from dataclasses import dataclass
from enum import Enum
from pydantic import BaseModel, ConfigDict

class PiiMode(str, Enum):
    OFF = "off"; REDACT = "redact"; REJECT = "reject"

class PiiSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: PiiMode = PiiMode.REDACT

class PiiBuildError(Exception):
    pass

@dataclass(frozen=True)
class ScanOutcome:
    allowed: bool
    text: str
    hits: tuple = ()
    error: str | None = None

class PiiGuard:
    def __init__(self, settings: PiiSettings) -> None:
        self.mode = settings.mode
    def scan_prompt(self, text: str) -> ScanOutcome:
        return ScanOutcome(True, text)
    def scan_output(self, text: str) -> ScanOutcome:
        return ScanOutcome(True, text)
