"""Speech: streaming codecs, codec-LM voices served by the engine, and their frontends.

- ``tts.codec``: the streaming codec contract (frames of codes in, PCM out as they arrive,
  per-stream state apart from the weights); ``tts.slots`` pools stream states so many
  streams decode in one batched call.
- ``tts.snac``: SNAC 24 kHz (the codec Orpheus speaks through), whole and streaming.

Nothing here imports ``mmserve.server``.
"""
