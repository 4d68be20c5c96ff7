"""The embedded thinker: a llama-type GGUF model run by ONNX Runtime, no compiler needed.

``model_file`` finds (or fetches) the file, ``gguf_weights`` reads it, ``graph`` builds the decoder graph, ``tokenizer`` rebuilds the
tokenizer, ``runtime`` runs the graph with a cache per conversation, ``sampling`` picks tokens
and ``thinker`` renders conversations and streams replies and function calls.
"""

from .model_file import ModelFileError, locate_model_file
from .thinker import LlamaThinker, LlamaThinkerModel

__all__ = ["LlamaThinker", "LlamaThinkerModel", "ModelFileError", "locate_model_file"]
