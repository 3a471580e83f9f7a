"""A text conversation over the OpenAI Realtime protocol, with the ``openai`` SDK.

    mmserve serve &
    python demos/realtime_text.py "Give me three tips for a picnic." "And one for rain?"
    python demos/realtime_text.py --base-url http://host:8000/v1 --api-key KEY "Hi"

Each argument is one user turn; the model's answer streams from
``response.output_text.delta`` events until ``response.done``. The socket and its
conversation are kept across turns, so later turns see the earlier ones.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from openai import AsyncOpenAI


async def converse(
    base_url: str, api_key: str, model: str | None, turns: list[str], max_output_tokens: int
) -> None:
    client = AsyncOpenAI(
        base_url=base_url, api_key=api_key, websocket_base_url=base_url.replace("http", "ws", 1)
    )
    model = model or (await client.models.list()).data[0].id
    async with client.realtime.connect(model=model) as conn:
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["text"],
                "instructions": "You are brief and friendly.",
            }
        )
        for turn in turns:
            print(f"> {turn}")
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": turn}],
                }
            )
            await conn.response.create(response={"max_output_tokens": max_output_tokens})
            async for event in conn:
                if event.type == "response.output_text.delta":
                    print(event.delta, end="", flush=True)
                elif event.type == "error":
                    print(f"\n[error] {event.error.message}", file=sys.stderr)
                elif event.type == "response.done":
                    usage = event.response.usage
                    tokens = usage.output_tokens if usage else "?"
                    print(flush=True)
                    print(f"[{event.response.status}, {tokens} tokens]", file=sys.stderr)
                    break


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "turns", nargs="*", default=["Hello! Who are you?"], help="user turns, in order"
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default=os.environ.get("MMSERVE_API_KEY", "none"))
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--max-output-tokens", type=int, default=128)
    args = parser.parse_args()
    asyncio.run(
        converse(args.base_url, args.api_key, args.model, args.turns, args.max_output_tokens)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
