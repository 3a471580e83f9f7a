"""The 16 short mixed prompts (prose, code, SQL, lists, a question) the whole-engine
scripts decode: ``cpu_invariance_cost.py`` and ``gpu_engine.py``. One list, so their
figures come from the same prompts; the order is part of it (batches take a prefix).

Scripts import it as ``benchmarks.prompts``, so run them from the repository root with
``PYTHONPATH=$PWD`` (benchmarks/README.md).
"""

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "The best way to learn Python is",
    "Water boils at",
    "Dear Sir or Madam,",
    "SELECT * FROM",
    "In 1969, the first",
    "Photosynthesis is the process",
    "To be or not to be,",
    "A haiku about the sea:\n",
    "import numpy as np\n",
    "My favourite colour is",
    "1, 2, 3, 4,",
    "Q: What is 7 times 8?\nA:",
    "The three laws of robotics are",
]
