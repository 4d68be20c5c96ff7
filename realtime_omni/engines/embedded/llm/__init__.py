"""The embedded thinker: a llama-type GGUF model run by ONNX Runtime, no compiler needed.

``gguf_weights`` reads the file, ``graph`` builds the decoder graph, ``tokenizer`` rebuilds the
tokenizer, ``runtime`` runs the graph with a cache per conversation, ``sampling`` picks tokens
and ``thinker`` renders conversations and streams replies and function calls.
"""

from .thinker import LlamaThinker, LlamaThinkerModel, default_model_path

__all__ = ["LlamaThinker", "LlamaThinkerModel", "default_model_path"]
