"""Images as model inputs: safe decoding (`image.py`), where an image may come from
(`media.py`), and the pixel tensors plus placeholder tokens a prompt carries (`inputs.py`)."""
