import pytest

pytest.register_assert_rewrite("harness_core.testing")
