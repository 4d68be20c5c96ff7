"""Model backends that implement the pipeline stages (thinker → talker → codec)."""
