"""The demo's chat dataset: procedural, deterministic per seed, with learnable structure.

Sums with their answers, capitals, unit conversions, spelling, counting, colours, definitions,
sorting and chit-chat, in 1-3 turns, about half ShareGPT-style and half OpenAI-style rows, so
that a small target trained on them carries signal and prepare sees both formats.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

def write_demo_chats(path: Path, *, num_conversations: int, seed: int = 0) -> int:
    """Write `num_conversations` chats as JSONL, about half ShareGPT-style and half OpenAI-style rows."""
    if num_conversations < 1:
        raise ValueError(f"num_conversations must be at least 1, got {num_conversations}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for i in range(num_conversations):
            messages = _conversation(rng)
            f.write(json.dumps(_as_row(f"demo-{i:05d}", messages, sharegpt=rng.random() < 0.5)) + "\n")
    tmp.replace(path)
    return num_conversations


def read_chat_messages(path: Path) -> list[list[dict]]:
    """Both row styles as lists of {"role", "content"}; what the demo tokenizer and model see."""
    sharegpt_roles = {"human": "user", "gpt": "assistant", "system": "system"}
    chats = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                if "messages" in row:
                    chats.append([{"role": m["role"], "content": m["content"]} for m in row["messages"]])
                else:
                    chats.append([{"role": sharegpt_roles[t["from"]], "content": t["value"]} for t in row["conversations"]])
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a demo chat row ({exc!r})") from None
    return chats


def _as_row(row_id: str, messages: list[dict], *, sharegpt: bool) -> dict:
    if not sharegpt:
        return {"id": row_id, "messages": messages}
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    return {"id": row_id, "conversations": [{"from": names[m["role"]], "value": m["content"]} for m in messages]}



_CAPITALS = dict(pair.split(":") for pair in (
    "France:Paris Germany:Berlin Italy:Rome Spain:Madrid Portugal:Lisbon Japan:Tokyo China:Beijing "
    "India:New_Delhi Egypt:Cairo Kenya:Nairobi Canada:Ottawa Mexico:Mexico_City Brazil:Brasilia "
    "Argentina:Buenos_Aires Peru:Lima Chile:Santiago Norway:Oslo Sweden:Stockholm Finland:Helsinki "
    "Poland:Warsaw Greece:Athens Turkey:Ankara Russia:Moscow Australia:Canberra Ireland:Dublin "
    "Austria:Vienna Belgium:Brussels Netherlands:Amsterdam Denmark:Copenhagen Hungary:Budapest "
    "Thailand:Bangkok Vietnam:Hanoi Nigeria:Abuja Ghana:Accra Morocco:Rabat Cuba:Havana Iceland:Reykjavik"
).split())
_COLOURS = dict(pair.split(":") for pair in (
    "banana:yellow lemon:yellow sky:blue grass:green snow:white coal:black tomato:red strawberry:red "
    "carrot:orange pumpkin:orange leaf:green ocean:blue cherry:red lime:green milk:white crow:black "
    "eggplant:purple plum:purple sunflower:yellow chocolate:brown"
).split())
_DEFINITIONS = {
    "river": "a large natural stream of water flowing to the sea or a lake", "island": "a piece of land surrounded by water",
    "planet": "a large body in space that moves around a star", "verb": "a word that describes an action or a state",
    "noun": "a word that names a person, place or thing", "triangle": "a shape with three straight sides",
    "square": "a shape with four equal sides and four right angles", "desert": "a dry area of land with very little rain",
    "library": "a place where books are kept for people to read or borrow", "recipe": "a set of instructions for making a dish",
    "bridge": "a structure that carries a road or path across a river or valley", "engine": "a machine that turns energy into motion",
    "volcano": "a mountain that can erupt with lava and ash", "orchestra": "a large group of musicians playing together",
    "calendar": "a chart that shows the days, weeks and months of a year",
}
_WORDS = ("apple house river green table window garden music paper light stone water bread cloud orange "
          "yellow friend school summer winter pencil rabbit candle silver forest bottle basket castle dragon "
          "rocket planet button pillow ladder mirror jacket butter copper finger island kitten lemon market "
          "needle ocean parrot puzzle rainbow saddle tiger turtle violin wallet wizard zebra anchor blanket "
          "cactus dolphin feather guitar hammer igloo jungle kettle lantern meadow").split()
_SOUNDS = dict(pair.split(":") for pair in (
    "cow:moo dog:woof cat:meow duck:quack sheep:baa pig:oink owl:hoot lion:roar horse:neigh bee:buzz "
    "frog:croak snake:hiss mouse:squeak rooster:cock-a-doodle-doo donkey:hee-haw goat:bleat").split())
_UNITS = [("kilometres", "metres", 1000), ("metres", "centimetres", 100), ("kilograms", "grams", 1000),
          ("hours", "minutes", 60), ("minutes", "seconds", 60), ("litres", "millilitres", 1000),
          ("days", "hours", 24), ("weeks", "days", 7)]
_NUMBER_WORDS = "zero one two three four five six seven eight nine ten eleven twelve".split()
_SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a concise assistant. Answer briefly.",
                   "You are a friendly tutor who answers clearly."]


def _arithmetic(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op, result = rng.choice([("+", a + b), ("-", a - b), ("*", a * b)]) if a < 13 and b < 13 else rng.choice([("+", a + b), ("-", a - b)])
    ask = rng.choice(["What is {a} {op} {b}?", "Calculate {a} {op} {b}.", "Can you work out {a} {op} {b}?", "{a} {op} {b} = ?"])
    return ask.format(a=a, op=op, b=b), rng.choice(["{a} {op} {b} = {r}.", "The answer is {r}.", "{r}"]).format(a=a, op=op, b=b, r=result)


def _capital(rng: random.Random) -> tuple[str, str]:
    country = rng.choice(sorted(_CAPITALS))
    city = _CAPITALS[country].replace("_", " ")
    ask = rng.choice(["What is the capital of {c}?", "Which city is the capital of {c}?", "Name the capital of {c}."])
    return ask.format(c=country), rng.choice(["The capital of {c} is {x}.", "{x} is the capital of {c}."]).format(c=country, x=city)


def _convert(rng: random.Random) -> tuple[str, str]:
    big, small, factor = rng.choice(_UNITS)
    n = rng.randint(1, 12)
    ask = rng.choice(["How many {s} are in {n} {b}?", "Convert {n} {b} to {s}.", "{n} {b} is how many {s}?"])
    return ask.format(n=n, b=big, s=small), f"{n} {big} is {n * factor} {small}."


def _spell(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(_WORDS)
    kind = rng.randrange(3)
    if kind == 0:
        return rng.choice(["Spell the word {w}.", "How do you spell {w}?"]).format(w=word), f"{word} is spelled {'-'.join(word)}."
    if kind == 1:
        return rng.choice(["Reverse the word {w}.", "Write {w} backwards."]).format(w=word), f"{word} reversed is {word[::-1]}."
    return f"How many letters are in the word {word}?", f"The word {word} has {len(word)} letters."


def _count(rng: random.Random) -> tuple[str, str]:
    start = rng.randint(1, 20)
    stop = start + rng.randint(3, 9)
    if rng.random() < 0.3:
        return f"Count down from {stop} to {start}.", ", ".join(str(i) for i in range(stop, start - 1, -1)) + "."
    return rng.choice(["Count from {a} to {b}.", "List the numbers from {a} to {b}."]).format(a=start, b=stop), \
        ", ".join(str(i) for i in range(start, stop + 1)) + "."


def _lookup(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(3)
    if kind == 0:
        thing = rng.choice(sorted(_COLOURS))
        ask = rng.choice(["What colour is the {t}?", "What color is the {t} usually?", "Tell me the colour of the {t}."])
        return ask.format(t=thing), f"The {thing} is usually {_COLOURS[thing]}."
    if kind == 1:
        animal = rng.choice(sorted(_SOUNDS))
        ask = rng.choice(["What sound does {a} {t} make?", "What does {a} {t} say?"])
        return ask.format(a=_a(animal), t=animal), f"{_a(animal).title()} {animal} says {_SOUNDS[animal]}."
    word = rng.choice(sorted(_DEFINITIONS))
    ask = rng.choice(["What is {a} {w}?", "Define the word {w}.", "What does {w} mean?"])
    return ask.format(a=_a(word), w=word), f"{_a(word).title()} {word} is {_DEFINITIONS[word]}."


def _a(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _neighbour(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(1, 998)
    if rng.random() < 0.5:
        return rng.choice(["What number comes after {n}?", "What is one more than {n}?"]).format(n=n), f"The number after {n} is {n + 1}."
    return rng.choice(["What number comes before {n}?", "What is one less than {n}?"]).format(n=n), f"The number before {n} is {n - 1}."


def _sort(rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        items = rng.sample(range(1, 100), rng.randint(3, 6))
        asc = rng.random() < 0.7
        return (f"Sort these numbers in {'ascending' if asc else 'descending'} order: {', '.join(map(str, items))}.",
                ", ".join(map(str, sorted(items, reverse=not asc))) + ".")
    items = rng.sample(_WORDS, rng.randint(3, 5))
    return f"Put these words in alphabetical order: {', '.join(items)}.", ", ".join(sorted(items)) + "."


def _chit_chat(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(0, 12)
    return rng.choice([
        ("Hello!", "Hello! How can I help you today?"),
        ("Hi there, how are you?", "I am doing well, thank you. What can I do for you?"),
        ("Thank you!", "You are welcome. Is there anything else you need?"),
        ("Thanks for the help.", "Happy to help. Have a nice day!"),
        ("Good morning.", "Good morning! What would you like to know?"),
        ("Goodbye.", "Goodbye! Take care."),
        (f"Write the number {n} in words.", f"{n} in words is {_NUMBER_WORDS[n]}."),
        (f"Is {n} even or odd?", f"{n} is {'even' if n % 2 == 0 else 'odd'}."),
    ])


# Weights keep each kind of exchange frequent enough to be learnt in a few hundred steps.
_TASKS = [_arithmetic, _capital, _convert, _spell, _count, _lookup, _lookup, _neighbour, _sort, _chit_chat]


def _conversation(rng: random.Random) -> list[dict]:
    messages = [{"role": "system", "content": rng.choice(_SYSTEM_PROMPTS)}] if rng.random() < 0.3 else []
    for _ in range(rng.choice([1, 1, 2, 2, 3])):
        ask, answer = rng.choice(_TASKS)(rng)
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": answer}]
    return messages
