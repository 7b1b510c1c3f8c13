"""ARGUS as the KV cache of a PyTorch model.

ArgusCache follows the interface of Hugging Face transformers' Cache classes (update,
get_seq_length, crop, reorder_cache), storing every layer's K/V in ARGUS pages, one ARGUS
sequence per batch row. Attention then runs inside ARGUS over the compressed pages:
`scaled_dot_product_attention(query, cache, layer_idx)` takes the query as
torch.nn.functional.scaled_dot_product_attention does ([batch, heads, q_len, head_dim]; GQA by
head count; causal) and never rebuilds K/V as tensors. `attention_function(cache)` gives the same
as a transformers attention interface (register it with AttentionInterface).

update() returns the key/value states it was given, not the whole cache: a model must compute
attention through ARGUS (the functions here), not by reading K/V back.
"""
import torch

import argus


class ArgusCache:
    """A KV cache of n_layers in ARGUS for a batch of batch_size rows.

    Keyword options are those of argus.KvCache (k_codec, v_codec, page_tokens, ram_budget, ...).
    """

    is_compileable = False

    def __init__(self, n_layers, n_q_heads, n_kv_heads, head_dim, batch_size=1, **options):
        self.kv = argus.KvCache(n_layers, n_q_heads, n_kv_heads, head_dim, **options)
        self.sequences = [self.kv.create_sequence() for _ in range(batch_size)]
        self.n_layers, self.n_q_heads, self.n_kv_heads = n_layers, n_q_heads, n_kv_heads
        self.head_dim = head_dim

    def __len__(self):
        return self.n_layers

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        """Stores key/value states [batch, n_kv_heads, new_tokens, head_dim] of one layer (after
        RoPE) and returns them as given."""
        self._check_batch(key_states, "key_states")
        for row, seq in enumerate(self.sequences):
            # ARGUS rows are [tokens, kv_heads, head_dim]: the head-major states are transposed.
            k = key_states[row].transpose(0, 1).contiguous()
            v = value_states[row].transpose(0, 1).contiguous()
            self.kv.append(seq, layer_idx, _float(k), _float(v))
        return key_states, value_states

    def get_seq_length(self, layer_idx=0):
        return self.kv.length(self.sequences[0], layer_idx)

    def get_max_cache_shape(self):
        return None  # grows without a fixed maximum

    def get_max_length(self):
        return None

    def get_usable_length(self, new_seq_length, layer_idx=0):
        return self.get_seq_length(layer_idx)

    def crop(self, max_length):
        """Keeps the first max_length tokens (negative: drops that many from the end)."""
        length = self.get_seq_length()
        keep = max_length if max_length >= 0 else length + max_length
        if 0 <= keep < length:
            for seq in self.sequences:
                self.kv.crop(seq, keep)

    def reorder_cache(self, beam_idx):
        """Row i continues row beam_idx[i] (beam search): forks share the pages copy-on-write."""
        order = [int(i) for i in beam_idx]
        new = [self.kv.fork(self.sequences[i]) for i in order]
        for seq in self.sequences:
            self.kv.release(seq)
        self.sequences = new

    def stats(self):
        return self.kv.stats()

    def _check_batch(self, x, name):
        if x.dim() != 4 or x.shape[0] != len(self.sequences):
            raise ValueError(f"{name}: shape {list(x.shape)}, expected [{len(self.sequences)}, "
                             f"heads, tokens, {self.head_dim}]")


def _float(x):
    return x if x.dtype in (torch.float32, torch.float16) else x.float()


def scaled_dot_product_attention(query, cache, layer_idx, is_causal=True, scale=None,
                                 enable_gqa=True):
    """Attention of query [batch, n_q_heads, q_len, head_dim] over the cache's layer: the last
    q_len positions of each row, causal, scale 1/sqrt(head_dim), computed on ARGUS's pages.
    Returns [batch, n_q_heads, q_len, head_dim] float32."""
    if not is_causal:
        raise ValueError("ARGUS attention is causal: is_causal must be True")
    if scale is not None and abs(scale - cache.head_dim ** -0.5) > 1e-12:
        raise ValueError("ARGUS attention uses scale 1/sqrt(head_dim)")
    if query.device.type != "cpu":
        raise TypeError(f"query: a tensor on {query.device} (ARGUS reads CPU memory)")
    cache._check_batch(query, "query")
    if query.shape[1] != cache.n_q_heads:
        raise ValueError(f"query: {query.shape[1]} heads, the cache has {cache.n_q_heads}")
    q_len = query.shape[2]
    out = torch.empty(query.shape, dtype=torch.float32)
    for row, seq in enumerate(cache.sequences):
        q = query[row].transpose(0, 1).contiguous().float()  # [q_len, heads, head_dim]
        o = (cache.kv.attend(seq, layer_idx, q[0]).unsqueeze(0) if q_len == 1
             else cache.kv.attend_prefill(seq, layer_idx, q))
        out[row] = o.transpose(0, 1)
    return out


def attention_function(cache):
    """A transformers attention interface over `cache`: (module, query, key, value,
    attention_mask, **kwargs) -> (output [batch, q_len, heads, head_dim], None). The key and
    value are already in the cache (its update ran first); module.layer_idx names the layer."""

    def attend(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
               **kwargs):
        out = scaled_dot_product_attention(query, cache, module.layer_idx, scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    return attend
