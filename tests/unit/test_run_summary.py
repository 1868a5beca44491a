"""The end of `make test` says loudly when the compose stack's tests did not run (issue 39)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import compose_skips


def _skip(nodeid: str, reason: str):
    return SimpleNamespace(nodeid=nodeid, longrepr=(f"/x/{nodeid}", 57, f"Skipped: {reason}"))


def test_skipped_compose_tests_make_one_line_with_their_count_and_reason():
    why = "no Docker engine answers, and starting one (dockerd) needs root"
    skipped = [_skip(f"tests/compose/test_stack.py::test_{k}", why) for k in range(10)]
    skipped.append(_skip("tests/integration/test_query_recipes.py::test_delta", "no jars"))
    assert compose_skips(skipped) == f"compose stack NOT tested: 10 tests skipped ({why})"


def test_no_line_when_the_stack_ran():
    assert compose_skips([_skip("tests/integration/test_query_recipes.py::test_delta", "no jars")]) is None
    assert compose_skips([]) is None
