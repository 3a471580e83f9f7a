"""Speech: codec-LM backbone adapter and streaming codec decoder.

Empty until its issue lands; nothing here pretends to work.
"""
