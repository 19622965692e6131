"""Write the shipped instruction datasets: instructions.jsonl (Alpaca) and chat.jsonl (chat).

Run offline from the repository root; the output is committed, so nothing here runs at
training time:

    python gpu_runtime/datasets/generate.py

Every record comes from a seeded generator over small hand-written tables (arithmetic, unit
conversion, word games, made-up geography, rewriting, letter counting, definitions), so the
same seed always writes byte-identical files. Plain ASCII English throughout.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20240611
N_ALPACA = 400
N_CHAT = 300

WORDS = (
    "apple river stone cloud garden window candle forest pencil bridge ladder mirror "
    "ocean valley rabbit silver thunder meadow lantern harbor pepper orange violet "
    "copper basket falcon island marble nickel puzzle rocket saddle tunnel wagon zebra "
    "anchor butter cactus dragon engine feather glacier hammer jacket kettle lemon "
    "magnet needle oyster parrot quartz ribbon spider tiger umbrella velvet walnut yogurt"
).split()

# Made-up countries and their made-up capitals (fiction: nothing here is a real fact).
COUNTRIES = [
    ("Varnia", "Tolsk", "amber mines"),
    ("Quellmark", "Ostrava Minor", "glass bells"),
    ("Belloria", "Cantrel", "salt marshes"),
    ("Dunhaven", "Pellow", "wool markets"),
    ("Estrevia", "Marrow Bay", "lighthouses"),
    ("Fenwick Isles", "Harrowgate", "kelp farms"),
    ("Galdor", "Ironmere", "copper forges"),
    ("Hestaria", "Luminel", "tea terraces"),
    ("Iskaland", "Frostholm", "ice caves"),
    ("Jorvale", "Kestrel Point", "falcon races"),
    ("Korrin", "Sablewood", "cedar forests"),
    ("Lunaris", "Silvergate", "night markets"),
    ("Mordale", "Ashby", "stone bridges"),
    ("Nerith", "Coralport", "pearl divers"),
    ("Orvania", "Highcrest", "mountain trains"),
    ("Palandor", "Greenhollow", "apple orchards"),
]

DEFINITIONS = [
    ("a noun", "A noun is a word that names a person, place, thing or idea, such as cat or city."),
    ("a verb", "A verb is a word that describes an action or a state, such as run, think or be."),
    ("an adjective", "An adjective is a word that describes a noun, such as red, tall or quiet."),
    (
        "a prime number",
        "A prime number is a whole number greater than one whose only divisors "
        "are one and itself, such as 7 or 13.",
    ),
    (
        "an even number",
        "An even number is a whole number that can be divided by two with no "
        "remainder, such as 4 or 10.",
    ),
    ("a rectangle", "A rectangle is a flat shape with four straight sides and four right angles."),
    ("a triangle", "A triangle is a flat shape with three straight sides and three corners."),
    (
        "a circle",
        "A circle is a round flat shape where every point on the edge is the same "
        "distance from the center.",
    ),
    (
        "a synonym",
        "A synonym is a word that means the same or nearly the same as another word, "
        "like big and large.",
    ),
    (
        "an antonym",
        "An antonym is a word that means the opposite of another word, like hot and cold.",
    ),
    (
        "a sentence",
        "A sentence is a group of words that expresses a complete thought and "
        "usually has a subject and a verb.",
    ),
    ("a paragraph", "A paragraph is a group of sentences about one main idea."),
    (
        "a recipe",
        "A recipe is a set of instructions that explains how to prepare a dish, with "
        "a list of ingredients and steps.",
    ),
    (
        "a map",
        "A map is a drawing of an area that shows where places are and how to get between them.",
    ),
    ("a calendar", "A calendar is a chart that shows the days, weeks and months of a year."),
    ("a thermometer", "A thermometer is a tool that measures how hot or cold something is."),
    (
        "a library",
        "A library is a place where books and other materials are kept for people "
        "to read or borrow.",
    ),
    (
        "a bridge",
        "A bridge is a structure built to carry a road or path over a river, valley "
        "or another road.",
    ),
    (
        "an average",
        "An average is the sum of a list of numbers divided by how many numbers there are.",
    ),
    (
        "a fraction",
        "A fraction is a number that names a part of a whole, written as one number "
        "over another, like 3/4.",
    ),
    ("a habit", "A habit is something a person does regularly, often without thinking about it."),
    (
        "a password",
        "A password is a secret word or phrase used to prove who you are before using a system.",
    ),
]

OPPOSITES = [
    ("hot", "cold"),
    ("up", "down"),
    ("early", "late"),
    ("happy", "sad"),
    ("open", "closed"),
    ("light", "dark"),
    ("fast", "slow"),
    ("full", "empty"),
    ("loud", "quiet"),
    ("old", "new"),
    ("wet", "dry"),
    ("high", "low"),
    ("near", "far"),
    ("soft", "hard"),
    ("rich", "poor"),
    ("strong", "weak"),
    ("clean", "dirty"),
    ("thick", "thin"),
    ("begin", "end"),
    ("win", "lose"),
]

PLURALS = [
    ("cat", "cats"),
    ("box", "boxes"),
    ("city", "cities"),
    ("child", "children"),
    ("mouse", "mice"),
    ("leaf", "leaves"),
    ("tooth", "teeth"),
    ("bus", "buses"),
    ("knife", "knives"),
    ("person", "people"),
    ("goose", "geese"),
    ("baby", "babies"),
    ("foot", "feet"),
    ("wish", "wishes"),
    ("woman", "women"),
    ("potato", "potatoes"),
]

SUBJECTS = [
    "The cat",
    "My brother",
    "The teacher",
    "Our neighbor",
    "The old dog",
    "A small bird",
    "The baker",
    "My friend",
    "The pilot",
    "The farmer",
]
# (present, past) verb phrases
ACTIONS = [
    ("walks to the park", "walked to the park"),
    ("eats an apple", "ate an apple"),
    ("reads a long book", "read a long book"),
    ("writes a letter", "wrote a letter"),
    ("sings a song", "sang a song"),
    ("drinks cold water", "drank cold water"),
    ("builds a small house", "built a small house"),
    ("finds a silver coin", "found a silver coin"),
    ("paints the fence", "painted the fence"),
    ("catches the bus", "caught the bus"),
    ("opens the window", "opened the window"),
    ("buys fresh bread", "bought fresh bread"),
]

UNITS = [
    # (from, to, factor)
    ("kilometers", "meters", 1000),
    ("meters", "centimeters", 100),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("kilograms", "grams", 1000),
    ("liters", "milliliters", 1000),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("feet", "inches", 12),
    ("yards", "feet", 3),
]

SYSTEM_PROMPTS = [
    "You are a helpful assistant. Answer briefly and clearly.",
    "You are a patient tutor who explains things in simple words.",
    "You are a concise assistant. Give short, correct answers.",
    "You are a friendly helper for word games and small math problems.",
]


SINGULAR = {"feet": "foot", "inches": "inch"}


def _singular(word: str) -> str:
    return SINGULAR.get(word, word.removesuffix("s"))


def _plural(n: int, word: str) -> str:
    return word if n != 1 else _singular(word)


def _arithmetic(rng: random.Random) -> tuple[str, str, str]:
    kind = rng.choice(["add", "sub", "mul", "div"])
    if kind == "add":
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        return ("Add the two numbers.", f"{a} and {b}", f"The sum of {a} and {b} is {a + b}.")
    if kind == "sub":
        a, b = rng.randint(50, 999), rng.randint(1, 49)
        return (
            "Subtract the second number from the first.",
            f"{a} and {b}",
            f"{a} minus {b} equals {a - b}.",
        )
    if kind == "mul":
        a, b = rng.randint(2, 30), rng.randint(2, 30)
        return ("Multiply the numbers.", f"{a} times {b}", f"{a} multiplied by {b} is {a * b}.")
    b, q = rng.randint(2, 12), rng.randint(2, 40)
    return (
        "Divide the first number by the second.",
        f"{b * q} by {b}",
        f"{b * q} divided by {b} is {q}, with no remainder.",
    )


def _conversion(rng: random.Random) -> tuple[str, str, str]:
    src, dst, factor = rng.choice(UNITS)
    n = rng.randint(1, 25)
    return (
        f"Convert {src} to {dst}.",
        f"{n} {_plural(n, src)}",
        f"{n} {_plural(n, src)} is {n * factor} {dst}, because one "
        f"{_singular(src)} is {factor} {dst}.",
    )


def _reverse_words(rng: random.Random) -> tuple[str, str, str]:
    words = rng.sample(WORDS, rng.randint(3, 7))
    return (
        "Reverse the order of the words.",
        " ".join(words),
        f"The words in reverse order are: {' '.join(reversed(words))}.",
    )


def _sort_words(rng: random.Random) -> tuple[str, str, str]:
    words = rng.sample(WORDS, rng.randint(3, 7))
    return (
        "Sort these words in alphabetical order.",
        ", ".join(words),
        f"In alphabetical order: {', '.join(sorted(words))}.",
    )


def _capital(rng: random.Random) -> tuple[str, str, str]:
    country, capital, known = rng.choice(COUNTRIES)
    if rng.random() < 0.5:
        return (f"What is the capital of {country}?", "", f"The capital of {country} is {capital}.")
    return (
        f"Tell me one fact about {country}.",
        "",
        f"{country} is known for its {known}, and its capital city is {capital}.",
    )


def _past_tense(rng: random.Random) -> tuple[str, str, str]:
    subject = rng.choice(SUBJECTS)
    present, past = rng.choice(ACTIONS)
    return (
        "Rewrite the sentence in the past tense.",
        f"{subject} {present}.",
        f"{subject} {past}.",
    )


def _question(rng: random.Random) -> tuple[str, str, str]:
    subject = rng.choice(SUBJECTS)
    present, past = rng.choice(ACTIONS)
    base = present.split(" ", 1)
    verb = base[0][:-2] if base[0].endswith("ches") else base[0][:-1]
    return (
        "Turn the sentence into a yes or no question.",
        f"{subject} {present}.",
        f"Does {subject[0].lower() + subject[1:]} {verb} {base[1]}?",
    )


def _count_letter(rng: random.Random) -> tuple[str, str, str]:
    word = rng.choice(WORDS)
    letter = rng.choice(sorted(set(word)) if rng.random() < 0.8 else "xqz")
    n = word.count(letter)
    times = "time" if n == 1 else "times"
    return (
        f"How many times does the letter '{letter}' appear in the word?",
        word,
        f"The letter '{letter}' appears {n} {times} in the word '{word}'.",
    )


def _count_words(rng: random.Random) -> tuple[str, str, str]:
    words = rng.sample(WORDS, rng.randint(2, 9))
    return ("Count the words in the text.", " ".join(words), f"The text has {len(words)} words.")


def _define(rng: random.Random) -> tuple[str, str, str]:
    term, meaning = rng.choice(DEFINITIONS)
    return (f"Give a short definition of {term}.", "", meaning)


def _opposite(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.choice(OPPOSITES)
    if rng.random() < 0.5:
        a, b = b, a
    return ("Give the opposite of the word.", a, f"The opposite of '{a}' is '{b}'.")


def _plural_form(rng: random.Random) -> tuple[str, str, str]:
    one, many = rng.choice(PLURALS)
    return ("Write the plural form of the noun.", one, f"The plural of '{one}' is '{many}'.")


def _largest(rng: random.Random) -> tuple[str, str, str]:
    nums = rng.sample(range(1, 500), rng.randint(3, 7))
    return (
        "Find the largest number in the list.",
        ", ".join(map(str, nums)),
        f"The largest number in the list is {max(nums)}.",
    )


def _even_odd(rng: random.Random) -> tuple[str, str, str]:
    n = rng.randint(1, 9999)
    kind = "even" if n % 2 == 0 else "odd"
    why = (
        "it divides by two with no remainder"
        if kind == "even"
        else "dividing it by two leaves a remainder of one"
    )
    return ("Is the number even or odd?", str(n), f"{n} is {kind}, because {why}.")


def _uppercase(rng: random.Random) -> tuple[str, str, str]:
    words = rng.sample(WORDS, rng.randint(2, 5))
    text = " ".join(words)
    return (
        "Rewrite the text in capital letters.",
        text,
        f"In capital letters it reads: {text.upper()}",
    )


TASKS = [
    _arithmetic,
    _conversion,
    _reverse_words,
    _sort_words,
    _capital,
    _past_tense,
    _question,
    _count_letter,
    _count_words,
    _define,
    _opposite,
    _plural_form,
    _largest,
    _even_odd,
    _uppercase,
]


def alpaca_records(rng: random.Random, n: int) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    while len(out) < n:
        instruction, inp, output = TASKS[len(out) % len(TASKS)](rng)
        if (instruction, inp) in seen and rng.random() < 0.9:
            continue
        seen.add((instruction, inp))
        out.append({"instruction": instruction, "input": inp, "output": output})
    return out


def _user_turn(instruction: str, inp: str) -> str:
    return f"{instruction}\n{inp}" if inp else instruction


FOLLOW_UPS = [
    ("Thanks! Can you say that in one short sentence?", "Sure: {short}"),
    ("Are you sure?", "Yes. {short}"),
    ("Please repeat the answer.", "{short}"),
]


def chat_records(rng: random.Random, n: int) -> list[dict]:
    out: list[dict] = []
    for i in range(n):
        messages: list[dict[str, str]] = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        turns = rng.choice([1, 1, 2, 2, 3])
        for t in range(turns):
            instruction, inp, output = TASKS[(i + 7 * t) % len(TASKS)](rng)
            if t > 0 and rng.random() < 0.3:
                question, template = rng.choice(FOLLOW_UPS)
                previous = messages[-1]["content"]
                messages.append({"role": "user", "content": question})
                messages.append({"role": "assistant", "content": template.format(short=previous)})
                continue
            messages.append({"role": "user", "content": _user_turn(instruction, inp)})
            messages.append({"role": "assistant", "content": output})
        out.append({"messages": messages})
    return out


def _write(path: Path, records: list[dict]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=True) + "\n" for r in records)
    path.write_text(text, encoding="ascii", newline="\n")


def main() -> None:
    _write(HERE / "instructions.jsonl", alpaca_records(random.Random(SEED), N_ALPACA))
    _write(HERE / "chat.jsonl", chat_records(random.Random(SEED + 1), N_CHAT))


if __name__ == "__main__":
    main()
