"""Question pairs for measuring the semantic cache: paraphrases that should hit, near misses that must not.

``PARAPHRASES``: the same question asked another way (a hit saves a reply).
``NEAR_MISSES``: questions that look alike but ask for something else (another
country or entity, number, negation, comparative or superlative, direction,
unit order, operator or question word); a hit would be a wrong answer.
The tests and ``brisk bench answer-cache`` measure both rates with :func:`evaluate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.answer_cache.keys import CacheKey, ModelIdentity

if TYPE_CHECKING:
    from engine.answer_cache.cache import AnswerCache

PARAPHRASES: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "Which city is the capital of France?"),
    ("What is the capital of France?", "what's the capital of France"),
    ("How do I reverse a list in Python?", "How can I reverse a list in Python?"),
    ("Who wrote Pride and Prejudice?", "Who is the author of Pride and Prejudice?"),
    ("What is the boiling point of water?", "At what temperature does water boil?"),
    ("How many legs does a spider have?", "How many legs do spiders have?"),
    ("What is photosynthesis?", "Can you explain what photosynthesis is?"),
    ("How do I make a cup of tea?", "How do you make a cup of tea?"),
    ("Why is the sky blue?", "Why does the sky look blue?"),
    ("What is the speed of light?", "How fast does light travel?"),
    ("Who painted the Mona Lisa?", "Who was the painter of the Mona Lisa?"),
    ("What is the largest planet in the solar system?", "Which is the biggest planet in the solar system?"),
    ("How do I sort a dictionary by value in Python?", "How can I sort a Python dictionary by its values?"),
    ("What does DNA stand for?", "What is DNA short for?"),
    ("When did World War 2 end?", "When did the Second World War end?"),
    ("What is the population of Japan?", "How many people live in Japan?"),
    ("Translate 'good morning' into Spanish.", "How do you say 'good morning' in Spanish?"),
    ("What are the symptoms of the flu?", "What symptoms does the flu cause?"),
    ("How do I center a div in CSS?", "How can I center a div with CSS?"),
    ("What is the chemical symbol for gold?", "What's the chemical symbol of gold?"),
    ("Give me a recipe for pancakes.", "Can you give me a pancake recipe?"),
    ("What is machine learning?", "Explain what machine learning is."),
    ("How tall is Mount Everest?", "What is the height of Mount Everest?"),
    ("Who discovered penicillin?", "Who was the discoverer of penicillin?"),
)

NEAR_MISSES: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "What is the capital of Germany?"),
    ("What is the capital of France?", "What is the capital of Spain?"),
    ("Who is the president of France?", "Who is the president of Brazil?"),
    ("What is the population of Japan?", "What is the population of China?"),
    ("Who wrote Pride and Prejudice?", "Who wrote Sense and Sensibility?"),
    ("What is 2 + 2?", "What is 2 + 3?"),
    ("What is 2 + 3?", "What is 2 * 3?"),
    ("What is 15% of 200?", "What is 20% of 200?"),
    ("Give me 3 tips for better sleep.", "Give me 5 tips for better sleep."),
    ("What happened in 1945?", "What happened in 1955?"),
    ("List the first ten prime numbers.", "List the first twenty prime numbers."),
    ("Is coffee good for you?", "Is coffee not good for you?"),
    ("Can dogs eat chocolate?", "Can't dogs eat chocolate?"),
    ("Why do cats purr?", "Why don't cats purr?"),
    ("Foods that are healthy for dogs", "Foods that are not healthy for dogs"),
    ("What is the largest planet in the solar system?", "What is the smallest planet in the solar system?"),
    ("What is the tallest building in the world?", "What is the shortest building in the world?"),
    ("Which country has the most people?", "Which country has the fewest people?"),
    ("Is Python faster than Java?", "Is Python slower than Java?"),
    ("What is the hottest month in Spain?", "What is the coldest month in Spain?"),
    ("What are the advantages of nuclear power?", "What are the disadvantages of nuclear power?"),
    ("What happened before the French Revolution?", "What happened after the French Revolution?"),
    ("How do I enable dark mode?", "How do I disable dark mode?"),
    ("How do I add a user in Linux?", "How do I remove a user in Linux?"),
    ("Convert 10 km to miles", "Convert 10 miles to km"),
    ("Convert 30 Celsius to Fahrenheit", "Convert 30 Fahrenheit to Celsius"),
    ("When was Albert Einstein born?", "Where was Albert Einstein born?"),
    ("Who invented the telephone?", "When was the telephone invented?"),
    ("How do I reverse a list in Python?", "How do I reverse a list in JavaScript?"),
    ("What is the difference between TCP and UDP?", "What is the difference between TCP and IP?"),
    ("How do I sort a list in Python 3?", "How do I sort a list in Python 2?"),
    ("What is the square root of 144?", "What is the square root of 169?"),
    ("Who was the first man on the Moon?", "Who was the second man on the Moon?"),
    ("What is the best way to learn Spanish?", "What is the worst way to learn Spanish?"),
    ("How do I buy Bitcoin?", "How do I sell Bitcoin?"),
    ("What is the minimum wage in California?", "What is the maximum wage in California?"),
    ("Explain the rules of chess.", "Explain the rules of checkers."),
    ("Who won the World Cup in 2018?", "Who won the World Cup in 2022?"),
)


def evaluate(cache: AnswerCache, identity: ModelIdentity) -> dict[str, float | int]:
    """Store the first question of each pair, look up the second; each pair in a context of its own.

    Returns the paraphrase hit rate and the near-miss false-hit rate (and counts) at the cache's
    current threshold.  Writes entries into ``cache``: use a throw-away one.
    """
    counts: dict[str, int] = {}
    for name, pairs in (("paraphrase", PARAPHRASES), ("near_miss", NEAR_MISSES)):
        hits = 0
        for i, (first, second) in enumerate(pairs):
            system = [{"role": "system", "content": f"{name} pair {i}"}]
            stored = CacheKey.for_messages(identity, [*system, {"role": "user", "content": first}])
            cache.put(stored, f"answer to {first}", [i + 1], 1.0)
            asked = CacheKey.for_messages(identity, [*system, {"role": "user", "content": second}])
            hits += cache.lookup(asked) is not None
        counts[f"{name}_pairs"] = len(pairs)
        counts[f"{name}_hits"] = hits
    return {
        **counts,
        "paraphrase_hit_rate": counts["paraphrase_hits"] / counts["paraphrase_pairs"],
        "false_hit_rate": counts["near_miss_hits"] / counts["near_miss_pairs"],
    }
