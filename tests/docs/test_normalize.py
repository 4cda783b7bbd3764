"""Look-alike forms of a question (a zero-width space inside words, full-width letters, Cyrillic look-alikes,
an emoji beside it) retrieve the same passages with the same match, so the same decline decision, as the
plain question, on the museum venue with a byte-level BPE tokenizer (the kind Qwen2.5 uses) trained here."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from edgespec.docs.answer import MIN_COVERAGE
from edgespec.docs.index import Index, build_index
from edgespec.docs.normalize import for_matching

MUSEUM = Path(__file__).parent.parent / "data" / "venues" / "museum"
CYRILLIC = str.maketrans({"a": "а", "e": "е", "o": "о", "p": "р", "c": "с"})


def zero_width(q: str) -> str:
    return " ".join(w[:2] + "\u200b" + w[2:] if len(w) > 3 else w for w in q.split())


def full_width(q: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else "\u3000" if c == " " else c for c in q)


FORMS = {"zero-width space": zero_width, "full-width": full_width,
         "Cyrillic look-alikes": lambda q: q.translate(CYRILLIC), "emoji beside": lambda q: q + " \U0001f3db\ufe0f\U0001f642",
         "bidi controls": lambda q: "\u202a" + q.replace(" ", " \u200d") + "\u202c"}


@pytest.fixture(scope="module")
def museum(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    pages = sorted((MUSEUM / "pages").iterdir())
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([p.read_text("utf-8") for p in pages],
                            trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                show_progress=False))
    root = tmp_path_factory.mktemp("museum")
    tok.save(str(root / "tokenizer.json"))
    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    sha = hashlib.sha256((root / "tokenizer.json").read_bytes()).hexdigest()
    build_index([MUSEUM / "pages"], root / "venue.idx", tok, sha)
    return Index.open(root / "venue.idx", tok, sha)


QUESTIONS = [json.loads(line) for line in (MUSEUM / "questions.jsonl").read_text("utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("form", sorted(FORMS))
def test_look_alike_questions_get_the_plain_questions_passages(museum, form):
    changed = 0
    for q in QUESTIONS:
        plain = q["question"]
        odd = FORMS[form](plain)
        assert odd != plain
        want = [(h.chunk, round(h.coverage, 6)) for h in museum.search(plain, 8)]
        got = [(h.chunk, round(h.coverage, 6)) for h in museum.search(odd, 8)]
        assert got == want, (form, plain, odd)
        best = max((c for _, c in want), default=0.0)
        assert (max((c for _, c in got), default=0.0) < MIN_COVERAGE) == (best < MIN_COVERAGE)
        # what the index would have seen without normalising: a smaller match for most questions
        raw_cov = float(museum.bm25(odd)[1].max())
        changed += raw_cov < best - 1e-6
    assert changed >= len(QUESTIONS) // 2, f"{form}: only {changed} questions needed normalising"


def test_for_matching_keeps_plain_text_and_other_scripts():
    assert for_matching("When does the museum open? £12, 10:00-17:00") == "When does the museum open? £12, 10:00-17:00"
    assert for_matching("Музей открыт до шести") == "Музей открыт до шести"  # Russian stays Russian
    assert for_matching("Το μουσείο") == "Το μουσείο"
    assert for_matching("Whаt timе") == "What time"  # Cyrillic а, е inside Latin words
    assert for_matching("ｃａｆé\u00ad") == "café"
    assert for_matching("open 👍🏽 now") == "open    now"
