"""Text as retrieval matches it: the question before it is looked up, and the passages when the index is built.

A visitor's question can reach the kiosk in forms a reader sees as the same words and a tokenizer does not:
pasted from a chat app with a zero-width space inside a word, typed on a phone keyboard in full-width
letters, with a Cyrillic "о" for a Latin "o", or with an emoji beside it. Each broke the words' tokens, so
the best passage's match fell under the decline threshold (measured on the museum venue with Qwen2.5's
tokenizer: 0.708 plain, 0.122 with a zero-width space, 0.0 full-width, 0.041 with Cyrillic look-alikes,
0.378 with an emoji beside it). `for_matching` maps all of them to the plain form:

1. Unicode NFKC: full-width and other compatibility forms to their plain letters and digits (ＡＢＣ -> ABC,
   ﬁ -> fi, ² -> 2).
2. Format characters (category Cf: zero-width space and joiners, bidi controls, soft hyphen, BOM) and
   variation selectors removed: they are invisible and sit inside words.
3. Cyrillic and Greek letters that look like Latin ones folded to those, in words that also hold a Latin
   letter, or, in a text that is mostly Latin, in words made only of look-alikes ("оn"). A Russian or
   Greek text keeps its letters: a whole word in that script is left alone unless the text is Latin.
4. Symbols that carry no words (emoji, pictographs, dingbats: category So, and emoji modifiers) become
   a space. Currency signs, punctuation and mathematical signs stay.

Only matching sees this form: the prompt quotes the visitor's question as written and the passages as
the page has them.
"""
from __future__ import annotations

import re
import unicodedata

# Cyrillic and Greek letters drawn like a Latin letter in common fonts (lower and upper case)
_LOOKALIKES = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "і": "i", "ї": "i", "ј": "j", "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w",
    "ӏ": "l", "һ": "h", "ү": "y",
    "А": "A", "В": "B", "Е": "E", "Ё": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "У": "Y", "Х": "X", "І": "I", "Ї": "I", "Ј": "J", "Ѕ": "S", "Ԁ": "D", "Ԛ": "Q", "Ԝ": "W",
    "Ӏ": "I", "Һ": "H", "Ү": "Y",
    # Greek
    "α": "a", "β": "b", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u",
    "χ": "x", "γ": "y",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O",
    "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
}
_FOLD = str.maketrans(_LOOKALIKES)
_WORD = re.compile(r"\w+")


def _drop(ch: str) -> bool:
    """Invisible characters that may sit inside a word: removed outright."""
    cat = unicodedata.category(ch)
    return cat == "Cf" or "\ufe00" <= ch <= "\ufe0f" or "\U000e0100" <= ch <= "\U000e01ef"


def _wordless(ch: str) -> bool:
    """A symbol that is no word and no sign a sentence needs (emoji, pictographs, modifiers): a space."""
    cat = unicodedata.category(ch)
    return cat == "So" or cat == "Cs" or "\U0001f3fb" <= ch <= "\U0001f3ff" or cat == "Co"


def _is_latin(ch: str) -> bool:
    return ch.isalpha() and ch < "\u0250"


def for_matching(text: str) -> str:
    """The text as retrieval compares it (module docstring); the text itself is never changed."""
    if text.isascii():
        return text
    text = unicodedata.normalize("NFKC", text)
    text = "".join("" if _drop(c) else " " if _wordless(c) else c for c in text)
    latin = sum(map(_is_latin, text))
    other = sum(1 for c in text if c.isalpha() and not _is_latin(c))
    mostly_latin = latin > other

    def fold(m: re.Match) -> str:
        w = m.group(0)
        if not any(c in _LOOKALIKES for c in w):
            return w
        if any(_is_latin(c) for c in w) or (mostly_latin and all(c in _LOOKALIKES or not c.isalpha() for c in w)):
            return w.translate(_FOLD)
        return w

    return _WORD.sub(fold, text)
