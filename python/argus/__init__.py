"""ARGUS from Python: a compressed, paged KV cache with attention computed over its pages, and a
GGUF model runner, over the library's C API (include/argus/argus.h).

Arrays are NumPy arrays or PyTorch CPU tensors. C-contiguous float32 inputs are passed to the
library without a copy; float16 inputs go through the library's f16 path (K/V only). Every
failure of the library raises ArgusError with its message; wrong dtypes, shapes, devices or
layouts raise TypeError or ValueError before anything reaches the library.
"""
import ctypes
import json

import numpy as np

from . import _lib
from ._lib import ArgusError

__all__ = ["ArgusError", "KvCache", "Model", "Context", "codecs", "__version__"]

__version__ = _lib.lib.argus_version().decode()


def codecs():
    """The built-in codecs: [{'name', 'bits_per_value', 'lossless'}, ...] by name."""
    out = []
    for i in range(_lib.lib.argus_codec_count()):
        out.append({"name": _lib.lib.argus_codec_name(i).decode(),
                    "bits_per_value": _lib.lib.argus_codec_bits_per_value(i),
                    "lossless": bool(_lib.lib.argus_codec_is_lossless(i))})
    return out


def _torch_module():
    import sys
    return sys.modules.get("torch")


def _is_torch(x):
    torch = _torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


class _Buffer:
    """A view of an input array the library reads: its data pointer, dtype name and shape."""

    def __init__(self, x, name, dtypes=("float32", "float16")):
        if _is_torch(x):
            if x.device.type != "cpu":
                raise TypeError(f"{name}: a tensor on {x.device} (ARGUS reads CPU memory; "
                                f"call .cpu() first)")
            dtype = str(x.dtype).replace("torch.", "")
            if dtype not in dtypes:
                raise TypeError(f"{name}: dtype {x.dtype}; ARGUS takes {' or '.join(dtypes)}")
            if not x.is_contiguous():
                raise ValueError(f"{name}: the tensor is not contiguous (call .contiguous())")
            self.pointer, self.shape, self.keep = x.data_ptr(), tuple(x.shape), x
        elif isinstance(x, np.ndarray):
            dtype = x.dtype.name
            if dtype not in dtypes:
                raise TypeError(f"{name}: dtype {x.dtype}; ARGUS takes {' or '.join(dtypes)}")
            if not x.flags.c_contiguous:
                raise ValueError(f"{name}: the array is not C-contiguous "
                                 f"(np.ascontiguousarray makes one)")
            self.pointer, self.shape, self.keep = x.ctypes.data, x.shape, x
        else:
            raise TypeError(f"{name}: expected a numpy.ndarray or torch.Tensor, got "
                            f"{type(x).__name__}")
        self.dtype = dtype

    def check_shape(self, expected, name):
        if tuple(self.shape) != tuple(expected):
            raise ValueError(f"{name}: shape {list(self.shape)}, expected {list(expected)}")


def _new_output(x, shape):
    """A float32 output of `shape`, a torch tensor when x is one, else a NumPy array."""
    if _is_torch(x):
        return _torch_module().empty(shape, dtype=_torch_module().float32)
    return np.empty(shape, dtype=np.float32)


def _pointer(out):
    return out.data_ptr() if _is_torch(out) else out.ctypes.data


def _tokens(tokens):
    array = np.ascontiguousarray(np.asarray(tokens, dtype=np.int32).reshape(-1))
    return array, array.ctypes.data, array.size


class KvCache:
    """A paged KV cache of n_layers layers, each token's K/V stored in k_codec/v_codec pages.

    ram_budget: bytes of pages in RAM (None: unlimited). disk_dir/disk_budget: a disk tier.
    profile: a placement profile ("balanced", "research", "capacity", or a JSON file) that keeps
    the budget by demoting cold pages (see begin_request). One call at a time per cache.
    """

    def __init__(self, n_layers, n_q_heads, n_kv_heads, head_dim, k_codec="f16", v_codec="f16",
                 page_tokens=256, ram_budget=None, *, active_codec="f16", threads=0, window=0,
                 sinks=0, epsilon=0.0, disk_dir=None, disk_budget=0, profile=None,
                 placement_sync=False):
        lib = _lib.lib
        self._handle = None
        options = lib.argus_cache_options_create()
        try:
            lib.argus_cache_options_set_geometry(options, n_layers, n_q_heads, n_kv_heads,
                                                 head_dim)
            lib.argus_cache_options_set_codecs(options, _lib.encode(k_codec), _lib.encode(v_codec))
            lib.argus_cache_options_set_page_tokens(options, page_tokens)
            lib.argus_cache_options_set_ram_budget(options, 0 if ram_budget is None else ram_budget)
            lib.argus_cache_options_set_active_codec(options, _lib.encode(active_codec))
            lib.argus_cache_options_set_threads(options, threads)
            lib.argus_cache_options_set_attention(options, window, sinks, epsilon)
            if disk_dir is not None:
                lib.argus_cache_options_set_disk(options, _lib.encode(disk_dir), disk_budget)
            if profile is not None:
                lib.argus_cache_options_set_profile(options, _lib.encode(profile))
            lib.argus_cache_options_set_placement_sync(options, int(placement_sync))
            self._handle = _lib.call("argus_cache_open", options)
        finally:
            lib.argus_cache_options_destroy(options)
        self.n_layers, self.n_q_heads = n_layers, n_q_heads
        self.n_kv_heads, self.head_dim = n_kv_heads, head_dim

    def close(self):
        if self._handle:
            _lib.lib.argus_cache_close(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    @property
    def handle(self):
        if not self._handle:
            raise ArgusError("InvalidArgument: the cache is closed")
        return self._handle

    def create_sequence(self):
        return _lib.call("argus_seq_create", self.handle)

    def release(self, seq):
        _lib.call("argus_seq_release", self.handle, seq)

    def fork(self, seq):
        """A new sequence sharing seq's full pages copy-on-write."""
        return _lib.call("argus_seq_fork", self.handle, seq)

    def crop(self, seq, n_tokens):
        """Keeps the first n_tokens of every layer."""
        _lib.call("argus_seq_crop", self.handle, seq, n_tokens)

    def length(self, seq, layer=0):
        return _lib.call("argus_seq_length", self.handle, seq, layer)

    def append(self, seq, layer, k, v):
        """Appends rows k, v: [n_tokens, n_kv_heads, head_dim], float32 or float16, after RoPE."""
        kb, vb = _Buffer(k, "k"), _Buffer(v, "v")
        if kb.dtype != vb.dtype:
            raise TypeError(f"k is {kb.dtype} and v is {vb.dtype}: give both the same dtype")
        if len(kb.shape) != 3:
            raise ValueError(f"k: shape {list(kb.shape)}, expected [n_tokens, "
                             f"{self.n_kv_heads}, {self.head_dim}]")
        shape = (kb.shape[0], self.n_kv_heads, self.head_dim)
        kb.check_shape(shape, "k")
        vb.check_shape(shape, "v")
        function = "argus_seq_append_f32" if kb.dtype == "float32" else "argus_seq_append_f16"
        _lib.call(function, self.handle, seq, layer, kb.pointer, vb.pointer, shape[0])

    def attend(self, seq, layer, q):
        """Decode attention of q: [n_q_heads, head_dim] (float32) at the layer's last position;
        returns [n_q_heads, head_dim] float32, a tensor for a tensor q, else an array."""
        qb = _Buffer(q, "q", ("float32",))
        qb.check_shape((self.n_q_heads, self.head_dim), "q")
        out = _new_output(q, (self.n_q_heads, self.head_dim))
        _lib.call("argus_attend_decode_f32", self.handle, seq, layer, qb.pointer, _pointer(out))
        return out

    def attend_prefill(self, seq, layer, q):
        """Prefill attention of q: [n_queries, n_q_heads, head_dim] at the layer's last
        n_queries positions, each causal; returns the same shape, float32."""
        qb = _Buffer(q, "q", ("float32",))
        if len(qb.shape) != 3:
            raise ValueError(f"q: shape {list(qb.shape)}, expected [n_queries, "
                             f"{self.n_q_heads}, {self.head_dim}]")
        qb.check_shape((qb.shape[0], self.n_q_heads, self.head_dim), "q")
        out = _new_output(q, qb.shape)
        _lib.call("argus_attend_prefill_f32", self.handle, seq, layer, qb.pointer, qb.shape[0],
                  _pointer(out))
        return out

    def read(self, seq, layer, first=0, n_tokens=None):
        """The K/V rows [first, first + n_tokens) of a layer as the cache holds them, decoded:
        two float32 arrays [n_tokens, n_kv_heads, head_dim]. For inspection; attend() never
        needs them."""
        if n_tokens is None:
            n_tokens = self.length(seq, layer) - first
        k = np.empty((n_tokens, self.n_kv_heads, self.head_dim), np.float32)
        v = np.empty_like(k)
        _lib.call("argus_seq_read_f32", self.handle, seq, layer, first, n_tokens, k.ctypes.data,
                  v.ctypes.data)
        return k, v

    def last_attention_stats(self):
        stats = _lib.AttentionStats()
        _lib.call("argus_cache_last_attention_stats", self.handle, ctypes.byref(stats))
        return {name: getattr(stats, name) for name, _ in stats._fields_}

    def begin_request(self, seq, expected_tokens):
        """Puts seq under the placement engine (a cache opened with a profile)."""
        _lib.call("argus_placement_begin", self.handle, seq, expected_tokens)

    def end_step(self):
        """Ends a decode step of the request (every layer appended and attended)."""
        _lib.call("argus_placement_end_step", self.handle)

    def move_to_disk(self, seq, first=0, n_tokens=2**32 - 1):
        return _lib.call("argus_seq_move_to_disk", self.handle, seq, first, n_tokens)

    def move_to_ram(self, seq, first=0, n_tokens=2**32 - 1):
        return _lib.call("argus_seq_move_to_ram", self.handle, seq, first, n_tokens)

    def save(self, seq, name):
        _lib.call("argus_seq_save", self.handle, seq, _lib.encode(name))

    def restore(self, name):
        return _lib.call("argus_seq_restore", self.handle, _lib.encode(name))

    def erase_save(self, name):
        _lib.call("argus_save_erase", self.handle, _lib.encode(name))

    def store_prefix(self, seq, fingerprint, tokens):
        array, pointer, n = _tokens(tokens)
        return _lib.call("argus_prefix_store", self.handle, seq, _lib.encode(fingerprint),
                         pointer, n)

    def load_prefix(self, seq, fingerprint, tokens):
        array, pointer, n = _tokens(tokens)
        return _lib.call("argus_prefix_load", self.handle, seq, _lib.encode(fingerprint),
                         pointer, n)

    def stats(self):
        """Bytes per codec and tier, pages, budgets, placement (docs/integration.md)."""
        return json.loads(_lib.take_string(_lib.call("argus_cache_stats_json", self.handle)))


class Sampler:
    """temperature 0: greedy; the same logits and seed give the same tokens everywhere."""

    def __init__(self, temperature=0.0, top_k=40, top_p=0.95, seed=0):
        self._handle = _lib.call("argus_sampler_create", temperature, top_k, top_p, seed)

    def sample(self, logits):
        lb = _Buffer(logits, "logits", ("float32",))
        return _lib.call("argus_sampler_sample", self._handle, lb.pointer, int(np.prod(lb.shape)))

    def __del__(self):
        if getattr(self, "_handle", None):
            _lib.lib.argus_sampler_destroy(self._handle)
            self._handle = None


class Model:
    """A Llama or Qwen2 GGUF model: its tokenizer, its tensors, and contexts that run it."""

    def __init__(self, path):
        self._handle = None
        self._handle = _lib.call("argus_model_load", _lib.encode(path))
        self.info = json.loads(_lib.take_string(_lib.call("argus_model_info_json", self._handle)))

    def close(self):
        if self._handle:
            _lib.lib.argus_model_close(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def tokenize(self, text, add_special=True):
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        n = ctypes.c_size_t(0)
        pointer = _lib.call("argus_tokenize", self._handle, data, len(data), int(add_special),
                            ctypes.byref(n))
        if not pointer:
            return []
        try:
            return list(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_int32))[:n.value])
        finally:
            _lib.lib.argus_free(pointer)

    def detokenize(self, tokens):
        array, pointer, n = _tokens(tokens)
        size = ctypes.c_size_t(0)
        text = _lib.call("argus_detokenize", self._handle, pointer, n, ctypes.byref(size))
        try:
            return ctypes.string_at(text, size.value).decode("utf-8", "replace")
        finally:
            _lib.lib.argus_free(text)

    def tensor_names(self):
        return [_lib.lib.argus_model_tensor_name(self._handle, i).decode()
                for i in range(_lib.lib.argus_model_tensor_count(self._handle))]

    def tensor(self, name):
        """The tensor dequantised to float32, shaped as NumPy orders it (GGUF dims reversed)."""
        dims = (ctypes.c_uint64 * 4)()
        n_dims = _lib.call("argus_model_tensor_dims", self._handle, _lib.encode(name), dims)
        shape = tuple(int(dims[i]) for i in reversed(range(n_dims)))
        out = np.empty(shape, dtype=np.float32)
        _lib.call("argus_model_tensor_f32", self._handle, _lib.encode(name), out.ctypes.data,
                  out.size)
        return out

    def context(self, **options):
        return Context(self, **options)


class Context:
    """One sequence of a model with its KV cache in ARGUS (options as `argus run` takes them)."""

    def __init__(self, model, n_ctx=0, threads=0, batch=64, k_codec=None, v_codec=None,
                 page_tokens=256, ram_budget=0, window=0, sinks=0, epsilon=0.0, disk_dir=None,
                 disk_budget=0, profile=None, remote=None):
        lib = _lib.lib
        self._handle, self.model = None, model
        options = lib.argus_context_options_create()
        try:
            lib.argus_context_options_set_n_ctx(options, n_ctx)
            lib.argus_context_options_set_threads(options, threads)
            lib.argus_context_options_set_batch(options, batch)
            lib.argus_context_options_set_codecs(options, _lib.encode(k_codec),
                                                 _lib.encode(v_codec))
            lib.argus_context_options_set_page_tokens(options, page_tokens)
            lib.argus_context_options_set_ram_budget(options, ram_budget)
            lib.argus_context_options_set_attention(options, window, sinks, epsilon)
            if disk_dir is not None:
                lib.argus_context_options_set_disk(options, _lib.encode(disk_dir), disk_budget)
            if profile is not None:
                lib.argus_context_options_set_profile(options, _lib.encode(profile))
            if remote is not None:  # redis://HOST:PORT[/DB], below the disk tier
                lib.argus_context_options_set_remote(options, _lib.encode(remote))
            self._handle = _lib.call("argus_context_create", model._handle, options)
        finally:
            lib.argus_context_options_destroy(options)

    def close(self):
        if self._handle:
            _lib.lib.argus_context_close(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    @property
    def n_past(self):
        return _lib.lib.argus_context_n_past(self._handle)

    def eval(self, tokens, all_logits=False):
        """Logits of the last token [n_vocab] (or of every token), as a new float32 array."""
        array, pointer, n = _tokens(tokens)
        logits = _lib.call("argus_context_eval", self._handle, pointer, n, int(all_logits))
        n_vocab = self.model.info["n_vocab"]
        count = n_vocab * (n if all_logits else 1)
        out = np.ctypeslib.as_array(logits, shape=(count,)).copy()
        return out.reshape(n, n_vocab) if all_logits else out

    def truncate(self, n_tokens):
        _lib.call("argus_context_truncate", self._handle, n_tokens)

    def stats(self):
        return json.loads(_lib.take_string(_lib.call("argus_context_stats_json", self._handle)))

    def load_prefix(self, tokens):
        """Loads stored prefix pages of `tokens` into the empty context; the tokens loaded."""
        array, pointer, n = _tokens(tokens)
        return _lib.call("argus_context_load_prefix", self._handle, pointer, n)

    def store_prefix(self, tokens):
        """Stores the full pages of the evaluated `tokens` (disk, and remote tier when set)."""
        array, pointer, n = _tokens(tokens)
        return _lib.call("argus_context_store_prefix", self._handle, pointer, n)

    def generate(self, prompt, n_predict=128, temperature=0.0, top_k=40, top_p=0.95, seed=0):
        """Text generated after `prompt`: what `argus run` prints for the same options."""
        sampler = Sampler(temperature, top_k, top_p, seed)
        return _lib.take_string(_lib.call("argus_generate", self._handle, _lib.encode(prompt),
                                          n_predict, sampler._handle))
