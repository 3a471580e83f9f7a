"""Texts the quality report scores apart from the held-out sentences (``tts.train.evaluate``).

None of them is a corpus sentence (``tts.train.corpus`` never draws one), so they measure
what a voice does with text it was not trained on: durations and MCD against the teacher.
"""

from __future__ import annotations

# What a voice agent says most often, shorter than almost every teacher sentence:
SHORT_REPLIES = (
    "Hi.",
    "Yes.",
    "No.",
    "Okay.",
    "Sure.",
    "Thank you!",
    "Got it.",
    "Hello there.",
    "Sounds good.",
    "Is that right?",
    "One moment, please.",
    "Goodbye, and have a nice day!",
)
# Everyday agent sentences, in words the templates corpus's few hundred lack:
OPEN_TEXT = (
    "Let me check the weather for you.",
    "The meeting has been moved to Thursday afternoon.",
    "Your package should arrive within three business days.",
    "I'm sorry, I didn't catch that. Could you say it again?",
    "Turn left at the next intersection, then continue straight.",
    "The temperature tomorrow will reach a high of twenty degrees.",
    "Please hold while I transfer your call to a specialist.",
    "Would you like me to set a reminder for this evening?",
)
# Sentences whose content words no corpus kind ever draws (a test checks it): how the
# voice reads words it has never heard.
UNSEEN_WORDS = (
    "The zookeeper handed the giraffe a crunchy carrot.",
    "Grandma knitted a cozy scarf for the puppy.",
    "An astronaut photographed a glowing nebula.",
    "The lifeguard spotted a jellyfish near the pier.",
    "Grandpa adores juicy strawberries with whipped cream.",
    "Our plumber tightened the leaky faucet.",
    "A squirrel buried acorns beneath the oak.",
    "The orchestra rehearsed a symphony by candlelight.",
)
PROBES = {"short_replies": SHORT_REPLIES, "open_text": OPEN_TEXT, "unseen_words": UNSEEN_WORDS}
PROBE_TEXTS = frozenset(t for texts in PROBES.values() for t in texts)
