"""The crash tests' world (a catalog, a fake model server, a store), shared by every module here."""

from tests.crash.test_crash_resume import store_name as store_name  # the fixtures
from tests.crash.test_crash_resume import world as world
