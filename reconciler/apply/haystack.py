"""Generated haystacks: documents of common words, of about a given token count, from a seed; a ``needle`` probe
hides one fact in one and asks for it, a ``batch`` probe puts filler before its requests as their shared prefix.

Called by ``reconciler.apply.probes``. The same seed, size and depth make the same document.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Common English words: in the BPE tokenizers of the report's models each is one token with its leading space, so a
# haystack of N words and periods is about N tokens (the server's own count comes back as prompt_tokens). None of
# them is a word of the needle, so the needle's sentence is the only one that answers its question.
_WORDS = (  # noqa: SIM905 - prose reads and edits better than two hundred quoted words
    "the a of and to in is was for on with as by at from that this it be are were or an but not have has had they "
    "their there which one all when we you he she his her so if out up about more some time into over after would "
    "could other than then them these two first new way may only also made like long many down day did get come "
    "make through back much before good year where most just any work well still old own last same great little "
    "right big high small large next early young important few public bad able river stone field morning garden "
    "window market winter summer music paper story water light house table letter road city hill forest village "
    "bridge island valley harbor train ship ocean mountain cloud rain snow wind sun moon star song book school "
    "teacher child friend family mother father brother sister doctor farmer baker painter walked carried opened "
    "watched wrote found kept brought held turned followed noticed quiet bright warm cold green blue red yellow"
).split()
_NEEDLE_ADJ = ("amber", "cobalt", "crimson", "silver", "golden", "violet", "scarlet", "ivory", "jade", "copper")
_NEEDLE_NOUN = ("falcon", "lantern", "compass", "harp", "anchor", "orchid", "glacier", "beacon", "quarry", "sextant")


@dataclass(frozen=True)
class Haystack:
    text: str  # the document, the needle inside it
    question: str
    answer: str  # what the answer must contain
    words: int
    needle_at: int  # the needle's position, in words from the start


def filler(rng: random.Random, tokens: int) -> list[str]:
    """Sentences of 8 to 14 words until about ``tokens`` tokens (a word or a period each)."""
    out: list[str] = []
    count = 0
    while count < tokens:
        n = rng.randint(8, 14)
        words = [rng.choice(_WORDS) for _ in range(n)]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + ".")
        count += n + 1
    return out


def make_haystack(*, seed: int, tokens: int, depth: float) -> Haystack:
    """A document of about ``tokens`` tokens from ``seed`` with one fact at ``depth`` (0 the start, 1 the end),
    and the question that only the fact answers. The same seed, size and depth make the same document."""
    rng = random.Random(seed)
    name = f"{rng.choice(_NEEDLE_ADJ)} {rng.choice(_NEEDLE_NOUN)}"
    code = f"{rng.randrange(10**6):06d}"
    needle = f"The secret code of the {name} vault is {code}."
    sentences = filler(rng, max(0, tokens - len(needle.split()) - 1))
    at = round(depth * len(sentences))
    sentences.insert(at, needle)
    words_before = sum(len(s.split()) for s in sentences[:at])
    text = " ".join(sentences)
    question = f"What is the secret code of the {name} vault? Answer with the code only."
    return Haystack(text, question, code, len(text.split()), words_before)
