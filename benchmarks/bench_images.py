"""Images (issue 24 item 5), on seeded random checkpoints of real shapes:

1. CLIP ViT-B/32 image embeddings per second: this engine (`LLM.embed` of image prompts)
   vs sentence-transformers' CLIP (`SentenceTransformer.encode` of the same PIL images),
   and the largest cosine distance between the two.
2. The rerank shape on a Qwen2-VL reranker (jina-reranker-m0's layout): one document image
   scored against many queries, prefix caching on vs off (the template puts the document
   first, so with caching its tokens are computed once; the vision tower runs once either
   way, its output kept by content hash).

    python benchmarks/bench_images.py [--images 64] [--queries 32]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "tests"))
from common import write_json  # noqa: E402

import torch  # noqa: E402

import mm_models as mm  # noqa: E402
from vllm import LLM  # noqa: E402


def build_clip_b32(path: pathlib.Path) -> pathlib.Path:
    """CLIPModel with ViT-B/32's vision tower (768 wide, 12 layers, 224 px, patch 32)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    torch.manual_seed(0)
    text = dict(vocab_size=mm.BERT_VOCAB, hidden_size=512, intermediate_size=2048,
                num_hidden_layers=2, num_attention_heads=8, max_position_embeddings=77,
                eos_token_id=mm.SEP_ID)
    vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                  num_attention_heads=12, image_size=224, patch_size=32)
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=512)) \
        .save_pretrained(str(path))
    mm.save_bert_tokenizer(path, model_input_names=["input_ids", "attention_mask"])
    CLIPImageProcessor().save_pretrained(str(path))
    return path


def best_rate(fn, count: int, repeats: int = 3) -> float:
    import time
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return count / best


def clip_images(root: pathlib.Path, n: int) -> dict:
    from sentence_transformers import SentenceTransformer
    path = build_clip_b32(root / "clip")
    images = [mm.picture(i, (320, 240)) for i in range(n)]
    llm = LLM(str(path))
    st = SentenceTransformer(str(path), device="cpu")
    prompts = [{"prompt": "", "multi_modal_data": {"image": img}} for img in images]
    ours = llm.embed(prompts, use_tqdm=False)  # warm-up, and the parity check
    theirs = torch.nn.functional.normalize(torch.as_tensor(st.encode(images)), dim=-1)
    cos = [float(torch.as_tensor(o.outputs.embedding) @ t) for o, t in zip(ours, theirs)]
    return {"images": n, "engine_images_per_s": best_rate(
                lambda: llm.embed(prompts, use_tqdm=False), n),
            "sentence_transformers_images_per_s": best_rate(
                lambda: st.encode(images, batch_size=32), n),
            "min_cosine_vs_sentence_transformers": min(cos)}


def shared_document(root: pathlib.Path, queries: int) -> dict:
    base = mm.make_qwen2_vl(
        root / "qwen2_vl", text=dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                                     num_attention_heads=8, num_key_value_heads=2,
                                     rope_parameters={"rope_type": "default",
                                                      "rope_theta": 1e6,
                                                      "mrope_section": [8, 12, 12]}),
        vision=dict(depth=4, embed_dim=256, hidden_size=512, num_heads=4, patch_size=14),
        pixels=dict(patch_size=14, max_pixels=448 * 448, min_pixels=28 * 28))
    path = mm.make_jina_reranker(root / "jina", base, hidden=512)
    doc = {"prompt": "", "multi_modal_data": {"image": mm.picture(7, (448, 448))}}  # 256 tokens
    texts = [f"query {i}: " + " ".join(mm.TEXTS) for i in range(queries)]
    out = {"queries": queries}
    for caching in (True, False):
        llm = LLM(str(path), enable_prefix_caching=caching)
        llm.score(texts, [doc] * queries, use_tqdm=False)
        llm.reset_prefix_cache()
        out[f"pairs_per_s_caching_{'on' if caching else 'off'}"] = best_rate(
            lambda: (llm.reset_prefix_cache(), llm.score(texts, [doc] * queries,
                                                         use_tqdm=False)), queries)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--queries", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        result = {"clip": clip_images(root, args.images),
                  "shared_document_image": shared_document(root, args.queries)}
    print(result)
    write_json("bench_images", result)


if __name__ == "__main__":
    main()
