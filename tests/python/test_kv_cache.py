"""argus.KvCache against NumPy double-precision attention, NumPy against torch, copies, errors."""
import math

import numpy as np
import pytest
import torch

import argus
from argus import _lib

SEED = 20261201
N_LAYERS, N_Q, N_KV, D, PAGE = 2, 8, 2, 64, 32

# Each codec's stated per-element bound (docs/codecs.md), from the values of its block, and its
# fused kernels' stated relative error (AVX2 table, doubled for the AVX-512 and scalar paths).
# Grouping "token": blocks of 32 values of a token's head row; "channel": 32 tokens of a channel.
def _f16(x, block):
    return 2.0 ** -11 * np.abs(x) + 2.0 ** -25


def _scaled(factor, levels):
    def bound(x, block):
        return factor * block(lambda b: np.abs(b).max()) / levels + 1e-6 * np.abs(x)
    return bound


def _affine(bits):
    def bound(x, block):
        return 0.51 * block(lambda b: b.max() - b.min()) / (2 ** bits - 1) + 1e-6 * np.abs(x)
    return bound


CODECS = {  # name: (per-element bound, grouping, fused_rel_error)
    "f16": (_f16, "token", 2e-5),
    "lossless_f16": (_f16, "token", 2e-5),
    "bf16": (lambda x, block: 2.0 ** -8 * np.abs(x) + 2.0 ** -25, "token", 2e-5),
    "fp8_e4m3": (lambda x, block: np.abs(x) / 16 + block(lambda b: np.abs(b).max()) * 1e-4,
                 "token", 2e-5),
    "q8_0": (_scaled(0.6, 127), "token", 2.2e-3),
    "q4_0": (_scaled(1.01, 8), "token", 0.252),
    "iq4_nl": (_scaled(15.0, 127), "token", 2.2e-3),
    "int8": (_affine(8), "token", 0.254),
    "int4": (_affine(4), "token", 0.134),
    "int2": (_affine(2), "token", 0.168),
    "int4:channel": (_affine(4), "channel", 0.268),
}


def element_bounds(x, codec, page):
    """Per-element bound of x [tokens, kv_heads, d] stored in `codec` pages of `page` tokens.
    Rows arrive in the f16 active page and a full page is encoded from it, so a full page's
    bound is the codec's over the f16-rounded values plus the f16 rounding; the last, partial
    page is held in f16."""
    bound, grouping, _ = CODECS[codec]
    n = x.shape[0]
    out = np.empty_like(x, dtype=np.float64)
    n_full = n // page * page
    x16 = x.astype(np.float16).astype(np.float64)
    for start in range(0, n, 32 if grouping == "channel" else 1):
        rows = slice(start, start + (32 if grouping == "channel" else 1))
        for h in range(x.shape[1]):
            for c0 in range(0, x.shape[2], 32 if grouping == "token" else 1):
                cols = slice(c0, c0 + (32 if grouping == "token" else 1))
                b = x16[rows, h, cols]
                out[rows, h, cols] = bound(b, lambda f: f(b))
    out += _f16(x.astype(np.float64), None)
    out[n_full:] = _f16(x[n_full:].astype(np.float64), None)
    return out


def reference(q, k, v):
    """Decode attention in double precision: q [n_q, d] at the last of k, v [n, n_kv, d]."""
    group = q.shape[0] // k.shape[1]
    out = np.empty(q.shape)
    for i in range(q.shape[0]):
        s = k[:, i // group].astype(np.float64) @ q[i].astype(np.float64) / math.sqrt(q.shape[1])
        p = np.exp(s - s.max())
        out[i] = p @ v[:, i // group].astype(np.float64) / p.sum()
    return out


def attention_bound(q, k, v, k_codec, v_codec):
    """Per query head: max_t||v'-v|| + (e^(2 delta) - 1) max_t||v||, delta the largest score
    error (codec and fused kernel), plus the fused accumulate's error."""
    group = q.shape[0] // k.shape[1]
    ek, ev = element_bounds(k, k_codec, PAGE), element_bounds(v, v_codec, PAGE)
    bounds = []
    for i in range(q.shape[0]):
        h = i // group
        qn = np.linalg.norm(q[i])
        kn, vn = np.linalg.norm(k[:, h], axis=1), np.linalg.norm(v[:, h], axis=1)
        delta = (np.abs(q[i]) @ ek[:, h].T).max() + CODECS[k_codec][2] * qn * kn.max()
        delta /= math.sqrt(q.shape[1])
        v_err = np.sqrt((ev[:, h] ** 2).sum(axis=1)).max()
        bounds.append(v_err + math.expm1(2 * delta) * vn.max()
                      + CODECS[v_codec][2] * (vn.max() + v_err))
    return np.array(bounds)


def random_kv(rng, n):
    k = rng.standard_normal((n, N_KV, D)).astype(np.float32)
    v = rng.standard_normal((n, N_KV, D)).astype(np.float32)
    return k, v


def fused_bound(q, k, v, k_codec, v_codec):
    """Per query head, how far the fused kernels may be from double-precision attention over
    the stored (decoded) k, v: the score error moves each weight by at most e^(2 delta), and the
    accumulate adds its own relative error."""
    group = q.shape[0] // k.shape[1]
    bounds = []
    for i in range(q.shape[0]):
        h = i // group
        kn, vn = np.linalg.norm(k[:, h], axis=1), np.linalg.norm(v[:, h], axis=1)
        delta = CODECS[k_codec][2] * np.linalg.norm(q[i]) * kn.max() / math.sqrt(q.shape[1])
        bounds.append(math.expm1(2 * delta) * vn.max() + CODECS[v_codec][2] * vn.max() + 1e-5)
    return np.array(bounds)


@pytest.mark.parametrize("k_codec,v_codec", [(c, c) for c in CODECS if c != "int4:channel"]
                         + [("int4:channel", "int4"), ("q8_0", "int2")])
def test_round_trip_within_the_codec_bounds(k_codec, v_codec):
    """Every codec family: the stored K/V within the codec's per-element bound of the input, and
    attention within the fused kernels' bound of NumPy double-precision attention over them."""
    rng = np.random.default_rng(SEED)
    n = 3 * PAGE + 7
    k, v = random_kv(rng, n)
    q = rng.standard_normal((N_Q, D)).astype(np.float32)
    q_small = q / 8  # keeps the 4-bit kernels' worst-case score bound below 1
    with argus.KvCache(N_LAYERS, N_Q, N_KV, D, k_codec, v_codec, PAGE) as cache:
        s = cache.create_sequence()
        for layer in range(N_LAYERS):
            cache.append(s, layer, k, v)
        k_stored, v_stored = cache.read(s, 1)
        outputs = [cache.attend(s, 1, x) for x in (q, q_small)]
    assert np.all(np.abs(k_stored - k) <= element_bounds(k, k_codec, PAGE))
    assert np.all(np.abs(v_stored - v) <= element_bounds(v, v_codec, PAGE))
    for x, out in zip((q, q_small), outputs):
        error = np.linalg.norm(out - reference(x, k_stored, v_stored), axis=1)
        assert np.all(error <= fused_bound(x, k_stored, v_stored, k_codec, v_codec))
    # And against the input: the whole bound, codec and kernels together.
    error = np.linalg.norm(outputs[0] - reference(q, k, v), axis=1)
    assert np.all(error <= attention_bound(q, k, v, k_codec, v_codec))
    if k_codec == v_codec == "f16":
        assert error.max() < 1e-2


def test_prefill_matches_decode_of_each_position_in_f32_pages():
    rng = np.random.default_rng(SEED + 1)
    k, v = random_kv(rng, 70)
    q = rng.standard_normal((5, N_Q, D)).astype(np.float32)
    with argus.KvCache(1, N_Q, N_KV, D, "f32", "f32", PAGE, active_codec="f32") as cache:
        s = cache.create_sequence()
        cache.append(s, 0, k, v)
        block = cache.attend_prefill(s, 0, q)
        for i in range(5):
            expected = reference(q[i], k[:70 - 4 + i], v[:70 - 4 + i])
            assert np.abs(block[i] - expected).max() < 1e-4


def test_numpy_and_torch_inputs_give_identical_bits():
    rng = np.random.default_rng(SEED + 2)
    k, v = random_kv(rng, 90)
    q = rng.standard_normal((N_Q, D)).astype(np.float32)
    outputs = []
    for convert in (lambda x: x, torch.from_numpy):
        with argus.KvCache(1, N_Q, N_KV, D, "q4_0", "q4_0", PAGE) as cache:
            s = cache.create_sequence()
            cache.append(s, 0, convert(k), convert(v))
            out = cache.attend(s, 0, convert(q))
            assert isinstance(out, torch.Tensor) == (convert is torch.from_numpy)
            outputs.append(np.asarray(out))
    assert outputs[0].tobytes() == outputs[1].tobytes()
    # float16 inputs take the library's f16 path: the same bits as float32 values rounded to f16.
    with argus.KvCache(1, N_Q, N_KV, D, "q4_0", "q4_0", PAGE) as a, \
            argus.KvCache(1, N_Q, N_KV, D, "q4_0", "q4_0", PAGE) as b:
        sa, sb = a.create_sequence(), b.create_sequence()
        a.append(sa, 0, k.astype(np.float16), v.astype(np.float16))
        b.append(sb, 0, k.astype(np.float16).astype(np.float32),
                 v.astype(np.float16).astype(np.float32))
        assert a.attend(sa, 0, q).tobytes() == b.attend(sb, 0, q).tobytes()


def test_contiguous_float32_inputs_are_not_copied(monkeypatch):
    seen = {}
    for name in ("argus_seq_append_f32", "argus_attend_decode_f32"):
        real = getattr(_lib.lib, name)

        def spy(*args, _real=real, _name=name):
            seen[_name] = args
            return _real(*args)
        monkeypatch.setattr(_lib.lib, name, spy)
    rng = np.random.default_rng(SEED + 3)
    k, v = random_kv(rng, 40)
    q = torch.from_numpy(rng.standard_normal((N_Q, D)).astype(np.float32))
    with argus.KvCache(1, N_Q, N_KV, D) as cache:
        s = cache.create_sequence()
        cache.append(s, 0, k, v)
        out = cache.attend(s, 0, q)
    assert seen["argus_seq_append_f32"][3] == k.ctypes.data
    assert seen["argus_seq_append_f32"][4] == v.ctypes.data
    assert seen["argus_attend_decode_f32"][3] == q.data_ptr()
    assert seen["argus_attend_decode_f32"][4] == out.data_ptr()


def test_crop_fork_release_and_stats():
    rng = np.random.default_rng(SEED + 4)
    k, v = random_kv(rng, 100)
    q = rng.standard_normal((N_Q, D)).astype(np.float32)
    with argus.KvCache(1, N_Q, N_KV, D, "q8_0", "q8_0", PAGE) as cache:
        s = cache.create_sequence()
        cache.append(s, 0, k[:64], v[:64])
        before = cache.attend(s, 0, q)
        child = cache.fork(s)
        cache.append(child, 0, k[64:], v[64:])
        assert cache.length(child) == 100 and cache.length(s) == 64
        cache.crop(child, 64)  # a draft rejected: back to the shared pages
        assert cache.attend(child, 0, q).tobytes() == before.tobytes()
        stats = cache.stats()
        assert stats["n_sequences"] == 2
        assert stats["n_full_pages"] == 2  # shared by both sequences
        cache.release(child)
        cache.release(s)
        assert cache.stats()["n_pages"] == 0


def test_placement_engine_prefix_pages_and_saves(tmp_path):
    rng = np.random.default_rng(SEED + 5)
    n = 1024
    k, v = random_kv(rng, n)
    q = rng.standard_normal((N_Q, D)).astype(np.float32)
    with argus.KvCache(1, N_Q, N_KV, D, page_tokens=16, disk_dir=str(tmp_path / "d")) as cache:
        s = cache.create_sequence()
        cache.append(s, 0, k, v)
        exact = cache.attend(s, 0, q)
        assert cache.move_to_disk(s) == n // 16
        assert cache.stats()["n_disk_pages"] == n // 16
        assert cache.attend(s, 0, q).tobytes() == exact.tobytes()
        assert cache.last_attention_stats()["n_disk_pages_read"] == n // 16
        cache.move_to_ram(s)
        tokens = list(range(n))
        assert cache.store_prefix(s, "model-a", tokens) == n // 16
        t = cache.create_sequence()
        assert cache.load_prefix(t, "model-a", tokens) == n
        assert cache.attend(t, 0, q).tobytes() == exact.tobytes()
        u = cache.create_sequence()
        assert cache.load_prefix(u, "model-b", tokens) == 0
        cache.save(s, "conversation")
        r = cache.restore("conversation")
        assert cache.attend(r, 0, q).tobytes() == exact.tobytes()
    budget = argus.KvCache(1, N_Q, N_KV, D, page_tokens=16).stats()["ram_budget_bytes"]
    assert budget > 2 ** 60  # None: unlimited
    with argus.KvCache(1, N_Q, N_KV, D, page_tokens=16, ram_budget=300_000, profile="research",
                       disk_dir=str(tmp_path / "p"), placement_sync=True) as cache:
        s = cache.create_sequence()
        cache.begin_request(s, n + 8)
        cache.append(s, 0, k[:n - 8], v[:n - 8])
        for t in range(n - 8, n):
            cache.append(s, 0, k[t:t + 1], v[t:t + 1])
            out = cache.attend(s, 0, q)
            cache.end_step()
        stats = cache.stats()
        assert stats["placement"]["active"] and stats["placement"]["n_demotions"] > 0
        assert stats["ram_used_bytes"] <= 300_000
        assert np.linalg.norm(out - exact) / np.linalg.norm(exact) < 0.25


def test_bad_inputs_raise_clear_errors():
    k = np.zeros((4, N_KV, D), np.float32)
    with argus.KvCache(1, N_Q, N_KV, D) as cache:
        s = cache.create_sequence()
        with pytest.raises(TypeError, match="float64"):
            cache.append(s, 0, k.astype(np.float64), k)
        with pytest.raises(TypeError, match="the same dtype"):
            cache.append(s, 0, k, k.astype(np.float16))
        with pytest.raises(ValueError, match="shape"):
            cache.append(s, 0, np.zeros((4, 1, D), np.float32), np.zeros((4, 1, D), np.float32))
        with pytest.raises(ValueError, match="contiguous"):
            cache.append(s, 0, np.zeros((N_KV, 4, D), np.float32).transpose(1, 0, 2), k)
        with pytest.raises(ValueError, match="contiguous"):
            cache.append(s, 0, torch.zeros(N_KV, 4, D).transpose(0, 1), torch.from_numpy(k))
        with pytest.raises(TypeError, match="meta"):  # any non-CPU device, e.g. CUDA
            cache.attend(s, 0, torch.zeros(N_Q, D, device="meta"))
        with pytest.raises(TypeError, match="numpy.ndarray or torch.Tensor"):
            cache.append(s, 0, [[0.0]], k)
        with pytest.raises(argus.ArgusError, match="layer 3 out of range"):
            cache.append(s, 3, k, k)
        with pytest.raises(argus.ArgusError, match="non-finite|finite"):
            bad = k.copy()
            bad[1, 0, 5] = np.nan
            cache.append(s, 0, bad, k)
        with pytest.raises(argus.ArgusError, match="does not exist"):
            cache.attend(s + 100, 0, np.zeros((N_Q, D), np.float32))
    with pytest.raises(argus.ArgusError, match="closed"):
        cache.create_sequence()
    with pytest.raises(argus.ArgusError, match="q9_9"):
        argus.KvCache(1, N_Q, N_KV, D, k_codec="q9_9")


def test_codec_registry():
    codecs = {c["name"]: c for c in argus.codecs()}
    assert codecs["q4_0"]["bits_per_value"] == 4.5
    assert codecs["lossless_f16"]["lossless"] and not codecs["q8_0"]["lossless"]
    assert argus.__version__ == "0.2.0"
