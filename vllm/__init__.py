"""A vLLM-compatible inference engine for pooling models."""
from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.llm import LLM
from vllm.outputs import (ClassificationOutput, ClassificationRequestOutput, EmbeddingOutput,
                          EmbeddingRequestOutput, PoolingOutput, PoolingRequestOutput,
                          ScoringOutput, ScoringRequestOutput)
from vllm.pooling_params import PoolingParams
from vllm.version import __version__

__all__ = ["LLM", "EngineArgs", "PoolingParams", "PoolingOutput", "PoolingRequestOutput",
           "EmbeddingOutput", "EmbeddingRequestOutput", "ClassificationOutput",
           "ClassificationRequestOutput", "ScoringOutput", "ScoringRequestOutput",
           "__version__"]
