// argus codecs / argus codec encode / argus codec decode.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "argus/codec.h"
#include "cli/commands.h"
#include "core/files.h"
#include "core/npy.h"

namespace argus::cli {
namespace {

std::string_view RoleName(CodecRole role) {
  switch (role) {
    case CodecRole::kKeys:
      return "K";
    case CodecRole::kValues:
      return "V";
    case CodecRole::kBoth:
      return "K/V";
  }
  return "?";
}

// Options shared by encode and decode: the codec spec and its modifiers.
struct SpecOptions {
  std::string codec;
  std::string group_by;
  bool rotate = false, center = false;

  void Add(CLI::App* cmd) {
    cmd->add_option("--codec", codec, "Codec name or spec, e.g. q4_0, int4:channel, q4_0+rot")
        ->required();
    cmd->add_option("--group-by", group_by, "Grouping of int8/int4/int2: token or channel")
        ->check(CLI::IsMember({"token", "channel"}));
    cmd->add_flag("--rotate", rotate, "Hadamard-rotate the head dimension (codecs of <= 8 bits)");
    cmd->add_flag("--center", center, "Subtract the per-tile channel mean (codecs of <= 8 bits)");
  }
  std::unique_ptr<Codec> Create() const {
    CodecSpec spec = ValueOrThrow(CodecSpec::Parse(codec));
    if (!group_by.empty()) {
      spec.grouping = group_by == "channel" ? Grouping::kChannel : Grouping::kToken;
      spec.grouping_given = true;
    }
    spec.rotate = spec.rotate || rotate;
    spec.center = spec.center || center;
    return ValueOrThrow(CodecRegistry::Default().Create(spec));
  }
};

void RunEncode(const SpecOptions& spec, const std::string& in_path, const std::string& out_path) {
  auto codec = spec.Create();
  NpyArray array = ValueOrThrow(ReadNpy(in_path));
  if (array.shape.size() != 2) {
    throw CommandError{Status::InvalidArgument(in_path +
                                               ": expected a 2-D array [tokens, head_dim], got " +
                                               std::to_string(array.shape.size()) + " dimensions")};
  }
  if (array.shape[0] > kMaxTileTokens || array.shape[1] > kMaxTileDim || array.shape[0] == 0 ||
      array.shape[1] == 0) {
    throw CommandError{Status::InvalidArgument(
        fmt::format("{}: shape [{}, {}] is outside a tile's limits "
                    "(tokens 1..{}, head_dim 1..{})",
                    in_path, array.shape[0], array.shape[1], kMaxTileTokens, kMaxTileDim))};
  }
  TileShape shape{static_cast<uint32_t>(array.shape[0]), static_cast<uint32_t>(array.shape[1])};
  std::vector<float> x = array.ToFloat();
  std::vector<std::byte> tile(ValueOrThrow(codec->encoded_size(shape)));
  ThrowIfError(codec->encode(x.data(), shape, tile));
  std::vector<float> back(x.size());
  ThrowIfError(codec->decode(tile, shape, back.data()));
  // A finite value beyond the codec's range (f16 above 65504, a q8_0 scale that overflows f16)
  // decodes to Inf or NaN: such a tile is refused, not written. The largest input names the
  // cause (a block's scale turns every value of the block into NaN).
  const auto bad =
      std::find_if(back.begin(), back.end(), [](float v) { return !std::isfinite(v); });
  if (bad != back.end() &&
      std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); })) {
    const size_t i = static_cast<size_t>(
        std::max_element(x.begin(), x.end(),
                         [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
        x.begin());
    throw CommandError{Status::InvalidArgument(fmt::format(
        "{}: value {} at token {}, channel {} is beyond the range of codec {} (the tile decodes "
        "to {}); nothing written",
        in_path, x[i], i / shape.dim, i % shape.dim, codec->info().name, *bad))};
  }
  ThrowIfError(WriteFileBytes(out_path, tile));
  // Statistics go to stderr: the reconstruction error the codec made on this input.
  double err2 = 0, ref2 = 0, max_abs = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double e = double{back[i]} - x[i];
    err2 += e * e;
    ref2 += double{x[i]} * x[i];
    max_abs = std::max(max_abs, std::fabs(e));
  }
  fmt::print(
      stderr,
      "{}: [{}, {}] -> {} bytes ({:.3f} bits/value), relative RMSE {:.3e}, max |error| {:.3e}\n",
      codec->info().name, shape.tokens, shape.dim, tile.size(), tile.size() * 8.0 / x.size(),
      ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0, max_abs);
}

void RunDecode(const SpecOptions& spec, const std::string& shape_text, const std::string& in_path,
               const std::string& out_path) {
  auto codec = spec.Create();
  unsigned long tokens = 0, dim = 0;
  char extra = 0;
  if (std::sscanf(shape_text.c_str(), "%lu,%lu%c", &tokens, &dim, &extra) != 2) {
    throw CommandError{
        Status::InvalidArgument("--shape '" + shape_text + "' is not T,D (e.g. 256,128)")};
  }
  if (tokens > kMaxTileTokens || dim > kMaxTileDim) {
    throw CommandError{
        Status::InvalidArgument("--shape " + shape_text + " is outside a tile's limits")};
  }
  TileShape shape{static_cast<uint32_t>(tokens), static_cast<uint32_t>(dim)};
  auto bytes = ValueOrThrow(ReadFileBytes(in_path));
  std::vector<float> x(shape.n_values());
  ThrowIfError(codec->decode(bytes, shape, x.data()).WithContext(in_path));
  ThrowIfError(WriteNpy(out_path, NpyArray::FromFloat({tokens, dim}, x)));
  fmt::print(stderr, "{}: {} bytes -> [{}, {}] float32\n", codec->info().name, bytes.size(), tokens,
             dim);
}

}  // namespace

void AddCodecsCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("codecs", "List the registered codecs");
  cmd->callback([] {
    fmt::print("{:<16} {:>9} {:>8} {:>5} {:>7}  {}\n", "codec", "bits/val", "lossless", "for",
               "kernel", "what it is for");
    // One row per codec and per grouping it offers (int4 and int4:channel differ in purpose).
    for (const CodecInfo& registered : CodecRegistry::Default().List()) {
      std::vector<std::string> specs = {registered.name};
      if (registered.groupable) specs.push_back(registered.name + ":channel");
      for (const std::string& spec : specs) {
        auto codec = CodecRegistry::Default().Create(spec);
        if (!codec.ok()) {  // a registered codec that cannot be made is shown, not hidden
          fmt::print("{:<16} {}\n", spec, codec.status().ToString());
          continue;
        }
        const CodecInfo& info = (*codec)->info();
        fmt::print("{:<16} {:>9.3f} {:>8} {:>5} {:>7}  {}\n", info.name, info.bits_per_value,
                   info.lossless ? "yes" : "no", RoleName(info.role),
                   KernelPathName((*codec)->kernel_path()), info.summary);
      }
    }
    fmt::print(
        "\nbits/val: including scales and headers, for a 256-token x 128-dim tile.\n"
        "Specs: NAME[:token|:channel][+rot][+center], e.g. int4:channel, q4_0+rot+center.\n");
  });
}

void AddCodecCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("codec", "Encode or decode one tile with a codec");
  cmd->require_subcommand(1);

  struct EncodeOptions {
    SpecOptions spec;
    std::string in, out;
  };
  auto enc = std::make_shared<EncodeOptions>();
  auto* encode =
      cmd->add_subcommand("encode", "Encode a 2-D float .npy [tokens, head_dim] into a tile");
  enc->spec.Add(encode);
  encode->add_option("in", enc->in, "Input .npy (float32, float16 or uint8)")
      ->required()
      ->check(CLI::ExistingFile);
  encode->add_option("out", enc->out, "Output tile (.bin)")->required();
  encode->callback([enc] { RunEncode(enc->spec, enc->in, enc->out); });

  struct DecodeOptions {
    SpecOptions spec;
    std::string shape, in, out;
  };
  auto dec = std::make_shared<DecodeOptions>();
  auto* decode = cmd->add_subcommand("decode", "Decode a tile into a float32 .npy");
  dec->spec.Add(decode);
  decode->add_option("--shape", dec->shape, "Tile shape T,D (tokens, head_dim)")->required();
  decode->add_option("in", dec->in, "Input tile (.bin)")->required()->check(CLI::ExistingFile);
  decode->add_option("out", dec->out, "Output .npy")->required();
  decode->callback([dec] { RunDecode(dec->spec, dec->shape, dec->in, dec->out); });
}

}  // namespace argus::cli
