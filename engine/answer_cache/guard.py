"""Rules that keep a similar-looking question with another meaning from reusing an answer.

An embedding similarity alone cannot tell "the capital of France" from "the
capital of Germany" (about 0.66 apart) or "a prime number above 10" from
"below 10".  :func:`mismatch` compares what makes two questions ask for
different facts and returns the first difference it finds (``None``: the
guard lets the pair through to the similarity threshold):

* **numbers**: digits and number words ("three" = "3"), ordinals ("second" = "2nd" = "2");
* **entities**: capitalised words not at the start of a sentence, acronyms,
  words with digits, code identifiers and quoted text; a word capitalised in
  one question must appear (in any case) in the other too;
* **negation**: "not", "n't", "never", "no", "without"...;
* **polarity words**: comparatives and superlatives and other opposites
  ("largest"/"smallest", "more"/"less", "before"/"after", "buy"/"sell");
  each question's set must match after synonyms are folded ("biggest" = "largest");
* **units** in the same order ("km to miles" is not "miles to km");
* **arithmetic operators** ("2 + 3" is not "2 * 3");
* **question words** when both have one ("when" is not "where"; "what", "which"
  and "how" count as one, since "how tall" asks "what height").

It errs on the side of a miss: a paraphrase that fails a rule is answered by
the model, never wrongly from the cache.
"""

from __future__ import annotations

import re
from collections import Counter

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.'\-]*[A-Za-z0-9]|[A-Za-z]")
_NUMBER = re.compile(r"(?<![A-Za-z])[-+]?\d[\d,]*(?:\.\d+)?(?:st|nd|rd|th)?")
_QUOTED = re.compile(r"\"([^\"]+)\"|'([^']{2,})'|`([^`]+)`")
_OPERATOR = re.compile(r"(?<=[\d\s)])([+\-*/^%×÷<>=])(?=[\s\d(])")
_SENTENCE_START = re.compile(r"(?:^|[.!?:;]\s+|\n)\s*[\"'(\[]*([A-Za-z][\w']*)")

_SMALL = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(f"{_SMALL} seventeen eighteen nineteen twenty".split(" "))}
_NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000"})
_NUMBER_WORDS.update({"million": "1e6", "billion": "1e9", "dozen": "12", "half": "0.5", "twice": "x2"})
_ORDINALS = {"first": "1st", "second": "2nd", "third": "3rd", "fourth": "4th", "fifth": "5th", "sixth": "6th"}
_ORDINALS.update({"seventh": "7th", "eighth": "8th", "ninth": "9th", "tenth": "10th"})
_NEGATIONS = {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot", "nowhere"}

# Each group folds synonyms to one canonical word; opposites are different canonical words.
_POLARITY_GROUPS = [  # base forms of size words ("how tall", "how fast") are left out: they ask the same thing
    ("large", "larger largest bigger biggest"),
    ("small", "smaller smallest"),
    ("high", "higher highest taller tallest"),
    ("low", "lower lowest shorter shortest"),
    ("long", "longer longest"),
    ("many", "more most"),
    ("few", "less least fewer fewest"),
    ("old", "older oldest elder eldest"),
    ("young", "younger youngest newer newest"),
    ("fast", "faster fastest quicker quickest"),
    ("slow", "slower slowest"),
    ("hot", "hot hotter hottest warmer warmest"),
    ("cold", "cold colder coldest cooler coolest"),
    ("heavy", "heavier heaviest"),
    ("light", "lighter lightest"),
    ("good", "good better best"),
    ("bad", "bad worse worst"),
    ("far", "farther farthest further furthest"),
    ("near", "nearer nearest closer closest"),
    ("cheap", "cheap cheaper cheapest"),
    ("expensive", "expensive pricier priciest"),
    ("rich", "richer richest"),
    ("poor", "poorer poorest"),
    ("deep", "deeper deepest"),
    ("before", "before earlier prior"),
    ("after", "after later"),
    ("above", "above"),
    ("below", "below beneath"),
    ("max", "max maximum"),
    ("min", "min minimum"),
    ("last", "last final"),
    ("increase", "increase increases raise rise"),
    ("decrease", "decrease decreases reduce drop"),
    ("advantages", "advantages pros benefits"),
    ("disadvantages", "disadvantages cons drawbacks downsides"),
    ("buy", "buy purchase"),
    ("sell", "sell"),
    ("import", "import imports"),
    ("export", "export exports"),
    ("enable", "enable enabled"),
    ("disable", "disable disabled"),
    ("add", "add"),
    ("remove", "remove delete"),
    ("start", "start begin"),
    ("stop", "stop"),
    ("north", "north northern"),
    ("south", "south southern"),
    ("east", "east eastern"),
    ("west", "west western"),
    ("true", "true"),
    ("false", "false"),
    ("legal", "legal"),
    ("illegal", "illegal"),
    ("male", "male men"),
    ("female", "female women"),
    ("encrypt", "encrypt encryption"),
    ("decrypt", "decrypt decryption"),
    ("upload", "upload"),
    ("download", "download"),
    ("input", "input"),
    ("output", "output"),
    ("win", "win"),
    ("lose", "lose"),
    ("inside", "inside"),
    ("outside", "outside"),
]
_POLARITY = {word: canon for canon, words in _POLARITY_GROUPS for word in words.split()}
_UNITS = {
    "km": "km", "kilometers": "km", "kilometres": "km", "mile": "mi", "miles": "mi", "meter": "m", "meters": "m",
    "metres": "m", "feet": "ft", "foot": "ft", "inch": "in", "inches": "in", "cm": "cm", "centimeters": "cm",
    "kg": "kg", "kilograms": "kg", "pounds": "lb", "lbs": "lb", "grams": "g", "ounces": "oz", "celsius": "C",
    "fahrenheit": "F", "kelvin": "K", "liters": "l", "litres": "l", "gallons": "gal", "dollars": "USD", "usd": "USD",
    "euros": "EUR", "eur": "EUR", "yen": "JPY", "pounds sterling": "GBP", "seconds": "s", "minutes": "min",
    "hours": "h", "days": "d", "weeks": "wk", "months": "mo", "years": "yr", "bytes": "B", "bits": "bit",
}  # fmt: skip
_QUESTION_WORDS = {"what": "what", "which": "what", "who": "who", "whom": "who", "whose": "who", "when": "when"}
_QUESTION_WORDS.update({"where": "where", "why": "why", "how": "what"})  # "how tall" = "what height"
_COMMON_CAPS = {
    "i", "a", "an", "the", "what", "which", "who", "whom", "whose", "when", "where", "why", "how", "is", "are", "was",
    "were", "do", "does", "did", "can", "could", "would", "should", "will", "please", "tell", "explain", "give",
    "list", "name", "describe", "in", "on", "of", "for", "and", "or", "my", "your", "me", "it", "its", "this", "that",
    "hi", "hello", "hey", "thanks", "ok", "okay", "let", "lets", "let's", "show", "find", "write", "summarize",
    "summarise", "define", "compare", "translate",
}  # fmt: skip


def _words(text: str) -> list[str]:
    return [w.strip("'.-") for w in _WORD.findall(text)]


def numbers(text: str) -> Counter[str]:
    found: Counter[str] = Counter()
    for raw in _NUMBER.findall(text):
        value = raw.replace(",", "").lstrip("+")
        digits = value[:-2] if value[-2:] in {"st", "nd", "rd", "th"} else value
        try:
            canon = format(float(digits), "g")
        except ValueError:
            continue
        found[canon] += 1  # "2nd" = "second" = "2": World War 2 is the Second World War
    for word in _words(text.lower()):
        if word in _NUMBER_WORDS:
            found[_NUMBER_WORDS[word]] += 1
        elif word in _ORDINALS:
            found[_ORDINALS[word][:-2]] += 1
    return found


def entities(text: str) -> set[str]:
    """Lower-cased names: capitalised words not opening a sentence, acronyms, identifiers, quoted text."""
    starts = {m.start(1) for m in _SENTENCE_START.finditer(text)}
    found: set[str] = set()
    for match in _WORD.finditer(text):
        word = match.group().strip("'.-")
        word = word[:-2] if word.endswith(("'s", "’s")) else word
        lower = word.lower()
        if lower in _COMMON_CAPS or lower in _POLARITY or lower in _NUMBER_WORDS or lower in _ORDINALS:
            continue
        capital = word[:1].isupper() and (match.start() not in starts or any(c.isupper() for c in word[1:]))
        code = any(c.isdigit() for c in word) or "_" in word or ("." in word and not word.endswith("."))
        if capital or code:
            found.add(lower)
    for groups in _QUOTED.findall(text):
        found.update(g.lower() for g in groups if g)
    return found


def negated(text: str) -> bool:
    lower = text.lower().replace("’", "'")
    return "n't" in lower or any(w in _NEGATIONS for w in _words(lower))


def polarity(text: str) -> set[str]:
    return {_POLARITY[w] for w in _words(text.lower()) if w in _POLARITY}


def units(text: str) -> list[str]:
    return [_UNITS[w] for w in _words(text.lower()) if w in _UNITS]


def operators(text: str) -> Counter[str]:
    found = Counter(_OPERATOR.findall(text))
    words = {"plus": "+", "minus": "-", "times": "*", "multiplied": "*", "divided": "/", "squared": "^2"}
    found.update(words[w] for w in _words(text.lower()) if w in words)
    return Counter({("*" if k == "×" else "/" if k == "÷" else k): v for k, v in found.items()})


def question_words(text: str) -> set[str]:
    return {_QUESTION_WORDS[w] for w in _words(text.lower()) if w in _QUESTION_WORDS}


def mismatch(a: str, b: str) -> str | None:
    """Why questions ``a`` and ``b`` may ask for different things, or ``None`` when no rule objects."""
    if numbers(a) != numbers(b):
        return "different numbers"
    words_a, words_b = set(_words(a.lower())), set(_words(b.lower()))
    text_a, text_b = a.lower(), b.lower()
    for name in entities(a) | entities(b):
        if (name in words_a or name in text_a) != (name in words_b or name in text_b):
            return f"different names ({name!r})"
    if negated(a) != negated(b):
        return "negation differs"
    if polarity(a) != polarity(b):
        return "comparison or direction differs"
    if units(a) != units(b):
        return "different units"
    if operators(a) != operators(b):
        return "different arithmetic"
    qa, qb = question_words(a), question_words(b)
    if qa and qb and qa != qb:
        return "asks for a different kind of answer"
    return None
