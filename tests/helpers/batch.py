"""Several requests through a BatchEngine's public calls (submit, round, the tickets' results), on
the test's own thread: every request submitted, rounds run until all have ended."""
from __future__ import annotations


def generate_all(be, requests: list[dict]):
    """The results of `requests` (dicts of BatchEngine.submit's keyword arguments), in order."""
    tickets = [be.submit(**r) for r in requests]
    while be.round():
        pass
    return [t.wait(0) for t in tickets]
