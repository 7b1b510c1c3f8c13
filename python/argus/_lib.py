"""Loads libargus and declares the C API's prototypes (include/argus/argus.h) for ctypes."""
import ctypes
import ctypes.util
import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent


class ArgusError(RuntimeError):
    """A failure reported by the library; the message names the cause."""


def _candidates():
    env = os.environ.get("ARGUS_LIBRARY")
    if env:
        yield Path(env)
        return
    yield _HERE / "libargus.so.0"
    # cmake --install: PREFIX/lib/python3/dist-packages/argus -> PREFIX/lib.
    yield _HERE.parents[2] / "libargus.so.0"
    # The build tree of a checkout: python/argus -> build/release.
    yield _HERE.parents[1] / "build" / "release" / "libargus.so.0"
    system = ctypes.util.find_library("argus")
    if system:
        yield Path(system)


def _load():
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.exists() or not path.is_absolute():
            try:
                return ctypes.CDLL(str(path))
            except OSError as e:
                tried[-1] += f" ({e})"
    raise ImportError(
        "argus: libargus.so not found (looked in: " + ", ".join(tried) + "); build it with "
        "`make release`, install it with `cmake --install`, or set ARGUS_LIBRARY to its path")


lib = _load()

c_char_pp = ctypes.POINTER(ctypes.c_char_p)
_void_p, _f32_p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_float)
_i32_p, _u16_p = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_uint16)
_u64, _u32, _i64, _size = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int64, ctypes.c_size_t
_err = ctypes.POINTER(ctypes.c_void_p)  # char** errptr, read and freed by call()


class AttentionStats(ctypes.Structure):
    _fields_ = [("n_pages", _u32), ("n_pages_masked", _u32), ("n_tiles", _u64),
                ("n_tiles_skipped", _u64), ("bytes_read", _u64), ("bytes_skipped", _u64),
                ("n_disk_pages_read", _u32), ("disk_bytes_read", _u64),
                ("skipped_mass_bound", ctypes.c_double)]


_PROTOTYPES = {
    "argus_version": (ctypes.c_char_p, []),
    "argus_free": (None, [_void_p]),
    "argus_codec_count": (_size, []),
    "argus_codec_name": (ctypes.c_char_p, [_size]),
    "argus_codec_bits_per_value": (ctypes.c_double, [_size]),
    "argus_codec_is_lossless": (ctypes.c_int, [_size]),
    "argus_codec_spec_bits_per_value": (ctypes.c_double, [ctypes.c_char_p, _u32, _err]),
    "argus_cache_options_create": (_void_p, []),
    "argus_cache_options_destroy": (None, [_void_p]),
    "argus_cache_options_set_geometry": (None, [_void_p, _u32, _u32, _u32, _u32]),
    "argus_cache_options_set_codecs": (None, [_void_p, ctypes.c_char_p, ctypes.c_char_p]),
    "argus_cache_options_set_page_tokens": (None, [_void_p, _u32]),
    "argus_cache_options_set_ram_budget": (None, [_void_p, _u64]),
    "argus_cache_options_set_active_codec": (None, [_void_p, ctypes.c_char_p]),
    "argus_cache_options_set_threads": (None, [_void_p, _u32]),
    "argus_cache_options_set_attention": (None, [_void_p, _u32, _u32, ctypes.c_double]),
    "argus_cache_options_set_disk": (None, [_void_p, ctypes.c_char_p, _u64]),
    "argus_cache_options_set_profile": (None, [_void_p, ctypes.c_char_p]),
    "argus_cache_options_set_placement_sync": (None, [_void_p, ctypes.c_int]),
    "argus_cache_open": (_void_p, [_void_p, _err]),
    "argus_cache_close": (None, [_void_p]),
    "argus_seq_create": (_i64, [_void_p, _err]),
    "argus_seq_release": (None, [_void_p, _i64, _err]),
    "argus_seq_fork": (_i64, [_void_p, _i64, _err]),
    "argus_seq_crop": (None, [_void_p, _i64, _u32, _err]),
    "argus_seq_length": (_i64, [_void_p, _i64, _u32, _err]),
    "argus_seq_append_f32": (None, [_void_p, _i64, _u32, _void_p, _void_p, _u32, _err]),
    "argus_seq_append_f16": (None, [_void_p, _i64, _u32, _void_p, _void_p, _u32, _err]),
    "argus_attend_decode_f32": (None, [_void_p, _i64, _u32, _void_p, _void_p, _err]),
    "argus_attend_prefill_f32": (None, [_void_p, _i64, _u32, _void_p, _u32, _void_p, _err]),
    "argus_seq_read_f32": (None, [_void_p, _i64, _u32, _u32, _u32, _void_p, _void_p, _err]),
    "argus_cache_last_attention_stats": (None, [_void_p, ctypes.POINTER(AttentionStats), _err]),
    "argus_placement_begin": (None, [_void_p, _i64, _u32, _err]),
    "argus_placement_end_step": (None, [_void_p, _err]),
    "argus_seq_move_to_disk": (_i64, [_void_p, _i64, _u32, _u32, _err]),
    "argus_seq_move_to_ram": (_i64, [_void_p, _i64, _u32, _u32, _err]),
    "argus_seq_save": (None, [_void_p, _i64, ctypes.c_char_p, _err]),
    "argus_seq_restore": (_i64, [_void_p, ctypes.c_char_p, _err]),
    "argus_save_erase": (None, [_void_p, ctypes.c_char_p, _err]),
    "argus_prefix_store": (_i64, [_void_p, _i64, ctypes.c_char_p, _void_p, _size, _err]),
    "argus_prefix_load": (_i64, [_void_p, _i64, ctypes.c_char_p, _void_p, _size, _err]),
    "argus_cache_stats_json": (_void_p, [_void_p, _err]),
    "argus_cache_required_ram": (_u64, [_void_p, _u32, _err]),
    "argus_model_load": (_void_p, [ctypes.c_char_p, _err]),
    "argus_model_close": (None, [_void_p]),
    "argus_model_info_json": (_void_p, [_void_p, _err]),
    "argus_model_tensor_count": (_size, [_void_p]),
    "argus_model_tensor_name": (ctypes.c_char_p, [_void_p, _size]),
    "argus_model_tensor_dims": (ctypes.c_int, [_void_p, ctypes.c_char_p,
                                               ctypes.POINTER(_u64), _err]),
    "argus_model_tensor_f32": (None, [_void_p, ctypes.c_char_p, _void_p, _u64, _err]),
    "argus_tokenize": (_void_p, [_void_p, ctypes.c_char_p, _size, ctypes.c_int,
                                 ctypes.POINTER(_size), _err]),
    "argus_detokenize": (_void_p, [_void_p, _void_p, _size, ctypes.POINTER(_size), _err]),
    "argus_context_options_create": (_void_p, []),
    "argus_context_options_destroy": (None, [_void_p]),
    "argus_context_options_set_n_ctx": (None, [_void_p, _u32]),
    "argus_context_options_set_threads": (None, [_void_p, _u32]),
    "argus_context_options_set_batch": (None, [_void_p, _u32]),
    "argus_context_options_set_codecs": (None, [_void_p, ctypes.c_char_p, ctypes.c_char_p]),
    "argus_context_options_set_page_tokens": (None, [_void_p, _u32]),
    "argus_context_options_set_ram_budget": (None, [_void_p, _u64]),
    "argus_context_options_set_attention": (None, [_void_p, _u32, _u32, ctypes.c_double]),
    "argus_context_options_set_disk": (None, [_void_p, ctypes.c_char_p, _u64]),
    "argus_context_options_set_profile": (None, [_void_p, ctypes.c_char_p]),
    "argus_context_options_set_remote": (None, [_void_p, ctypes.c_char_p]),
    "argus_context_create": (_void_p, [_void_p, _void_p, _err]),
    "argus_context_close": (None, [_void_p]),
    "argus_context_eval": (_f32_p, [_void_p, _void_p, _size, ctypes.c_int, _err]),
    "argus_context_n_past": (_u32, [_void_p]),
    "argus_context_truncate": (None, [_void_p, _u32, _err]),
    "argus_context_stats_json": (_void_p, [_void_p, _err]),
    "argus_context_load_prefix": (_i64, [_void_p, _void_p, _size, _err]),
    "argus_context_store_prefix": (_i64, [_void_p, _void_p, _size, _err]),
    "argus_sampler_create": (_void_p, [ctypes.c_float, _u32, ctypes.c_float, _u64, _err]),
    "argus_sampler_destroy": (None, [_void_p]),
    "argus_sampler_sample": (ctypes.c_int32, [_void_p, _void_p, _size, _err]),
    "argus_generate": (_void_p, [_void_p, ctypes.c_char_p, _u32, _void_p, _err]),
}

for _name, (_restype, _argtypes) in _PROTOTYPES.items():
    _function = getattr(lib, _name)
    _function.restype = _restype
    _function.argtypes = _argtypes


def call(name, *args):
    """Calls a C API function taking errptr last; raises ArgusError with its message."""
    err = ctypes.c_void_p(None)
    result = getattr(lib, name)(*args, ctypes.byref(err))
    if err.value:
        message = ctypes.string_at(err.value).decode("utf-8", "replace")
        lib.argus_free(err)
        raise ArgusError(message)
    return result


def take_string(pointer):
    """A malloc'ed NUL-terminated string the library returned, decoded and freed."""
    if not pointer:
        return ""
    try:
        return ctypes.string_at(pointer).decode("utf-8", "replace")
    finally:
        lib.argus_free(pointer)


def encode(text):
    return None if text is None else str(text).encode("utf-8")
