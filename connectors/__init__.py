"""Vision connectors: images -> prompt tokens + embeddings in an LM's input space.

- ``connectors.image_source``: untrusted bytes / data: URLs / files -> validated RGB images.
- ``connectors.base``: the interfaces (``ImageProcessor``, ``Connector``) and the data
  they exchange (``PreparedImage``, ``ImageTokens``).
- ``connectors.prompt``: rendered prompt text + prepared images -> ids + engine spans.
"""

from connectors.base import Connector, ImageProcessor, ImageTokens, PreparedImage
from connectors.image_source import ImageError, ImageErrorKind, ImageLimits, load_image
from connectors.prompt import IMAGE_MARKER, ImagePrompt, splice_images

__all__ = [
    "Connector",
    "ImageProcessor",
    "ImageTokens",
    "PreparedImage",
    "ImageError",
    "ImageErrorKind",
    "ImageLimits",
    "load_image",
    "IMAGE_MARKER",
    "ImagePrompt",
    "splice_images",
]
