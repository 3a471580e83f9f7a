"""Requests compare by identity: the scheduler looks them up in its lists every step, and
a field-by-field comparison (prompt and output lists included) made a step's scheduling
quadratic in the batch."""

from __future__ import annotations

from mmserve.engine.request import Request


def test_requests_compare_and_hash_by_identity():
    assert Request.__eq__ is object.__eq__
    assert Request.__hash__ is object.__hash__
