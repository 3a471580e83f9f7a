"""Streaming chat with the ``openai`` SDK against a local ``mmserve serve``.

    mmserve serve &                       # http://127.0.0.1:8000
    python demos/chat_stream.py "Tell me about llamas."
    python demos/chat_stream.py --base-url http://host:8000/v1 --api-key KEY

Without a prompt argument it keeps a conversation going on standard input.
"""

from __future__ import annotations

import argparse
import os
import sys

from openai import OpenAI


def stream_reply(
    client: OpenAI, model: str, messages: list[dict[str, str]], max_tokens: int, temperature: float
) -> str:
    """Print the assistant's reply as it streams; return it whole."""
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,  # type: ignore[arg-type]
        temperature=temperature,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts: list[str] = []
    for chunk in stream:
        for choice in chunk.choices:
            piece = choice.delta.content or ""
            parts.append(piece)
            print(piece, end="", flush=True)
        if chunk.usage is not None:
            print(flush=True)
            print(
                f"[{chunk.usage.prompt_tokens} prompt + "
                f"{chunk.usage.completion_tokens} generated tokens]",
                file=sys.stderr,
            )
    return "".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("prompt", nargs="?", help="one question; omit for an interactive chat")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default=os.environ.get("MMSERVE_API_KEY", "none"))
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--system", default=None, help="system prompt")
    args = parser.parse_args()

    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = args.model or client.models.list().data[0].id
    messages = [{"role": "system", "content": args.system}] if args.system else []
    if args.prompt:
        messages.append({"role": "user", "content": args.prompt})
        stream_reply(client, model, messages, args.max_tokens, args.temperature)
        return 0
    print(f"chatting with {model} at {args.base_url}; an empty line quits", file=sys.stderr)
    while line := _read_line():
        messages.append({"role": "user", "content": line})
        reply = stream_reply(client, model, messages, args.max_tokens, args.temperature)
        messages.append({"role": "assistant", "content": reply})
    return 0


def _read_line() -> str:
    """The next user line; end of input (Ctrl-D, a closed pipe) quits like an empty line."""
    try:
        return input("> ").strip()
    except EOFError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
