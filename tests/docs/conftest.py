"""The document tests' fixtures (helpers/venue.py holds the tokenizer and the fake embedding model)."""
from __future__ import annotations

import pytest

from helpers.venue import make_word_tokenizer


@pytest.fixture(scope="session")
def words(tmp_path_factory):
    return make_word_tokenizer(tmp_path_factory.mktemp("words"))
