"""A voice agent's turn over the OpenAI Realtime protocol: text in, a spoken answer out.

    mmserve serve &                       # the default voice speaks the answers
    python demos/voice_agent.py "What is the capital of France?" --out answer.wav
    python demos/voice_agent.py --base-url http://host:8000/v1 --api-key KEY "Hi"

The ``openai`` SDK's realtime client asks for audio (pcm16, 24 kHz) in the voice
``alloy``; the answer's transcript prints as it is spoken, its audio deltas are
collected and saved as a WAV, and the time from ``response.create`` to the first audio
is printed (the answer is spoken while it is still being written).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import time
import wave

from openai import AsyncOpenAI

RATE = 24000


async def speak(
    base_url: str,
    api_key: str,
    model: str | None,
    question: str,
    out: str,
    voice: str,
    max_output_tokens: int,
) -> float:
    """Ask ``question``; save the spoken answer to ``out`` -> seconds of audio saved."""
    client = AsyncOpenAI(
        base_url=base_url, api_key=api_key, websocket_base_url=base_url.replace("http", "ws", 1)
    )
    model = model or (await client.models.list()).data[0].id
    pcm = bytearray()
    async with client.realtime.connect(model=model) as conn:
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "instructions": "You are a helpful voice assistant. Answer in two sentences.",
                "audio": {
                    "output": {"voice": voice, "format": {"type": "audio/pcm", "rate": RATE}}
                },
            }
        )
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": question}],
            }
        )
        start = time.monotonic()
        await conn.response.create(response={"max_output_tokens": max_output_tokens})
        first: float | None = None
        async for event in conn:
            if event.type == "response.output_audio.delta":
                first = first if first is not None else time.monotonic() - start
                pcm += base64.b64decode(event.delta)
            elif event.type == "response.output_audio_transcript.delta":
                print(event.delta, end="", flush=True)
            elif event.type == "error":
                print(f"\n[error] {event.error.message}", file=sys.stderr)
            elif event.type == "response.done":
                print(flush=True)
                print(
                    f"[{event.response.status}; first audio after "
                    f"{'-' if first is None else f'{first * 1000:.0f} ms'}]",
                    file=sys.stderr,
                )
                break
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(bytes(pcm))
    seconds = len(pcm) / 2 / RATE
    print(f"[saved {seconds:.2f} s of audio to {out}]", file=sys.stderr)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("question", nargs="?", default="What is the capital of France?")
    parser.add_argument("--out", default="answer.wav", help="the WAV to write")
    parser.add_argument("--voice", default="alloy")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default=os.environ.get("MMSERVE_API_KEY", "none"))
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--max-output-tokens", type=int, default=96)
    args = parser.parse_args()
    seconds = asyncio.run(
        speak(
            args.base_url,
            args.api_key,
            args.model,
            args.question,
            args.out,
            args.voice,
            args.max_output_tokens,
        )
    )
    return 0 if seconds > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
