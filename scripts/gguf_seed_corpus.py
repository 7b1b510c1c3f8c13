#!/usr/bin/python3
"""Writes the GGUF fuzzing seed corpus (tests/fuzz/corpus/gguf/): small, varied files for
build/fuzz/argus_gguf_fuzz to start from. All are valid GGUF except the two named invalid_*;
the unit test GgufFuzz.CorpusFilesParseAsTheirNamesSay holds them to that.

The files are written field by field from the GGUF specification (little-endian; tensor data
at aligned offsets in tensor-info order, each tensor padded with zeros to the alignment), not
by ARGUS's own writer, so the corpus does not inherit that writer's assumptions.

Usage: scripts/gguf_seed_corpus.py [--dir tests/fuzz/corpus/gguf]
"""
import argparse
import os
import struct

# GGUF metadata value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FORMAT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
                 BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}

# ggml tensor types used here, with (values, bytes) per block.
GGML = {"f32": (0, 1, 4), "f16": (1, 1, 2), "q4_0": (2, 32, 18), "q4_1": (3, 32, 20),
        "q5_0": (6, 32, 22), "q8_0": (8, 32, 34), "q4_K": (12, 256, 144), "q6_K": (14, 256, 210),
        "i8": (24, 1, 1), "i16": (25, 1, 2), "bf16": (30, 1, 2), "tq1_0": (34, 256, 54)}


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def string(s):
    b = s if isinstance(s, bytes) else s.encode()
    return u64(len(b)) + b


def pattern(n, salt):
    """n bytes that differ per position."""
    return bytes((i * 7 + salt) & 0xFF for i in range(n))


def pad(data, alignment):
    return data + bytes(-len(data) % alignment)


def value(vtype, v):
    if vtype == STRING:
        return string(v)
    return struct.pack(SCALAR_FORMAT[vtype], v)


def metadata(key, vtype, v, element=None):
    out = string(key) + u32(vtype)
    if vtype != ARRAY:
        return out + value(vtype, v)
    return out + u32(element) + u64(len(v)) + b"".join(value(element, x) for x in v)


def tensor_info(name, dims, ggml_type, offset):
    return string(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(ggml_type) + \
        u64(offset)


def header(n_tensors, n_metadata, version=3):
    return b"GGUF" + u32(version) + u64(n_tensors) + u64(n_metadata)


def gguf(kvs=(), tensors=(), alignment=32):
    """A v3 file as a writer lays it out. kvs: (key, type, value[, element]); tensors:
    (name, type name, dims, data)."""
    kvs = list(kvs)
    if alignment != 32:
        kvs.insert(0, ("general.alignment", U32, alignment))
    out = header(len(tensors), len(kvs)) + b"".join(metadata(*kv) for kv in kvs)
    offset = 0
    for name, type_name, dims, data in tensors:
        ggml_type, block_values, block_bytes = GGML[type_name]
        n_values = 1
        for d in dims:
            n_values *= d
        assert dims[0] % block_values == 0 and len(data) == n_values // block_values * block_bytes
        out += tensor_info(name, dims, ggml_type, offset)
        offset += len(pad(data, alignment))
    if not tensors:
        return out
    out = pad(out, alignment)
    for _, _, _, data in tensors:
        out += pad(data, alignment)
    return out


def every_metadata_type():
    """Every metadata type, and arrays of every element type, with their extreme values."""
    i64_min, i64_max = -(1 << 63), (1 << 63) - 1
    return [
        ("u8", U8, 255), ("i8", I8, -128), ("u16", U16, 65535), ("i16", I16, -32768),
        ("u32", U32, 4294967295), ("i32", I32, -2147483648), ("f32", F32, -1.25e-5),
        ("bool.true", BOOL, 1), ("bool.false", BOOL, 0),
        ("string", STRING, b"nul\0and \xff\xfe bytes"), ("string.empty", STRING, b""),
        ("u64", U64, (1 << 64) - 1), ("i64", I64, i64_min), ("f64", F64, 3.141592653589793),
        ("array.u8", ARRAY, [0, 1, 255], U8), ("array.i8", ARRAY, [-128, 0, 127], I8),
        ("array.u16", ARRAY, [65535, 7], U16), ("array.i16", ARRAY, [-32768, 32767], I16),
        ("array.u32", ARRAY, [4294967295, 0], U32),
        ("array.i32", ARRAY, [-2147483648, 2147483647], I32),
        ("array.f32", ARRAY, [0.5, -2.0, 1e30], F32), ("array.bool", ARRAY, [1, 0, 1], BOOL),
        ("array.string", ARRAY, ["", "a", "x" * 300], STRING),
        ("array.u64", ARRAY, [i64_max, 0], U64), ("array.i64", ARRAY, [i64_min, i64_max], I64),
        ("array.f64", ARRAY, [1.0 / 3.0, -0.0], F64), ("array.empty", ARRAY, [], U32),
    ]


def odd_tensors():
    """Odd shapes of several types; sizes from ggml's block structs."""
    specs = [("f32.3x5", "f32", [3, 5], 60), ("f16.7", "f16", [7], 14),
             ("q8_0.64x3", "q8_0", [64, 3], 6 * 34), ("q4_0.32x1x2", "q4_0", [32, 1, 2], 2 * 18),
             ("q4_K.256x2", "q4_K", [256, 2], 2 * 144), ("i8.5x1x1x3", "i8", [5, 1, 1, 3], 15),
             ("bf16.1", "bf16", [1], 2), ("tq1_0.256", "tq1_0", [256], 54)]
    return [(name, t, dims, pattern(n, salt)) for salt, (name, t, dims, n) in enumerate(specs, 1)]


def small_f32():
    """A valid one-tensor file: one string key, tensor "t" of 8 f32 at offset 0."""
    out = header(1, 1) + metadata("general.architecture", STRING, "llama")
    return pad(out + tensor_info("t", [8], 0, 0), 32) + pattern(32, 1)


def seed_files():
    seeds = {"empty_v3": header(0, 0)}
    v2 = header(1, 1, 2) + metadata("general.name", STRING, "v2") + tensor_info("w", [4], 0, 0)
    seeds["one_tensor_v2"] = pad(v2, 32) + pattern(32, 3)
    seeds["every_metadata_type"] = gguf(every_metadata_type())
    seeds["odd_tensors_align64"] = gguf(tensors=odd_tensors(), alignment=64)
    seeds["align1"] = gguf(tensors=[("a", "i8", [3], pattern(3, 1)),
                                    ("b", "i16", [2, 2], pattern(8, 2))], alignment=1)
    seeds["tiny_llama"] = gguf(
        [("general.architecture", STRING, "llama"), ("llama.block_count", U32, 1),
         ("llama.embedding_length", U32, 32), ("llama.attention.head_count", U32, 4),
         ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
         ("tokenizer.ggml.model", STRING, "llama"),
         ("tokenizer.ggml.tokens", ARRAY, ["<unk>", "<s>", "</s>", "\u2581the", "a"], STRING),
         ("tokenizer.ggml.scores", ARRAY, [0, 0, 0, -1.5, -2], F32),
         ("tokenizer.ggml.token_type", ARRAY, [2, 3, 3, 1, 1], I32)],
        [("token_embd.weight", "f32", [32, 5], pattern(640, 4)),
         ("blk.0.attn_q.weight", "q8_0", [32, 32], pattern(32 * 34, 5)),
         ("output_norm.weight", "f16", [32], pattern(64, 6))])
    seeds["twenty_tensors"] = gguf(tensors=[(f"t{i}", "f32", [1], pattern(4, 7))
                                            for i in range(20)])
    seeds["quant_types_align128"] = gguf(
        [("flag", BOOL, 1)],
        [("q4_1", "q4_1", [32, 2], pattern(40, 8)), ("q5_0", "q5_0", [32], pattern(22, 9)),
         ("q6_K", "q6_K", [256], pattern(210, 10))], alignment=128)
    # Tensor data out of info order, with a gap: valid, though no writer lays it out so.
    shuffled = header(2, 0) + tensor_info("late", [8], 0, 64) + tensor_info("early", [2, 2], 0, 0)
    seeds["out_of_order_tensors"] = pad(shuffled, 32) + pattern(96, 11)
    seeds["small_f32"] = small_f32()
    seeds["invalid_truncated"] = small_f32()[:-5]
    # A string length of 2^40 in a 45-byte file.
    seeds["invalid_huge_string"] = header(0, 1) + string("k") + u32(STRING) + u64(1 << 40)
    return seeds


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=os.path.join(root, "tests/fuzz/corpus/gguf"))
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    for name, data in seed_files().items():
        assert len(data) <= 4096, name
        with open(os.path.join(args.dir, name + ".gguf"), "wb") as f:
            f.write(data)
    print(f"{len(seed_files())} seed files in {args.dir}")


if __name__ == "__main__":
    main()
