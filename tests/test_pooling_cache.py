"""Issue 27: exact chunked prefill and prefix caching for CLS / MEAN / ALL / STEP pooling
on causal models, when the user asks for them.

Every answer is checked against Transformers one prompt at a time (float32): odd token
budgets that split prompts mid-block, shuffled prompts sharing prefixes of several
lengths, exact duplicates, a second pass that must report its cached tokens, a KV pool
small enough to evict, STEP tags inside and outside a shared prefix, and MEAN with a
sentence-transformers prompt left out of pooling (include_prompt false), whose blocks
must never be shared with the same tokens pooled in full. Prompts are token ids (the
Qwen BPE fixtures: ids 4..479 are ordinary tokens), so lengths and prefixes are exact.
"""
from __future__ import annotations

import json
import random

import pytest
import torch

import model_factory as mf
from vllm import LLM
from vllm.attention.metadata import token_slots
from vllm.model_executor.layers.pool_state import (BlockPayloadStore, RequestPoolState,
                                                   pool_position)
from vllm.pooling_params import PoolingParams

BLOCK = 16
TOL = 1e-4
ON = dict(enable_prefix_caching=True, enable_chunked_prefill=True, block_size=BLOCK)


def _ids(rng: random.Random, n: int, avoid: int = -1) -> list[int]:
    out = []
    while len(out) < n:
        t = rng.randrange(4, 480)
        if t != avoid:
            out.append(t)
    return out


def _shared_prefix_batch(seed: int) -> list[list[int]]:
    """Prompts around shared prefixes of 150, 101 and 40 tokens (a partial block), strict
    prefixes, an exact duplicate and unrelated prompts, shuffled."""
    rng = random.Random(seed)
    p1, p2, p3 = _ids(rng, 150), _ids(rng, 101), _ids(rng, 40)
    prompts = [p1 + _ids(rng, n) for n in (7, 50, 150)]          # 157, 200, 300
    prompts += [p1[:128], p1[:113] + _ids(rng, 30)]              # strict prefixes
    prompts += [p2 + _ids(rng, n) for n in (20, 99)]             # 121, 200
    prompts += [p3 + _ids(rng, n) for n in (1, 9, 60)]           # 41, 49, 100
    prompts += [_ids(rng, 111), _ids(rng, 3)]                    # unrelated
    prompts.append(list(prompts[1]))                             # exact duplicate
    rng.shuffle(prompts)
    return prompts


def _reference(model_dir: str, pooling: str, ids: list[int]) -> torch.Tensor:
    hs = mf.hf_hidden_states(model_dir, ids)
    return {"MEAN": hs.mean(0), "CLS": hs[0], "ALL": hs}[pooling]


def _outputs(llm: LLM, pooling: str, prompts: list[list[int]]):
    inputs = [{"prompt_token_ids": p} for p in prompts]
    if pooling == "ALL":
        outs = llm.encode(inputs, pooling_task="encode", use_tqdm=False)
        return outs, [o.outputs.data for o in outs]
    outs = llm.embed(inputs, use_tqdm=False)
    return outs, [torch.tensor(o.outputs.embedding) for o in outs]


@pytest.mark.parametrize("pooling,budget", [("MEAN", 13), ("MEAN", 37), ("CLS", 13),
                                            ("CLS", 37), ("ALL", 13), ("ALL", 37)])
def test_every_pooling_type_is_exact_chunked_and_cached(attention_backend, qwen3_embed_dir,
                                                        pooling, budget):
    """Odd budgets split prompts mid-block; the second pass reads every full block of
    every prompt from the cache (its last token always recomputed) and is still exact."""
    llm = LLM(qwen3_embed_dir, max_num_batched_tokens=budget, **ON,
              override_pooler_config={"pooling_type": pooling, "normalize": False})
    prompts = _shared_prefix_batch(seed=budget)
    for rnd in range(2):
        outs, got = _outputs(llm, pooling, prompts)
        for p, o, g in zip(prompts, outs, got):
            assert o.prompt_token_ids == p
            want = _reference(qwen3_embed_dir, pooling, p)
            assert g.shape == want.shape, (len(p), g.shape)
            assert mf.max_abs_diff(g, want) <= TOL, f"{pooling} pass {rnd}, {len(p)} tokens"
            if rnd == 1:  # every full block before the last token came from the cache
                assert o.num_cached_tokens == (len(p) - 1) // BLOCK * BLOCK, len(p)
    stats = llm.llm_engine.stats
    assert stats.num_split_requests > 0 and stats.prefix_cache_hits > 0, stats
    assert stats.num_deduplicated >= 2, stats  # the duplicate, once per pass


def test_chunked_prefill_alone_and_caching_alone(qwen3_embed_dir):
    """Each feature on its own is exact too (the tracker runs without a payload store /
    with whole-prompt steps)."""
    prompts = _shared_prefix_batch(seed=5)
    for flags in (dict(enable_chunked_prefill=True, enable_prefix_caching=False,
                       max_num_batched_tokens=29),
                  dict(enable_chunked_prefill=False, enable_prefix_caching=True)):
        llm = LLM(qwen3_embed_dir, block_size=BLOCK, **flags,
                  override_pooler_config={"pooling_type": "MEAN", "normalize": False})
        for _ in range(2):
            outs, got = _outputs(llm, "MEAN", prompts)
            for p, g in zip(prompts, got):
                assert mf.max_abs_diff(g, _reference(qwen3_embed_dir, "MEAN", p)) <= TOL
        hits = llm.llm_engine.stats.prefix_cache_hits
        assert (hits > 0) == flags["enable_prefix_caching"], flags


def test_kv_pressure_evicts_and_stays_exact(qwen3_embed_dir):
    """A pool of 24 blocks for 30 prompts up to 300 tokens: payloads are evicted with
    their blocks (a miss, recomputed), never read stale; preempted requests restart their
    pooled state from what is still cached."""
    rng = random.Random(11)
    prefixes = [_ids(rng, 200), _ids(rng, 130), _ids(rng, 64)]
    prompts = []
    for i in range(30):
        n = rng.choice([5, 20, 47, 64, 120, 180, 230, 300])
        pre = prefixes[i % 3]
        prompts.append(_ids(rng, n) if i % 4 == 0 else (pre + _ids(rng, n + 3))[:n])
    for pooling in ("MEAN", "ALL"):
        llm = LLM(qwen3_embed_dir, max_model_len=320, num_gpu_blocks_override=24,
                  max_num_batched_tokens=48, **ON,
                  override_pooler_config={"pooling_type": pooling, "normalize": False})
        for _ in range(2):
            outs, got = _outputs(llm, pooling, prompts)
            for p, g in zip(prompts, got):
                assert mf.max_abs_diff(g, _reference(qwen3_embed_dir, pooling, p)) <= TOL
        stats = llm.llm_engine.stats
        assert stats.num_evictions >= 1 and stats.prefix_cache_hits > 0, stats
        assert stats.num_preemptions >= 1, stats  # states restarted on re-admission
        assert llm.llm_engine.kv.num_free_blocks == 24


def _step_prompts(tag: int) -> list[list[int]]:
    """A 150-token problem with two step tags, then candidates with tags of their own
    (one without any), plus a prompt cut inside the problem."""
    rng = random.Random(3)
    problem = _ids(rng, 60, tag) + [tag] + _ids(rng, 50, tag) + [tag] + _ids(rng, 38, tag)
    prompts = []
    for i in range(6):
        cand = []
        for _ in range(i % 3 + (i > 0)):
            cand += _ids(rng, rng.randrange(5, 40), tag) + [tag]
        prompts.append(problem + (cand or _ids(rng, 9, tag)))
    prompts.append(problem[:100])
    return prompts


def test_step_tags_inside_and_outside_the_shared_prefix(qwen2_prm_dir):
    """Best-of-N scoring: the problem's blocks (two tags inside) are cached once; each
    step setting then reads the same cached rows exactly (they are cached before the
    head, so step_tag_id / returned_token_ids / softmax apply afterwards)."""
    tag = mf.bpe_token_id(mf.STEP_TAG)
    prompts = _step_prompts(tag)
    llm = LLM(qwen2_prm_dir, max_num_batched_tokens=23, **ON)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    settings = [
        (PoolingParams(step_tag_id=tag, softmax=False), lambda r, m: r[m]),
        (PoolingParams(step_tag_id=tag, returned_token_ids=[1], softmax=True),
         lambda r, m: torch.sigmoid(r[m][:, [1]])),
        (PoolingParams(softmax=False), lambda r, m: r),
    ]
    for rnd, (params, expect) in enumerate(settings):
        outs = llm.encode(inputs, pooling_params=params, pooling_task="encode",
                          use_tqdm=False)
        for p, o in zip(prompts, outs):
            ref = mf.reward_reference(qwen2_prm_dir, p)
            want = expect(ref, torch.tensor(p) == tag)
            assert o.outputs.data.shape == want.shape, (rnd, len(p))
            assert mf.max_abs_diff(o.outputs.data, want) <= TOL, (rnd, len(p))
            if rnd > 0:
                assert o.num_cached_tokens == (len(p) - 1) // BLOCK * BLOCK
    assert llm.llm_engine.stats.num_split_requests > 0


# ----- include_prompt false: the prompt's tokens are left out of MEAN / CLS ------------------
@pytest.fixture(scope="module", params=["mean", "cls"])
def no_prompt_causal_dir(request, qwen3_st_dir, tmp_path_factory):
    path = mf.copy_checkpoint(qwen3_st_dir, tmp_path_factory.mktemp("np") / "m")
    conf_path = path / "1_Pooling" / "config.json"
    conf = json.loads(conf_path.read_text())
    conf.update(include_prompt=False, pooling_mode_lasttoken=False,
                pooling_mode_mean_tokens=request.param == "mean",
                pooling_mode_cls_token=request.param == "cls")
    conf_path.write_text(json.dumps(conf))
    return str(path)


def test_left_out_prompt_is_exact_and_never_shares_blocks(no_prompt_causal_dir):
    """Texts with a prompt (its tokens left out of pooling) and the very same strings
    with the prompt written into the text (pooled in full) tokenize identically; each
    must match sentence-transformers, so their cached blocks must not be shared."""
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(no_prompt_causal_dir, device="cpu")
    assert st[1].include_prompt is False
    tok = mf.hf_tokenizer(no_prompt_causal_dir)
    prompt = mf.text_of_length(tok, 20, seed=1) + " "
    shared = mf.text_of_length(tok, 40, seed=2)
    texts = [shared + " " + mf.text_of_length(tok, n, seed=n) for n in (3, 17, 40)]
    llm = LLM(no_prompt_causal_dir, max_num_batched_tokens=19, **ON)
    for rnd in range(2):
        with_prompt = llm.embed(texts, prompt=prompt, use_tqdm=False)
        in_text = llm.embed([prompt + t for t in texts], use_tqdm=False)
        for outs, ref in ((with_prompt, st.encode(texts, prompt=prompt)),
                          (in_text, st.encode([prompt + t for t in texts]))):
            for o, r in zip(outs, ref):
                assert mf.max_abs_diff(o.outputs.embedding, torch.tensor(r)) <= TOL, rnd
        assert [o.prompt_token_ids for o in with_prompt] == \
            [o.prompt_token_ids for o in in_text]
        if rnd == 1:
            assert all(o.num_cached_tokens >= BLOCK for o in with_prompt + in_text)


# ----- the state and the payload store on their own ------------------------------------------
def _feed(st: RequestPoolState, store, hidden, blocks, start: int, n: int) -> None:
    """One step of `n` tokens from `start`: write the payloads, then advance the state."""
    rows, bs = hidden[start: start + n], store.block_size
    inside = start <= st.position < start + n
    if st.kind == "CLS":
        if inside:
            store.write_cls(blocks[st.position // bs], rows[st.position - start])
        st.add(rows[st.position - start] if inside else None, start, n)
        return
    counted = torch.arange(start, start + n) >= st.position if st.kind == "MEAN" else None
    store.write(rows, token_slots(blocks, start, start + n, bs), counted)
    st.add(rows, start, n)


@pytest.mark.parametrize("kind", ["MEAN", "CLS", "ALL"])
@pytest.mark.parametrize("skip", [0, 5])
def test_state_and_store_match_one_pass(kind, skip):
    """A writer in chunks that cut blocks (3, 7, 9 tokens over blocks of 4) into a store
    full of stale values, and a reader that takes three cached blocks and computes the
    rest, both give the one-pass answer."""
    torch.manual_seed(0)
    bs, width, total = 4, 8, 19
    hidden, blocks = torch.randn(total, width), [5, 2, 7, 0, 3]
    store = BlockPayloadStore(kind, 8, bs, width, torch.float32, "cpu")
    for t in vars(store).values():
        if isinstance(t, torch.Tensor):
            t.fill_(7.0)  # stale payloads of blocks used before
    pos = pool_position(kind, skip, total)
    want = {"MEAN": hidden[pos:].mean(0), "CLS": hidden[pos], "ALL": hidden}[kind]
    writer, start = RequestPoolState(kind, pos, total), 0
    for n in (3, 7, 9):
        _feed(writer, store, hidden, blocks, start, n)
        start += n
    reader = RequestPoolState(kind, pos, total)
    reader.load(store, blocks, 12)
    _feed(reader, store, hidden, blocks, 12, total - 12)
    for st in (writer, reader):
        got = st.all_rows() if kind == "ALL" else st.vector()
        assert mf.max_abs_diff(got, want) <= 1e-6, (kind, skip)


def test_serve_flags_turn_them_on_for_causal_models_only(qwen3_embed_dir, qwen2_bidir_dir):
    """`vllm serve ... --enable-prefix-caching --enable-chunked-prefill`: exact on for MEAN
    on a causal model (a budget below max_model_len is then allowed), off on a
    bidirectional one."""
    from vllm.entrypoints.cli.main import make_parser
    from vllm.entrypoints.openai.cli_args import engine_args_from_namespace
    flags = ["--enable-prefix-caching", "--enable-chunked-prefill",
             "--max-num-batched-tokens", "24", "--override-pooler-config",
             '{"pooling_type": "MEAN"}']
    cfg = engine_args_from_namespace(make_parser().parse_args(
        ["serve", qwen3_embed_dir] + flags)).create_engine_config()
    assert cfg.cache_config.enable_prefix_caching is True
    assert cfg.scheduler_config.enable_chunked_prefill is True
    assert cfg.scheduler_config.max_num_batched_tokens == 24
    bidir = ["serve", qwen2_bidir_dir] + flags[:2] + flags[4:]
    cfg = engine_args_from_namespace(make_parser().parse_args(bidir)).create_engine_config()
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.scheduler_config.enable_chunked_prefill is False


def test_token_embed_on_a_last_model_is_exact_cached(qwen3_embed_dir):
    """A token task reads every token (the gate judges it as ALL): with both features
    asked for, a LAST model's token_embed rows are exact across chunks and cached blocks."""
    prompts = _shared_prefix_batch(seed=3)
    llm = LLM(qwen3_embed_dir, max_num_batched_tokens=13, **ON,
              override_pooler_config={"task": "token_embed"})
    for rnd in range(2):
        outs = llm.encode([{"prompt_token_ids": p} for p in prompts],
                          pooling_task="token_embed", use_tqdm=False)
        for p, o in zip(prompts, outs):
            want = torch.nn.functional.normalize(mf.hf_hidden_states(qwen3_embed_dir, p), dim=-1)
            assert mf.max_abs_diff(o.outputs.data, want) <= TOL, (rnd, len(p))
            if rnd == 1:
                assert o.num_cached_tokens == (len(p) - 1) // BLOCK * BLOCK
