"""Prompts for ``mmserve bench spec``: four workloads with very different copyability.

edit  - rewrite/copy a paragraph (most of the answer is in the prompt)
code  - write small functions (identifiers and structure repeat)
chat  - open-ended prose (little to copy; speculation must switch itself off)
long  - a long document followed by a question about it (long context)
"""

from __future__ import annotations

PARAGRAPHS = [
    "The river town woke slowly. Fishermen pulled their boats onto the gravel, the baker "
    "opened his shutters, and the old ferry bell rang twice to say the first crossing of the "
    "day would leave on time. Children ran along the harbour wall, counting the gulls.",
    "To install the package, first create a virtual environment, then activate it and run "
    "the installer. If the installer reports a missing compiler, install the build tools for "
    "your platform and try again. Finally, run the test suite to check that everything works.",
    "Our quarterly report shows steady growth in every region. Sales rose by eight percent, "
    "costs fell by three percent, and the new warehouse opened two weeks ahead of schedule. "
    "The board thanks every team for their careful work during a difficult season.",
    "A good recipe for bread needs only flour, water, salt and yeast. Mix them into a soft "
    "dough, knead it for ten minutes, let it rise for an hour, shape the loaf, let it rise "
    "again, and bake it in a hot oven until the crust is brown and sounds hollow.",
]

CODE_TASKS = [
    "Write a Python function that returns the n-th Fibonacci number using a loop.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python class Stack with push, pop and peek methods.",
    "Write a Python function that counts the words in a text file.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python function that converts Celsius to Fahrenheit for a list of values.",
]

CHAT_TOPICS = [
    "Tell me a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are some good habits for staying healthy while working from home?",
    "Describe your ideal weekend in a few sentences.",
    "Why do people enjoy travelling to new places?",
    "Write a short poem about autumn leaves.",
    "Give me three tips for learning a new language.",
]


def _chat(user: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}]


def workload(name: str, count: int) -> list[list[dict[str, str]]]:
    """``count`` conversations of the named workload (cycled from the pools above)."""
    convs = []
    for i in range(count):
        if name == "edit":
            text = PARAGRAPHS[i % len(PARAGRAPHS)]
            convs.append(_chat(f"Repeat the following paragraph exactly, word for word.\n\n{text}"))
        elif name == "code":
            convs.append(_chat(CODE_TASKS[i % len(CODE_TASKS)]))
        elif name == "chat":
            convs.append(_chat(CHAT_TOPICS[i % len(CHAT_TOPICS)]))
        elif name == "long":
            doc = "\n\n".join(PARAGRAPHS[(i + j) % len(PARAGRAPHS)] for j in range(12))
            convs.append(_chat(f"{doc}\n\nSummarise the text above in two sentences."))
        else:
            raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return convs


WORKLOADS = ("edit", "code", "chat", "long")
