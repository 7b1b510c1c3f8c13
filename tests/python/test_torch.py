"""argus.torch: the transformers-shaped cache and SDPA-shaped attention, and the pure-PyTorch
Llama of examples/python/torch_llama.py against `argus run`."""
import subprocess

import numpy as np
import pytest
import torch

import argus
import argus.torch
from conftest import ARGUS_CLI
from torch_llama import sdpa

torch.manual_seed(20261201)


def sdpa_reference(query, keys, values):
    """torch SDPA over full K/V [batch, kv_heads, n, d], GQA by repeating heads, causal for the
    last q_len positions."""
    group = query.shape[1] // keys.shape[1]
    k, v = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    q_len, n = query.shape[2], k.shape[2]
    mask = torch.ones(q_len, n, dtype=torch.bool).tril(n - q_len)
    return sdpa(query.double(), k.double(), v.double(), attn_mask=mask).float()


def test_cache_update_and_attention_match_sdpa_for_decode_and_prefill():
    batch, heads, kv_heads, d = 3, 8, 2, 32
    cache = argus.torch.ArgusCache(2, heads, kv_heads, d, batch_size=batch, k_codec="f32",
                                   v_codec="f32", active_codec="f32", page_tokens=16)
    keys = torch.randn(batch, kv_heads, 40, d)
    values = torch.randn(batch, kv_heads, 40, d)
    returned = cache.update(keys[:, :, :37], values[:, :, :37], 1)
    assert returned[0] is not None and cache.get_seq_length(1) == 37
    query = torch.randn(batch, heads, 5, d)
    out = argus.torch.scaled_dot_product_attention(query, cache, 1)
    assert out.shape == query.shape
    assert torch.allclose(out, sdpa_reference(query, keys[:, :, :37], values[:, :, :37]),
                          atol=1e-5)
    for t in range(37, 40):
        cache.update(keys[:, :, t:t + 1], values[:, :, t:t + 1], 1)
    query = torch.randn(batch, heads, 1, d)
    out = argus.torch.scaled_dot_product_attention(query, cache, 1)
    assert torch.allclose(out, sdpa_reference(query, keys, values), atol=1e-5)
    # A transformers attention interface returns [batch, q_len, heads, d].
    module = type("Attention", (), {"layer_idx": 1})()
    out2, weights = argus.torch.attention_function(cache)(module, query, None, None)
    assert weights is None and torch.equal(out2, out.transpose(1, 2))


def test_crop_and_reorder_cache():
    cache = argus.torch.ArgusCache(1, 4, 2, 32, batch_size=2, page_tokens=16)
    keys, values = torch.randn(2, 2, 50, 32), torch.randn(2, 2, 50, 32)
    cache.update(keys, values, 0)
    query = torch.randn(2, 4, 1, 32)
    cache.crop(30)
    assert cache.get_seq_length() == 30
    cache.crop(-5)
    assert cache.get_seq_length() == 25
    before = argus.torch.scaled_dot_product_attention(query, cache, 0)
    cache.reorder_cache(torch.tensor([1, 1]))  # both rows continue row 1
    after = argus.torch.scaled_dot_product_attention(query[[1, 1]], cache, 0)
    assert torch.equal(after[0], before[1]) and torch.equal(after[1], before[1])
    assert cache.stats()["n_sequences"] == 2


def test_attention_rejects_what_it_cannot_do():
    cache = argus.torch.ArgusCache(1, 4, 2, 32)
    cache.update(torch.randn(1, 2, 3, 32), torch.randn(1, 2, 3, 32), 0)
    with pytest.raises(ValueError, match="causal"):
        argus.torch.scaled_dot_product_attention(torch.randn(1, 4, 1, 32), cache, 0,
                                                 is_causal=False)
    with pytest.raises(ValueError, match="shape"):
        argus.torch.scaled_dot_product_attention(torch.randn(2, 4, 1, 32), cache, 0)
    with pytest.raises(TypeError, match="meta"):
        argus.torch.scaled_dot_product_attention(torch.randn(1, 4, 1, 32, device="meta"),
                                                 cache, 0)


def test_torch_llama_generates_what_argus_run_prints(stories):
    import torch_llama
    llama = torch_llama.Llama(str(stories))
    prompt, n = "Once upon a time", 48
    with_argus, tokens = torch_llama.generate(llama, prompt, n,
                                              torch_llama.argus_attention(llama))
    with_sdpa, sdpa_tokens = torch_llama.generate(llama, prompt, n,
                                                  torch_llama.sdpa_attention(llama))
    cli = subprocess.run([str(ARGUS_CLI), "run", "-m", str(stories), "-p", prompt, "-n", str(n)],
                         capture_output=True, check=True)
    assert len(tokens) == n
    assert with_argus == cli.stdout.decode()
    assert tokens == sdpa_tokens and with_argus == with_sdpa


def test_model_runner(stories):
    model = argus.Model(str(stories))
    assert model.info["arch"] == "llama" and model.info["head_dim"] == 8
    tokens = model.tokenize("Once upon a time")
    assert tokens[0] == model.info["bos"]
    assert model.detokenize(tokens[1:]).strip() == "Once upon a time"
    embed = model.tensor("token_embd.weight")
    assert embed.shape == (model.info["n_vocab"], 64) and np.isfinite(embed).all()
    assert "blk.0.attn_q.weight" in model.tensor_names()
    context = model.context(n_ctx=256)
    logits = context.eval(tokens)
    assert logits.shape == (model.info["n_vocab"],) and context.n_past == len(tokens)
    context.truncate(0)
    text = context.generate("Once upon a time", 32, temperature=1.0, seed=3)
    cli = subprocess.run([str(ARGUS_CLI), "run", "-m", str(stories), "-p", "Once upon a time",
                          "-n", "32", "-c", "256", "--temp", "1.0", "--seed", "3"],
                         capture_output=True, check=True)
    assert text == cli.stdout.decode()
    with pytest.raises(argus.ArgusError, match="nonexistent"):
        argus.Model("/nonexistent.gguf")
    with pytest.raises(argus.ArgusError, match="not in"):
        model.tensor("no.such.tensor")
