"""Vision connectors: frozen timm encoder + trainable projector into the LM embedding space.

Empty until its issue lands; nothing here pretends to work.
"""
