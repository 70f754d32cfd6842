"""`vllm run-batch`: upstream's OpenAI batch-file format (JSONL requests in, JSONL answers
out) and Parquet corpora, run locally or sharded over Ray Data actors."""
