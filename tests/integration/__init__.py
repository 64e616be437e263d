"""The integration suite: the real opencode 1.18.33 behind the proxy as a process."""

import pytest

# Helper modules whose assertions are the tests' own: pytest explains their failures too.
pytest.register_assert_rewrite("tests.integration.expected", "tests.integration.write_back.shapes")
