"""Ask a local ``mmserve serve`` about an image, with the ``openai`` SDK.

    mmserve serve &                       # serves the default connector too
    python demos/describe_image.py photo.png "What is in this image?"
    python demos/describe_image.py --generated 7     # a generated test image the default knows

The image travels inline as a ``data:`` URL (the server accepts remote URLs and local
paths only when started with ``--allow-remote-images`` / ``--allowed-local-media-path``).
"""

from __future__ import annotations

import argparse
import base64
import io
import mimetypes
import os
import sys

from openai import OpenAI


def data_url(path: str | None, generated: int | None) -> str:
    if generated is not None:
        from connectors.synthetic import sample

        img, scene = sample("test", generated)
        print(f"(generated test image {generated}: {scene.caption()})", file=sys.stderr)
        buf = io.BytesIO()
        img.save(buf, "PNG")
        data, mime = buf.getvalue(), "image/png"
    else:
        assert path is not None
        with open(path, "rb") as fh:
            data = fh.read()
        mime = mimetypes.guess_type(path)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("image", nargs="?", help="an image file")
    ap.add_argument("question", nargs="?", default="Describe the image.")
    ap.add_argument("--generated", type=int, default=None, help="use generated test image N")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default=os.environ.get("MMSERVE_API_KEY", "unused"))
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    if args.image is None and args.generated is None:
        ap.error("give an image file or --generated N")
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model,
        temperature=0,
        max_tokens=args.max_tokens,
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {"url": data_url(args.image, args.generated)},
                    },
                    {"type": "text", "text": args.question},
                ],
            }
        ],
    )
    print(reply.choices[0].message.content)
    usage = reply.usage
    if usage is not None and usage.prompt_tokens_details is not None:
        print(
            f"({usage.prompt_tokens} prompt tokens, of which "
            f"{getattr(usage.prompt_tokens_details, 'image_tokens', '?')} image)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
