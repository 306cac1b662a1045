"""The crash tests' world (a catalog, a fake model server), shared by every module here."""

from tests.crash.test_crash_resume import world as world  # the fixture
