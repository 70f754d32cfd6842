"""int8 on the bundled MiniLM: accuracy and speed against ONNX Runtime's dynamic int8.

Four encoders on the same texts, in one process, interleaved (median of `--repeats`), plus
a first pass over texts none of them has seen: this engine in float32 and with
`quantization="int8"`, and ONNX Runtime running the same checkpoint exported to ONNX in
float32 and dynamically quantized to int8 (`onnxruntime.quantization.quantize_dynamic`:
MatMul weights int8 per channel, activations uint8 per tensor at run time; per channel and
MatMul only were its most accurate settings here: min cosine 0.978 / mean 0.990 on 256
texts, against 0.873 / 0.930 with the defaults, and the fastest). Accuracy: each int8 encoder's
cosine to this engine's float32 embedding, minimum and mean over the texts, and the Spearman
correlation of 20,000 random pairs' cosines with float32's (the similarity ranking an STS
score is computed from). The CPU's int8
peak is measured here (`torch._int_mm` on large square GEMMs, as bench_peak does for
float) and the int8 engine's projection work per second is put beside it (a lower bound on
the projections' own rate: the whole run's time counts). Writes results/bench_int8.json.

The int8 path is the one the engine chooses by the CPU's features (VNNI / AMX on oneDNN,
else the C++ AVX2 kernel), printed with the figures. `--avx2` runs as on an AVX2-only CPU
on any x86 CPU, in a child process: where the CPU offers CPUID faulting, under
`avx2_only.py`'s mask (every library, ONNX Runtime included, is told AVX2; the kernel
library built as an install there builds it, unless `--kernels-lib`); elsewhere with oneDNN
capped to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`), the kernel library's x86-64-v3 build and
`VLLM_CPU_INT8_PATH=avx2`, and ONNX Runtime left out (it would use this CPU's VNNI). The int8 peak is then the AVX2 kernel's own on 2048^3.
Writes results/bench_int8_avx2.json.

    python benchmarks/bench_int8.py [--texts 512] [--repeats 5] [--avx2 [--kernels-lib SO]]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile

import vllm  # noqa: F401  (before torch loads: vllm.platforms.process)
import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from common import (block_linear_params, empty_prefix_cache, interleave,  # noqa: E402
                    machine_info, make_texts, median, minilm_dir, write_json)
from onnx_baseline import CACHE, OnnxEmbedder, missing  # noqa: E402

MAX_SEQ = 256


def int8_peak_gops(path: str, size: int = 2048, repeats: int = 5) -> float:
    """Best rate of the int8 GEMM `path` runs (torch._int_mm, or the AVX2 kernel) on
    [size]^3 int8 operands, in GOP/s (2 ops per MAC)."""
    from vllm._kernels.cpu_kernels import int8_gemm_avx2_kernel
    from vllm.model_executor.layers.int8_linear import pack_avx2
    a = torch.randint(-127, 127, (size, size), dtype=torch.int8)
    b = torch.randint(-127, 127, (size, size), dtype=torch.int8)
    if path == "AVX2":
        kernel, ones = int8_gemm_avx2_kernel(), torch.ones(size)
        packed = pack_avx2(b, kernel.block, group=kernel.group)
        mm = lambda: kernel(a, packed, size, ones, ones, None, 0)  # noqa: E731
    else:
        mm = lambda: torch._int_mm(a, b.t())  # noqa: E731
    mm()
    best = min(interleave({"mm": mm}, repeats)["mm"])
    return 2 * size ** 3 / best / 1e9


def avx2_library() -> pathlib.Path:
    """The kernel library built for x86-64-v3 (AVX2) with the project's CMakeLists.txt."""
    root = pathlib.Path(__file__).resolve().parents[1]
    where = pathlib.Path(tempfile.gettempdir()) / "vllm_bench_kernels_avx2"
    for cmd in (["cmake", "-S", str(root), "-B", str(where), "-DCMAKE_BUILD_TYPE=Release",
                 "-DVLLM_CPU_ARCH=x86-64-v3"], ["cmake", "--build", str(where), "-j2"]):
        subprocess.run(cmd, check=True, capture_output=True)
    return where / "libvllm_cpu_kernels.so"


def run_as_avx2(args: argparse.Namespace) -> None:
    """This benchmark again in a child process set up as on an AVX2-only CPU: under
    avx2_only.py's CPUID mask where the CPU offers CPUID faulting (every library, ONNX
    Runtime included, runs its AVX2 code), else with oneDNN capped and ONNX Runtime left out."""
    import avx2_only
    argv = [a for a in sys.argv[1:] if a != "--avx2"] + ["--results-name", "bench_int8_avx2"]
    env = dict(os.environ)
    if args.kernels_lib:
        env["VLLM_CPU_KERNELS_LIB"] = args.kernels_lib
    if avx2_only.supported():
        env = avx2_only.avx2_environment(env)
    else:
        env.setdefault("VLLM_CPU_KERNELS_LIB", str(avx2_library()))
        env.update(ONEDNN_MAX_CPU_ISA="AVX2", VLLM_CPU_INT8_PATH="avx2")
        argv.append("--no-onnx")
    sys.exit(subprocess.run([sys.executable, __file__, *argv], env=env).returncode)


def onnx_int8(model_dir: pathlib.Path, threads: int) -> OnnxEmbedder:
    """ONNX Runtime on the dynamically quantized export (made once, cached)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    base = OnnxEmbedder(model_dir, MAX_SEQ, threads)  # exports the float model if needed
    src = base.path
    dst = CACHE / (src.stem + "_int8_perchannel.onnx")
    if not dst.exists():
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"])
    return OnnxEmbedder(model_dir, MAX_SEQ, threads, path=dst)


F32_ATTENTION = "vllm int8, f32 attn"


def f32_attention(llm):
    """`llm` (int8) with its attention back on the float32 kernel (what
    VLLM_CPU_INT8_BF16_ATTENTION=0 gives): the same-run A/B of the default bf16 attention."""
    from vllm.model_executor.layers.attention import Attention
    for layer in llm.llm_engine.runner.model.modules():
        if isinstance(layer, Attention):
            layer.bf16_ok = layer.bf16_pv = False
    return llm


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def ranking_spearman(emb, ref, pairs: np.ndarray) -> float:
    """Spearman correlation of the pairs' cosines under `emb` and under `ref`: how well an
    encoder keeps float32's similarity ranking, which is what an STS score measures."""
    from scipy.stats import spearmanr
    sim = lambda e: cosines(e[pairs[:, 0]], e[pairs[:, 1]])  # noqa: E731
    return float(spearmanr(sim(np.asarray(emb)), sim(np.asarray(ref))).statistic)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32, help="ONNX Runtime's batch")
    ap.add_argument("--avx2", action="store_true", help="run as on an AVX2-only CPU (above)")
    ap.add_argument("--kernels-lib", help="--avx2: this x86-64-v3 kernel build")
    ap.add_argument("--no-onnx", action="store_true", help="leave ONNX Runtime out")
    ap.add_argument("--results-name", default="bench_int8", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.avx2:
        return run_as_avx2(args)
    out_name = args.results_name
    from transformers import AutoModel
    from vllm import LLM
    from vllm._kernels.cpu_kernels import cpu_flags
    from vllm.platforms import current_platform
    from vllm.platforms.cpu import INT8_FLAGS
    try:
        path, why = current_platform.int8_path()
    except ValueError as exc:
        print(f"skip: {exc}")
        write_json(out_name, {"skipped": str(exc)})
        return
    model_dir = minilm_dir()
    threads = torch.get_num_threads()
    texts = make_texts(args.texts, 8, 200, seed=0)
    fresh = make_texts(args.texts, 8, 200, seed=1)
    engines = {"vllm float32": LLM(str(model_dir)),
               "vllm int8": LLM(str(model_dir), quantization="int8")}
    from vllm._kernels.cpu_kernels import varlen_attention_bf16_kernel
    if varlen_attention_bf16_kernel() is not None:
        # same-run A/B: int8 with float32 attention (the default there is bf16 attention)
        engines[F32_ATTENTION] = f32_attention(LLM(str(model_dir), quantization="int8"))
    encoders = {name: (lambda batch, llm=llm: np.array(
        [o.outputs.embedding for o in llm.embed(batch, use_tqdm=False)]))
        for name, llm in engines.items()}
    if args.no_onnx:
        print("onnxruntime baselines left out (--no-onnx)")
    elif missing():
        print(f"onnxruntime baselines skipped: no {missing()} (pip install -e .[bench])")
    else:
        for name, ort in (("onnxruntime float32", OnnxEmbedder(model_dir, MAX_SEQ, threads)),
                          ("onnxruntime int8", onnx_int8(model_dir, threads))):
            encoders[name] = lambda batch, ort=ort: ort.encode(batch, args.batch_size)

    def run(name, batch):
        if name in engines:
            empty_prefix_cache(engines[name])
        return encoders[name](batch)

    first = interleave({name: (lambda n=name: run(n, fresh)) for name in encoders}, 1)
    ref = run("vllm float32", texts)
    outputs = {name: run(name, texts) for name in encoders}
    accuracy = {name: cosines(out, ref) for name, out in outputs.items()}
    pairs = np.random.default_rng(0).integers(0, len(texts), (20000, 2))
    times = interleave({name: (lambda n=name: run(n, texts)) for name in encoders},
                       args.repeats)
    tok = engines["vllm float32"].get_tokenizer()
    n_tok = sum(len(ids) for ids in tok(texts, truncation=True, max_length=MAX_SEQ)["input_ids"])
    bert = AutoModel.from_pretrained(str(model_dir))
    proj_ops = 2 * block_linear_params(bert.encoder) * n_tok
    peak = int8_peak_gops(path)
    rows = {}
    for name in encoders:
        sec = median(times[name])
        rows[name] = {"texts_per_s": len(texts) / sec,
                      "first_pass_texts_per_s": len(fresh) / first[name][0],
                      "min_cosine_vs_float32": float(accuracy[name].min()),
                      "mean_cosine_vs_float32": float(accuracy[name].mean()),
                      "similarity_rank_spearman": ranking_spearman(outputs[name], ref, pairs)}
    rows["vllm int8"]["projection_gops_lower_bound"] = \
        proj_ops / median(times["vllm int8"]) / 1e9
    print(f"CPU: {machine_info()['processor']}, {threads} threads; int8 flags: "
          f"{', '.join(INT8_FLAGS[f] for f in sorted(cpu_flags() & set(INT8_FLAGS)))}; "
          f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}; int8 path "
          f"{path} ({why}); int8 peak ({'AVX2 kernel' if path == 'AVX2' else 'torch._int_mm'}"
          f" 2048^3) {peak:.0f} GOP/s")
    print(f"{len(texts)} texts, {n_tok} tokens, {args.repeats} interleaved repeats")
    print(f"{'encoder':<22} {'texts/s':>8} {'first pass':>11} {'min cos':>9} {'mean cos':>9} "
          f"{'sim. rank rho':>13}")
    for name, r in rows.items():
        print(f"{name:<22} {r['texts_per_s']:>8.1f} {r['first_pass_texts_per_s']:>11.1f} "
              f"{r['min_cosine_vs_float32']:>9.5f} {r['mean_cosine_vs_float32']:>9.5f} "
              f"{r['similarity_rank_spearman']:>13.5f}")
    q = rows["vllm int8"]
    line = (f"int8 / float32: {q['texts_per_s'] / rows['vllm float32']['texts_per_s']:.2f}x; "
            f"projections >= {q['projection_gops_lower_bound']:.0f} GOP/s "
            f"({100 * q['projection_gops_lower_bound'] / peak:.0f}% of the int8 peak)")
    if F32_ATTENTION in rows:
        b = rows[F32_ATTENTION]
        line += (f"; bf16 attention vs float32 attention {q['texts_per_s'] / b['texts_per_s']:.3f}x"
                 f", min cos {b['min_cosine_vs_float32']:.5f} -> {q['min_cosine_vs_float32']:.5f}")
    if "onnxruntime int8" in rows:
        o = rows["onnxruntime int8"]
        line += (f"; vs onnxruntime int8 {q['texts_per_s'] / o['texts_per_s']:.2f}x "
                 f"(first pass {q['first_pass_texts_per_s'] / o['first_pass_texts_per_s']:.2f}x)")
    print(line)
    write_json(out_name, {"machine": machine_info(), "texts": len(texts), "tokens": n_tok,
                          "repeats": args.repeats, "int8_path": path, "int8_path_why": why,
                          "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
                          "int8_peak_gops": peak, "rows": rows})


if __name__ == "__main__":
    main()
