"""Hugging Face TEI's gRPC service (tei.v1) beside the HTTP server: `vllm serve --grpc-port`.

Nothing here imports grpcio until the service starts (stubs.py, server.py), so the engine
and its HTTP server run without the `grpc` extra."""
