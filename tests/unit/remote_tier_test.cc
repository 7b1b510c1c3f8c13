// The remote tier against a real redis-server of each test's own: values verified byte for byte,
// one round trip per batch, and every failure (down, slow, full, damaged, foreign) a miss.
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "argus/remote.h"
#include "redis_server.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::RedisServer;
using testing::RespClient;

std::vector<std::byte> Payload(size_t n, uint8_t salt) {
  std::vector<std::byte> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = std::byte(static_cast<uint8_t>(i * 31 + salt));
  return p;
}

PageKey Key(uint64_t i) { return {0xA5A5000000000000ull + i, 0x1234567890ABCDEFull ^ i}; }

struct Warnings {
  std::vector<std::string> messages;
  std::function<void(const Status&)> callback() {
    return [this](const Status& s) { messages.push_back(s.ToString()); };
  }
};

std::unique_ptr<RemoteTier> OpenTier(const std::string& url, Warnings* warnings = nullptr,
                                     double timeout_s = 1.0) {
  RemoteTierOptions o;
  o.url = url;
  o.timeout_s = timeout_s;
  o.retry_initial_s = 0.2;
  o.retry_max_s = 0.4;
  if (warnings != nullptr) o.on_warning = warnings->callback();
  auto tier = RemoteTier::Open(o);
  EXPECT_TRUE(tier.ok()) << tier.status().ToString();
  return tier.ok() ? std::move(*tier) : nullptr;
}

// Each test's own redis-server.
class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ARGUS_SKIP_WITHOUT_REDIS();
    server_ = std::make_unique<RedisServer>();
    ASSERT_TRUE(server_->ok());
  }
  std::unique_ptr<RedisServer> server_;
};

// ---- the value format, without a server ----

TEST(RemoteValue, RoundTripsAndEveryFlippedByteIsRefused) {
  const auto payload = Payload(300, 7);
  const std::vector<std::byte> value = EncodeRemoteValue(Key(1), "q8_0/q8_0", payload);
  auto decoded = DecodeRemoteValue(value, Key(1), "q8_0/q8_0");
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(std::equal(decoded->begin(), decoded->end(), payload.begin(), payload.end()));
  for (size_t i = 0; i < value.size(); ++i) {
    std::vector<std::byte> damaged = value;
    damaged[i] ^= std::byte{0x10};
    auto r = DecodeRemoteValue(damaged, Key(1), "q8_0/q8_0");
    ASSERT_FALSE(r.ok()) << "byte " << i << " flipped was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  }
  for (size_t n = 0; n < value.size(); ++n) {  // every truncation
    EXPECT_FALSE(DecodeRemoteValue(std::span(value).first(n), Key(1), "q8_0/q8_0").ok()) << n;
  }
}

TEST(RemoteValue, AnotherKeyOrCodecPairIsRefusedNamingIt) {
  const std::vector<std::byte> value = EncodeRemoteValue(Key(1), "f16/f16", Payload(64, 1));
  auto other_key = DecodeRemoteValue(value, Key(2), "f16/f16");
  ASSERT_FALSE(other_key.ok());
  EXPECT_NE(other_key.status().message().find(Key(1).ToString()), std::string::npos)
      << other_key.status().ToString();
  auto other_tag = DecodeRemoteValue(value, Key(1), "q8_0/q8_0");
  ASSERT_FALSE(other_tag.ok());
  EXPECT_NE(other_tag.status().message().find("tag 'f16/f16'"), std::string::npos)
      << other_tag.status().ToString();
}

TEST(RemoteTierUrl, MalformedUrlsAreInvalidAndTlsIsUnsupported) {
  for (const char* url : {"http://x:1", "redis://", "redis://h:0", "redis://h:99999",
                          "redis://h:12/x", "redis://h:1/-1", "redis://:%zz@h:1", "redis://[::1"}) {
    RemoteTierOptions o;
    o.url = url;
    auto tier = RemoteTier::Open(o);
    ASSERT_FALSE(tier.ok()) << url;
    EXPECT_EQ(tier.status().code(), StatusCode::kInvalidArgument) << url;
  }
  RemoteTierOptions tls;
  tls.url = "rediss://127.0.0.1:6380";
  auto tier = RemoteTier::Open(tls);
  ASSERT_FALSE(tier.ok());
  EXPECT_EQ(tier.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(tier.status().message().find("hiredis"), std::string::npos) << tier.status().ToString();
}

// Nothing listens: Open succeeds, calls are misses, warned once, and while backing off the
// calls do not even try to connect.
TEST(RemoteTierDown, ConnectionRefusedIsAMissWarnedOnceThenBacksOff) {
  Warnings warnings;
  RemoteTierOptions o;
  o.url = "redis://127.0.0.1:" + std::to_string(RedisServer::FreePort());
  o.retry_initial_s = 30;
  o.retry_max_s = 60;
  o.on_warning = warnings.callback();
  auto tier = RemoteTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_FALSE((*tier)->available());
  const std::vector<PageKey> keys = {Key(1), Key(2)};
  for (int i = 0; i < 3; ++i) {
    auto got = (*tier)->Get(keys, "f16/f16");
    EXPECT_TRUE(got[0].empty() && got[1].empty());
  }
  const auto payload = Payload(10, 1);
  EXPECT_EQ((*tier)->Put({Key(1), "f16/f16", payload}), 0u);
  const RemoteTierStats s = (*tier)->stats();
  EXPECT_EQ(s.n_errors, 1u);   // the one connect at Open
  EXPECT_EQ(s.n_skipped, 4u);  // three reads and a write answered at once
  EXPECT_EQ(s.n_misses, 6u);
  EXPECT_EQ(s.n_round_trips, 0u);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("cannot connect"), std::string::npos) << warnings.messages[0];
}

TEST_F(RemoteTierTest, PagesWrittenInOneRoundTripAreReadBackInOne) {
  RedisServer& server = *server_;
  auto tier = OpenTier(server.url());
  ASSERT_NE(tier, nullptr);
  constexpr size_t kPages = 64;
  std::vector<std::vector<std::byte>> payloads;
  std::vector<PagePut> puts;
  std::vector<PageKey> keys;
  for (size_t i = 0; i < kPages; ++i) payloads.push_back(Payload(4096 + i, uint8_t(i)));
  for (size_t i = 0; i < kPages; ++i) {
    puts.push_back({Key(i), "q8_0/q8_0", payloads[i]});
    keys.push_back(Key(i));
  }
  keys.push_back(Key(1000));  // never written
  EXPECT_EQ(tier->Put(puts), kPages);
  EXPECT_EQ(tier->Put(puts), kPages);  // idempotent: the same bytes again
  const uint64_t trips_before = tier->stats().n_round_trips;
  auto got = tier->Get(keys, "q8_0/q8_0");
  EXPECT_EQ(tier->stats().n_round_trips, trips_before + 1);
  for (size_t i = 0; i < kPages; ++i) EXPECT_EQ(got[i], payloads[i]) << i;
  EXPECT_TRUE(got[kPages].empty());
  const std::vector<bool> present = tier->Contains(keys);
  EXPECT_EQ(std::count(present.begin(), present.end(), true), ptrdiff_t{kPages});
  EXPECT_FALSE(present.back());
  const RemoteTierStats s = tier->stats();
  EXPECT_EQ(s.n_hits, kPages);
  EXPECT_EQ(s.n_misses, 1u);
  EXPECT_EQ(s.n_written, 2 * kPages);
  EXPECT_EQ(s.n_errors, 0u);
  EXPECT_GT(s.read_bytes, kPages * 4096);
  EXPECT_EQ(s.written_bytes, 2 * s.read_bytes);
  // Two pipelined writes, one MGET, one pipelined EXISTS: four round trips for 64 pages.
  EXPECT_EQ(s.n_round_trips, 4u);
}

// A damaged value (one payload byte changed in Redis) and a foreign one (another key's value
// copied under the key, or a page of another codec pair) are misses, counted, warned once, and
// never returned.
TEST_F(RemoteTierTest, DamagedAndForeignValuesAreMissesNeverData) {
  RedisServer& server = *server_;
  Warnings warnings;
  auto tier = OpenTier(server.url(), &warnings);
  ASSERT_NE(tier, nullptr);
  const auto a = Payload(1000, 1), b = Payload(1000, 2);
  ASSERT_EQ(tier->Put(std::vector<PagePut>{{Key(1), "f16/f16", a}, {Key(2), "f16/f16", b}}), 2u);
  RespClient client(server.port());
  const std::string name1 = "argus:kv1:" + Key(1).ToString();
  const std::string name2 = "argus:kv1:" + Key(2).ToString();
  EXPECT_EQ(client.Command({"SETRANGE", name1, "500", "X"}).substr(0, 1), ":");
  auto got = tier->Get({{Key(1), Key(2)}}, "f16/f16");
  EXPECT_TRUE(got[0].empty());
  EXPECT_EQ(got[1], b);
  EXPECT_EQ(tier->stats().n_damaged, 1u);
  // Key 2's value under key 1: a valid value, of another page.
  EXPECT_EQ(client.Command({"COPY", name2, name1, "REPLACE"}), ":1");
  EXPECT_TRUE(tier->Get({{Key(1)}}, "f16/f16")[0].empty());
  // Key 2 asked for as a q8_0 page.
  EXPECT_TRUE(tier->Get({{Key(2)}}, "q8_0/q8_0")[0].empty());
  // Not a value of ours at all.
  EXPECT_EQ(client.Command({"SET", name1, "hello"}), "+OK");
  EXPECT_TRUE(tier->Get({{Key(1)}}, "f16/f16")[0].empty());
  const RemoteTierStats s = tier->stats();
  EXPECT_EQ(s.n_damaged, 4u);
  EXPECT_EQ(s.n_hits, 1u);
  EXPECT_EQ(s.n_errors, 0u);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("value refused"), std::string::npos) << warnings.messages[0];
}

// The server killed: misses and an error, then (after the backoff) a restarted server is used.
TEST_F(RemoteTierTest, ServerKilledIsAMissAndARestartedOneIsUsedAfterTheBackoff) {
  RedisServer& server = *server_;
  Warnings warnings;
  auto tier = OpenTier(server.url(), &warnings);
  ASSERT_NE(tier, nullptr);
  const auto a = Payload(2000, 3);
  ASSERT_EQ(tier->Put({Key(1), "f16/f16", a}), 1u);
  server.Kill();
  EXPECT_TRUE(tier->Get({{Key(1)}}, "f16/f16")[0].empty());
  EXPECT_EQ(tier->Put({Key(1), "f16/f16", a}), 0u);  // skipped: backing off
  EXPECT_FALSE(tier->available());
  EXPECT_EQ(tier->stats().n_errors, 1u);
  EXPECT_EQ(warnings.messages.size(), 1u);
  server.Restart();
  ASSERT_TRUE(server.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(tier->available());
  EXPECT_TRUE(tier->Get({{Key(1)}}, "f16/f16")[0].empty());  // a new, empty server
  EXPECT_EQ(tier->Put({Key(1), "f16/f16", a}), 1u);
  EXPECT_EQ(tier->Get({{Key(1)}}, "f16/f16")[0], a);
  EXPECT_EQ(tier->stats().n_connects, 2u);
  EXPECT_EQ(warnings.messages.size(), 1u);  // warned once
}

// DEBUG SLEEP holds the server: the call gives up after its timeout, a miss.
TEST_F(RemoteTierTest, SlowServerTimesOutAsAMiss) {
  RedisServer& server = *server_;
  auto tier = OpenTier(server.url(), nullptr, /*timeout_s=*/0.2);
  ASSERT_NE(tier, nullptr);
  const auto a = Payload(100, 4);
  ASSERT_EQ(tier->Put({Key(1), "f16/f16", a}), 1u);
  RespClient sleeper(server.port());
  ASSERT_TRUE(sleeper.Send({"DEBUG", "SLEEP", "2"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(tier->Get({{Key(1)}}, "f16/f16")[0].empty());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 1.0);
  EXPECT_EQ(tier->stats().n_errors, 1u);
  EXPECT_FALSE(tier->available());
}

// maxmemory of 1 MB with noeviction: writes beyond it are refused (OOM), counted, dropped; the
// pages written before are read back.
TEST_F(RemoteTierTest, FullServerRefusesWritesAndKeepsServingThePagesItHolds) {
  RedisServer& server = *server_;
  RespClient client(server.port());
  EXPECT_EQ(client.Command({"CONFIG", "SET", "maxmemory", "3mb"}), "+OK");
  EXPECT_EQ(client.Command({"CONFIG", "SET", "maxmemory-policy", "noeviction"}), "+OK");
  Warnings warnings;
  auto tier = OpenTier(server.url(), &warnings);
  ASSERT_NE(tier, nullptr);
  std::vector<std::vector<std::byte>> payloads;
  std::vector<PageKey> keys;
  for (size_t i = 0; i < 64; ++i) {
    payloads.push_back(Payload(128 << 10, uint8_t(i)));
    keys.push_back(Key(i));
  }
  size_t n_written = 0;
  for (size_t i = 0; i < 64; ++i) n_written += tier->Put({keys[i], "f16/f16", payloads[i]});
  EXPECT_GT(n_written, 0u);
  EXPECT_LT(n_written, 64u);
  const RemoteTierStats s = tier->stats();
  EXPECT_EQ(s.n_errors, 64 - n_written);
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("OOM"), std::string::npos) << warnings.messages[0];
  EXPECT_TRUE(tier->available());  // a full server is up: reads go on
  auto got = tier->Get(keys, "f16/f16");
  size_t n_hits = 0;
  for (size_t i = 0; i < 64; ++i) {
    if (got[i].empty()) continue;
    EXPECT_EQ(got[i], payloads[i]) << i;
    ++n_hits;
  }
  EXPECT_EQ(n_hits, n_written);
}

// The password from the URL, or from ARGUS_REDIS_PASSWORD; a wrong one is a miss, not an error.
TEST(RemoteTier, PasswordFromTheUrlOrTheEnvironment) {
  ARGUS_SKIP_WITHOUT_REDIS();
  RedisServer server({"--requirepass", "s3cret"});
  ASSERT_TRUE(server.ok());
  const std::string host = "127.0.0.1:" + std::to_string(server.port());
  const auto a = Payload(100, 5);
  auto with_url = OpenTier("redis://:s3cret@" + host + "/2");
  ASSERT_NE(with_url, nullptr);
  EXPECT_EQ(with_url->Put({Key(1), "f16/f16", a}), 1u);
  EXPECT_EQ(with_url->name().find("s3cret"), std::string::npos) << with_url->name();
  ::setenv("ARGUS_REDIS_PASSWORD", "s3cret", 1);
  auto with_env = OpenTier("redis://" + host + "/2");
  ::unsetenv("ARGUS_REDIS_PASSWORD");
  ASSERT_NE(with_env, nullptr);
  EXPECT_EQ(with_env->Get({{Key(1)}}, "f16/f16")[0], a);
  auto other_db = OpenTier("redis://:s3cret@" + host + "/3");
  EXPECT_TRUE(other_db->Get({{Key(1)}}, "f16/f16")[0].empty());
  Warnings warnings;
  auto wrong = OpenTier("redis://:nope@" + host, &warnings);
  ASSERT_NE(wrong, nullptr);
  EXPECT_TRUE(wrong->Get({{Key(1)}}, "f16/f16")[0].empty());
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("AUTH"), std::string::npos) << warnings.messages[0];
}

}  // namespace
}  // namespace argus
