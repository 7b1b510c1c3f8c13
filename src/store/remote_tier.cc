// The remote tier on Redis (hiredis): URL parsing, the checksummed value format, MGET reads,
// pipelined writes, and a connection that backs off while the server is unreachable.
#include "argus/remote.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "argus/core.h"
#include "core/byte_codec.h"
#include "core/checksum.h"

namespace argus {
namespace {

constexpr char kValueMagic[8] = {'A', 'R', 'G', 'U', 'S', 'R', 'V', '1'};
constexpr uint32_t kValueVersion = 1;

using Clock = std::chrono::steady_clock;

struct RedisUrl {
  std::string host, user, password;
  int port = 6379;
  int db = 0;
  std::string name;  // the URL without its password
};

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(std::string_view s, std::string_view what) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size())
      return Status::InvalidArgument(std::string(what) + ": a '%' not followed by two hex digits");
    const int hi = HexDigit(s[i + 1]), lo = HexDigit(s[i + 2]);
    if (hi < 0 || lo < 0)
      return Status::InvalidArgument(std::string(what) + ": a '%' not followed by two hex digits");
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

Result<int> ParseInt(std::string_view s, int lo, int hi, std::string_view what) {
  int value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || value < lo || value > hi) {
    return Status::InvalidArgument(std::string(what) + " '" + std::string(s) + "' is not a number in " +
                                   std::to_string(lo) + ".." + std::to_string(hi));
  }
  return value;
}

Result<RedisUrl> ParseUrl(std::string_view url) {
  const std::string what = "remote URL";
  constexpr std::string_view kScheme = "redis://", kTls = "rediss://";
  if (url.starts_with(kTls)) {
    return Status::Unsupported(what + " " + std::string(kTls) +
                               "…: TLS needs hiredis 1.0 or later; this build has hiredis " +
                               std::to_string(HIREDIS_MAJOR) + "." + std::to_string(HIREDIS_MINOR));
  }
  if (!url.starts_with(kScheme)) {
    return Status::InvalidArgument(what + " '" + std::string(url) +
                                   "' does not start with redis://");
  }
  RedisUrl u;
  std::string_view rest = url.substr(kScheme.size());
  std::string_view path;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }
  std::string_view userinfo;
  if (size_t at = rest.rfind('@'); at != std::string_view::npos) {
    userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
  }
  std::string_view host = rest, port;
  if (rest.starts_with('[')) {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string_view::npos)
      return Status::InvalidArgument(what + ": '[' without ']' in the host");
    host = rest.substr(1, close - 1);
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return Status::InvalidArgument(what + ": junk after the host");
      port = after.substr(1);
    }
  } else if (size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return Status::InvalidArgument(what + " '" + std::string(url) + "' has no host");
  u.host = std::string(host);
  if (!port.empty()) {
    ARGUS_ASSIGN_OR_RETURN(u.port, ParseInt(port, 1, 65535, what + ": port"));
  }
  if (!path.empty()) {
    ARGUS_ASSIGN_OR_RETURN(u.db, ParseInt(path, 0, 1 << 20, what + ": database"));
  }
  if (!userinfo.empty()) {
    const size_t colon = userinfo.find(':');
    ARGUS_ASSIGN_OR_RETURN(u.user, PercentDecode(userinfo.substr(0, colon), what + ": user"));
    if (colon != std::string_view::npos) {
      ARGUS_ASSIGN_OR_RETURN(u.password,
                             PercentDecode(userinfo.substr(colon + 1), what + ": password"));
    }
  }
  if (u.password.empty()) {
    if (const char* env = std::getenv("ARGUS_REDIS_PASSWORD"); env != nullptr) u.password = env;
  }
  u.name = "redis://" + (u.user.empty() ? "" : u.user + "@") +
           (u.host.find(':') != std::string::npos ? "[" + u.host + "]" : u.host) + ":" +
           std::to_string(u.port) + "/" + std::to_string(u.db);
  return u;
}

timeval Timeval(double seconds) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

// hiredis writes with write(2): a server gone away raises SIGPIPE, which would end the process.
// The signal is blocked in this thread for the call and a SIGPIPE the call raised is consumed.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      (void)sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

}  // namespace

std::vector<std::byte> EncodeRemoteValue(const PageKey& key, std::string_view tag,
                                         std::span<const std::byte> payload) {
  ByteWriter w;
  for (char c : kValueMagic) w.Put(c);
  w.Put(kValueVersion).Put(key.hi).Put(key.lo).PutString(tag);
  w.Put(static_cast<uint64_t>(payload.size())).Put(Checksum64(payload));
  w.Put(Checksum64(w.bytes()));
  w.bytes().reserve(w.bytes().size() + payload.size());
  w.PutBytes(payload);
  return std::move(w.bytes());
}

Result<std::span<const std::byte>> DecodeRemoteValue(std::span<const std::byte> value,
                                                     const PageKey& key, std::string_view tag) {
  ByteReader r(value, "remote page " + key.ToString());
  for (char c : kValueMagic) {
    ARGUS_ASSIGN_OR_RETURN(char got, r.Get<char>("magic"));
    if (got != c) return r.Corrupt("bad magic");
  }
  ARGUS_ASSIGN_OR_RETURN(uint32_t version, r.Get<uint32_t>("format version"));
  if (version != kValueVersion)
    return r.Corrupt("format version " + std::to_string(version) + ", this build reads 1");
  ARGUS_ASSIGN_OR_RETURN(uint64_t hi, r.Get<uint64_t>("key"));
  ARGUS_ASSIGN_OR_RETURN(uint64_t lo, r.Get<uint64_t>("key"));
  if (hi != key.hi || lo != key.lo)
    return r.Corrupt("the value is page " + PageKey{hi, lo}.ToString() + "'s");
  ARGUS_ASSIGN_OR_RETURN(std::string got_tag, r.GetString("tag"));
  if (got_tag != tag)
    return r.Corrupt("tag '" + got_tag + "', expected '" + std::string(tag) + "'");
  ARGUS_ASSIGN_OR_RETURN(uint64_t n_payload, r.Get<uint64_t>("payload length"));
  ARGUS_ASSIGN_OR_RETURN(uint64_t payload_sum, r.Get<uint64_t>("payload checksum"));
  const size_t header_bytes = value.size() - r.remaining();
  ARGUS_ASSIGN_OR_RETURN(uint64_t header_sum, r.Get<uint64_t>("header checksum"));
  if (Checksum64(value.first(header_bytes)) != header_sum) return r.Corrupt("header checksum");
  if (n_payload != r.remaining()) {
    return r.Corrupt("payload of " + std::to_string(r.remaining()) + " bytes, header says " +
                     std::to_string(n_payload));
  }
  std::span<const std::byte> payload = value.last(r.remaining());
  if (Checksum64(payload) != payload_sum) return r.Corrupt("payload checksum mismatch");
  return payload;
}

struct RemoteTier::Impl {
  RemoteTierOptions options;
  RedisUrl url;
  mutable std::mutex mu;
  redisContext* redis = nullptr;
  Clock::time_point down_until{};
  double backoff_s = 0;
  RemoteTierStats stats;
  bool warned_server = false, warned_damaged = false;

  ~Impl() { Disconnect(); }

  void Disconnect() {
    if (redis != nullptr) redisFree(redis);
    redis = nullptr;
  }

  void Warn(bool& warned, const Status& status) {
    if (warned) return;
    warned = true;
    if (options.on_warning) options.on_warning(status);
  }

  // A connection or call failed: drop the connection and stay down for the backoff.
  void Down(const std::string& why) {
    Disconnect();
    ++stats.n_errors;
    backoff_s = backoff_s == 0 ? options.retry_initial_s
                               : std::min(options.retry_max_s, backoff_s * 2);
    down_until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(backoff_s));
    char retry[32];
    std::snprintf(retry, sizeof retry, "%.1f", backoff_s);
    Warn(warned_server, Status::IOError("remote tier " + url.name + ": " + why +
                                        "; pages are misses, retrying in " + retry +
                                        " s and later"));
  }

  std::string ContextError() const {
    return redis != nullptr && redis->err != 0 ? std::string(redis->errstr) : "no reply";
  }

  // One command, one round trip; nullptr (and down) on a connection failure.
  Reply Command(std::vector<const char*>& argv, std::vector<size_t>& lens, const char* what) {
    ++stats.n_round_trips;
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(redis, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) {
      Down(std::string(what) + " failed: " + ContextError());
      return nullptr;
    }
    return Reply(r);
  }

  // True when connected (connecting first when the backoff allows).
  bool Ready() {
    if (redis != nullptr) return true;
    if (Clock::now() < down_until) {
      ++stats.n_skipped;
      return false;
    }
    redis = redisConnectWithTimeout(url.host.c_str(), url.port, Timeval(options.timeout_s));
    if (redis == nullptr || redis->err != 0) {
      Down("cannot connect: " + ContextError());
      return false;
    }
    if (redisSetTimeout(redis, Timeval(options.timeout_s)) != REDIS_OK) {
      Down("cannot set the timeout: " + ContextError());
      return false;
    }
    auto simple = [&](std::vector<std::string> args, const char* what) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (const std::string& a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      Reply r = Command(argv, lens, what);
      if (r == nullptr) return false;
      if (r->type == REDIS_REPLY_ERROR) {
        Down(std::string(what) + " refused: " + std::string(r->str, r->len));
        return false;
      }
      return true;
    };
    if (!url.password.empty()) {
      std::vector<std::string> args = {"AUTH"};
      if (!url.user.empty()) args.push_back(url.user);
      args.push_back(url.password);
      if (!simple(std::move(args), "AUTH")) return false;
    }
    if (url.db != 0 && !simple({"SELECT", std::to_string(url.db)}, "SELECT")) return false;
    ++stats.n_connects;
    backoff_s = 0;
    return true;
  }

  std::string RedisKey(const PageKey& key) const { return options.key_prefix + key.ToString(); }
};

RemoteTier::RemoteTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteTier::~RemoteTier() = default;

Result<std::unique_ptr<RemoteTier>> RemoteTier::Open(const RemoteTierOptions& options) {
  if (!(options.timeout_s > 0) || !(options.retry_initial_s > 0) ||
      !(options.retry_max_s >= options.retry_initial_s)) {
    return Status::InvalidArgument(
        "remote tier: timeout and backoff must be positive, retry_max_s >= retry_initial_s");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ARGUS_ASSIGN_OR_RETURN(impl->url, ParseUrl(options.url));
  {
    SigpipeGuard guard;
    (void)impl->Ready();  // unreachable now: down, warned, retried later
  }
  return std::unique_ptr<RemoteTier>(new RemoteTier(std::move(impl)));
}

std::vector<std::vector<std::byte>> RemoteTier::Get(std::span<const PageKey> keys,
                                                     std::string_view tag) {
  Impl& s = *impl_;
  std::vector<std::vector<std::byte>> out(keys.size());
  if (keys.empty()) return out;
  std::lock_guard lock(s.mu);
  SigpipeGuard guard;
  s.stats.n_misses += keys.size();  // taken back below for each hit
  if (!s.Ready()) return out;
  std::vector<std::string> names;
  names.reserve(keys.size());
  std::vector<const char*> argv = {"MGET"};
  std::vector<size_t> lens = {4};
  for (const PageKey& key : keys) names.push_back(s.RedisKey(key));
  for (const std::string& name : names) {
    argv.push_back(name.data());
    lens.push_back(name.size());
  }
  Reply r = s.Command(argv, lens, "MGET");
  if (r == nullptr) return out;
  if (r->type != REDIS_REPLY_ARRAY || r->elements != keys.size()) {
    ++s.stats.n_errors;
    s.Warn(s.warned_server, Status::IOError("remote tier " + s.url.name + ": MGET answered " +
                                            (r->type == REDIS_REPLY_ERROR
                                                 ? std::string(r->str, r->len)
                                                 : std::string("an unexpected reply"))));
    return out;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    const redisReply* e = r->element[i];
    if (e->type != REDIS_REPLY_STRING) continue;  // nil: not stored (or evicted)
    const auto value = std::as_bytes(std::span(e->str, e->len));
    s.stats.read_bytes += value.size();
    auto payload = DecodeRemoteValue(value, keys[i], tag);
    if (!payload.ok()) {
      ++s.stats.n_damaged;
      s.Warn(s.warned_damaged, payload.status().WithContext("remote tier " + s.url.name +
                                                            ": value refused, a miss"));
      continue;
    }
    out[i].assign(payload->begin(), payload->end());
    ++s.stats.n_hits;
    --s.stats.n_misses;
  }
  return out;
}

std::vector<bool> RemoteTier::Contains(std::span<const PageKey> keys) {
  Impl& s = *impl_;
  std::vector<bool> out(keys.size(), false);
  if (keys.empty()) return out;
  std::lock_guard lock(s.mu);
  SigpipeGuard guard;
  if (!s.Ready()) return out;
  for (const PageKey& key : keys) {
    const std::string name = s.RedisKey(key);
    const char* argv[] = {"EXISTS", name.data()};
    const size_t lens[] = {6, name.size()};
    if (redisAppendCommandArgv(s.redis, 2, argv, lens) != REDIS_OK) {
      s.Down("EXISTS failed: " + s.ContextError());
      return std::vector<bool>(keys.size(), false);
    }
  }
  ++s.stats.n_round_trips;
  for (size_t i = 0; i < keys.size(); ++i) {
    void* reply = nullptr;
    if (redisGetReply(s.redis, &reply) != REDIS_OK || reply == nullptr) {
      s.Down("EXISTS failed: " + s.ContextError());
      return std::vector<bool>(keys.size(), false);
    }
    Reply r(static_cast<redisReply*>(reply));
    out[i] = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
  }
  return out;
}

size_t RemoteTier::Put(std::span<const PagePut> pages) {
  Impl& s = *impl_;
  if (pages.empty()) return 0;
  std::lock_guard lock(s.mu);
  SigpipeGuard guard;
  if (!s.Ready()) return 0;
  std::vector<size_t> value_bytes;
  for (const PagePut& page : pages) {
    const std::string name = s.RedisKey(page.key);
    const std::vector<std::byte> value = EncodeRemoteValue(page.key, page.tag, page.payload);
    const char* argv[] = {"SET", name.data(), reinterpret_cast<const char*>(value.data())};
    const size_t lens[] = {3, name.size(), value.size()};
    // hiredis copies the command into its output buffer: the value may go now.
    if (redisAppendCommandArgv(s.redis, 3, argv, lens) != REDIS_OK) {
      s.Down("SET failed: " + s.ContextError());
      return 0;
    }
    value_bytes.push_back(value.size());
  }
  ++s.stats.n_round_trips;
  size_t n_written = 0;
  for (size_t i = 0; i < pages.size(); ++i) {
    void* reply = nullptr;
    if (redisGetReply(s.redis, &reply) != REDIS_OK || reply == nullptr) {
      s.Down("SET failed: " + s.ContextError());
      return n_written;
    }
    Reply r(static_cast<redisReply*>(reply));
    if (r->type == REDIS_REPLY_ERROR) {
      // OOM under maxmemory with noeviction, a read-only replica: the page is not shared.
      ++s.stats.n_errors;
      s.Warn(s.warned_server, Status::IOError("remote tier " + s.url.name +
                                              ": SET refused: " + std::string(r->str, r->len)));
      continue;
    }
    ++n_written;
    ++s.stats.n_written;
    s.stats.written_bytes += value_bytes[i];
  }
  return n_written;
}

bool RemoteTier::available() const {
  std::lock_guard lock(impl_->mu);
  return impl_->redis != nullptr || Clock::now() >= impl_->down_until;
}

RemoteTierStats RemoteTier::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->stats;
}

const std::string& RemoteTier::name() const { return impl_->url.name; }

}  // namespace argus
