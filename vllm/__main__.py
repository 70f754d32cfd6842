"""`python -m vllm ...` is the `vllm` command."""
from vllm.entrypoints.cli.main import main

if __name__ == "__main__":
    main()
