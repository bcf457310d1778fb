"""Fixtures shared by the harness_core tests: the `backend` a test runs on.

A test that takes a ``backend`` argument runs once per backend name, with that name as the test
id (``test_x[memory]``, ``test_x[sqlite]``). Which names:

- by default `HARNESS_BACKENDS`, ``memory`` and ``sqlite`` (the reference backend and the
  embedded durable one): a harness test just takes ``backend: str`` and passes it to
  `make_kit` or `new_repo`;
- a module, class or test that runs on another set says so with the ``backends`` marker, e.g.
  ``pytestmark = pytest.mark.backends(*ALL_BACKENDS)`` (the storage conformance suite) or
  ``@pytest.mark.backends("sqlite", "redis")`` (the kill soak); the closest marker wins;
- a module that needs more than the name (a repository factory, a snapshotter, a meter) defines
  its own ``backend`` fixture, which overrides this one and receives the name as
  ``request.param`` (the parametrization is indirect), e.g. test_crash_matrix.py.

Never parametrize ``backend`` with ``pytest.mark.parametrize``: pytest refuses the duplicate.
"""

from __future__ import annotations

import pytest

from tests.support.backends import HARNESS_BACKENDS


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "backends(*names): the backends the `backend` fixture runs a test on "
        "(default: memory, sqlite; see tests/harness_core/conftest.py)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("backends")
    names = marker.args if marker is not None else HARNESS_BACKENDS
    assert names, "pytest.mark.backends() needs at least one backend name"
    metafunc.parametrize("backend", names, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The name of the backend this test runs on (parametrized per the module docstring)."""
    return str(request.param)
