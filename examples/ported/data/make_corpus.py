"""Write `sentences.txt`, the small corpus the word language model trains on.

`python examples/ported/data/make_corpus.py` regenerates it. The sentences come from a
small English grammar with a fixed seed, so the file is the same on every machine and
a model has something to learn: articles agree with their noun's number, verbs with
their subject's, and some words only follow others. One sentence per line; the
language model splits the lines into training, validation and test text.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

SEED = 1234
NUM_SENTENCES = 640
PATH = Path(__file__).resolve().parent / "sentences.txt"

NOUNS = {  # singular: plural
    "cat": "cats",
    "dog": "dogs",
    "bird": "birds",
    "child": "children",
    "teacher": "teachers",
    "farmer": "farmers",
    "river": "rivers",
    "garden": "gardens",
    "house": "houses",
    "boat": "boats",
    "apple": "apples",
    "letter": "letters",
}
ANIMATE = ("cat", "dog", "bird", "child", "teacher", "farmer")
ADJECTIVES = ("small", "old", "quiet", "happy", "green", "tired", "bright", "little")
TRANSITIVE = {  # plural / base form: third person singular
    "see": "sees",
    "like": "likes",
    "follow": "follows",
    "find": "finds",
    "watch": "watches",
    "carry": "carries",
}
INTRANSITIVE = {"sleep": "sleeps", "sing": "sings", "wait": "waits", "run": "runs"}
PLACES = ("near the river", "in the garden", "by the house", "on the boat", "at home")
ADVERBS = ("slowly", "often", "again", "today", "quietly")
NAMES = ("anna", "tom", "maria", "leo")


def noun_phrase(rng: random.Random, animate: bool) -> tuple[list[str], bool]:
    """Words of a noun phrase and whether it is plural."""
    if animate and rng.random() < 0.15:
        return [rng.choice(NAMES)], False
    noun = rng.choice(ANIMATE if animate else tuple(NOUNS))
    plural = rng.random() < 0.4
    if plural:
        determiner = rng.choice(("the", "some", "two", "many"))
    else:
        determiner = rng.choice(("the", "a", "one", "every"))
    words = [determiner]
    if rng.random() < 0.45:
        words.append(rng.choice(ADJECTIVES))
    words.append(NOUNS[noun] if plural else noun)
    if determiner == "a" and words[1][0] in "aeiou":
        words[0] = "an"
    return words, plural


def sentence(rng: random.Random) -> str:
    subject, plural = noun_phrase(rng, animate=True)
    words = list(subject)
    if rng.random() < 0.65:
        verb = rng.choice(tuple(TRANSITIVE))
        words.append(verb if plural else TRANSITIVE[verb])
        obj, _ = noun_phrase(rng, animate=rng.random() < 0.5)
        words += obj
    else:
        verb = rng.choice(tuple(INTRANSITIVE))
        words.append(verb if plural else INTRANSITIVE[verb])
    if rng.random() < 0.4:
        words += rng.choice(PLACES).split()
    if rng.random() < 0.25:
        words.append(rng.choice(ADVERBS))
    if rng.random() < 0.2:
        words += ["and", *sentence(rng).split()[:-1]]
    return " ".join([*words, "."])


def corpus(seed: int = SEED, count: int = NUM_SENTENCES) -> str:
    rng = random.Random(seed)
    return "".join(sentence(rng) + "\n" for _ in range(count))


def main() -> int:
    PATH.write_text(corpus(), encoding="utf-8")
    text = PATH.read_text(encoding="utf-8")
    print(f"{PATH}: {len(text.splitlines())} sentences, {len(text.split())} words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
