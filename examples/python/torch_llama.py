"""A Llama forward pass in plain PyTorch whose KV cache and attention live in ARGUS.

The weights come from a GGUF file through argus.Model; attention either runs inside ARGUS over
its compressed pages (argus.torch) or, for comparison, with torch's SDPA over a plain tensor
cache. Greedy decoding of both prints the same text as `argus run`:

    python3 examples/python/torch_llama.py ../shared/models/stories260K.gguf "Once upon a time"
"""
import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import argus  # noqa: E402
import argus.torch  # noqa: E402


class Llama:
    def __init__(self, path):
        self.model = argus.Model(path)
        c = self.model.info
        if c["arch"] != "llama" or c["rope_freq_factors"]:
            raise ValueError(f"{path}: this example runs plain Llama models (got {c['arch']})")
        self.c = c
        w = lambda name: torch.from_numpy(self.model.tensor(name))  # noqa: E731
        self.embed = w("token_embd.weight")
        self.output = self.embed if c["tied_output"] else w("output.weight")
        self.output_norm = w("output_norm.weight")
        self.layers = [{key: w(f"blk.{i}.{key}.weight")
                        for key in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")}
                       for i in range(c["n_layers"])]
        half = c["head_dim"] // 2
        self.inv_freq = c["rope_theta"] ** (-2.0 * torch.arange(half, dtype=torch.float64)
                                            / c["head_dim"])

    def rms_norm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_eps"]) * weight

    def rope(self, x, positions):
        """x: [tokens, heads, head_dim]; Llama GGUF files rotate adjacent pairs."""
        angles = positions[:, None].double() * self.inv_freq[None, :]
        cos, sin = angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def forward(self, tokens, start, attend):
        """Logits of the last of `tokens` at positions start..; attend(layer, q, k, v) -> out,
        with q [heads, n, d] and k, v [kv_heads, n, d] of the new tokens."""
        c, n = self.c, len(tokens)
        heads, kv_heads, d = c["n_heads"], c["n_kv_heads"], c["head_dim"]
        positions = torch.arange(start, start + n)
        x = self.embed[torch.tensor(tokens)]
        for i, w in enumerate(self.layers):
            h = self.rms_norm(x, w["attn_norm"])
            q = self.rope((h @ w["attn_q"].T).view(n, heads, d), positions)
            k = self.rope((h @ w["attn_k"].T).view(n, kv_heads, d), positions)
            v = (h @ w["attn_v"].T).view(n, kv_heads, d)
            a = attend(i, q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
            x = x + a.transpose(0, 1).reshape(n, heads * d) @ w["attn_output"].T
            h = self.rms_norm(x, w["ffn_norm"])
            x = x + (F.silu(h @ w["ffn_gate"].T) * (h @ w["ffn_up"].T)) @ w["ffn_down"].T
        return self.rms_norm(x[-1], self.output_norm) @ self.output.T


def argus_attention(llama, **cache_options):
    """Attention through argus.torch: the cache stores K/V in ARGUS and attends there."""
    c = llama.c
    cache = argus.torch.ArgusCache(c["n_layers"], c["n_heads"], c["n_kv_heads"], c["head_dim"],
                                   **cache_options)

    def attend(layer, q, k, v):
        cache.update(k.unsqueeze(0), v.unsqueeze(0), layer)
        return argus.torch.scaled_dot_product_attention(q.unsqueeze(0), cache, layer)[0]

    return attend


def _sdpa(q, k, v, attn_mask):
    """torch.nn.functional.scaled_dot_product_attention for torch < 2.0, which lacks it."""
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~attn_mask, float("-inf")), -1) @ v


sdpa = getattr(F, "scaled_dot_product_attention", _sdpa)


def sdpa_attention(llama):
    """Attention with torch's SDPA over a plain tensor cache."""
    keys, values = {}, {}
    group = llama.c["n_heads"] // llama.c["n_kv_heads"]

    def attend(layer, q, k, v):
        keys[layer] = torch.cat([keys[layer], k], 1) if layer in keys else k
        values[layer] = torch.cat([values[layer], v], 1) if layer in values else v
        kk = keys[layer].repeat_interleave(group, 0)
        vv = values[layer].repeat_interleave(group, 0)
        n, total = q.shape[1], kk.shape[1]
        mask = torch.ones(n, total, dtype=torch.bool).tril(total - n)
        return sdpa(q, kk, vv, attn_mask=mask)

    return attend


def generate(llama, prompt, n_predict, attend):
    """Greedy decoding: the text of up to n_predict tokens after `prompt`."""
    tokens = llama.model.tokenize(prompt)
    logits = llama.forward(tokens, 0, attend)
    out, position = [], len(tokens)
    for _ in range(n_predict):
        token = int(torch.argmax(logits))
        if token == llama.c["eos"]:
            break
        out.append(token)
        logits = llama.forward([token], position, attend)
        position += 1
    return llama.model.detokenize(out), out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("prompt")
    parser.add_argument("-n", type=int, default=64)
    parser.add_argument("--codec", default="f16", help="K and V codec of the ARGUS pages")
    args = parser.parse_args()
    llama = Llama(args.model)
    text, _ = generate(llama, args.prompt, args.n,
                       argus_attention(llama, k_codec=args.codec, v_codec=args.codec))
    print(text)


if __name__ == "__main__":
    main()
