// Fault injection into the disk tier through FaultEnv: EIO at every call site of every
// operation, short reads and writes, ENOSPC, torn writes (a simulated crash), a flipped bit in a
// stored page, a truncated journal. Each must give a clear error (the right code, naming the
// file) or a clean recovery, and after reopening with a healthy Env every key must read back
// exactly its old or its new bytes, never anything else.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "argus/store.h"
#include "fault/fault_env.h"
#include "test_util.h"

namespace argus {
namespace {

using testing::FaultEnv;
using testing::FaultOp;
using testing::TempDir;
using Bytes = std::vector<std::byte>;

Bytes Payload(uint64_t key, uint64_t version, size_t n_bytes = 1500) {
  std::mt19937_64 rng(testing::TestSeed() ^ (key * 0x9E3779B97F4A7C15ull) ^ (version << 48));
  Bytes bytes(n_bytes);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng());
  return bytes;
}

PageKey Key(uint64_t k) { return {0xF00D, k}; }
constexpr uint64_t kA = 1, kB = 2, kC = 3, kD = 4;

// What a key (or the named record "r") may hold around the operation under test; nullopt is
// absent.
struct Allowed {
  std::optional<Bytes> before, after;
};
using Expectations = std::map<uint64_t, Allowed>;  // key -> allowed; kRecord is the record

constexpr uint64_t kRecord = 0;

struct Phase {
  std::string name;
  bool setup = true;  // store A, B, C and the record first
  std::function<Status(struct Harness&)> run;
  Expectations model;
};

struct Harness {
  TempDir dir;
  FaultEnv env;
  DiskTierOptions options;
  std::unique_ptr<DiskTier> tier;

  Harness() {
    options.dir = dir / "store";
    options.env = &env;
    options.disk_budget_bytes = size_t{64} << 20;
    options.io = DiskIoBackend::kThreads;
    options.n_io_threads = 2;
  }

  Status Reopen(Env* with) {
    tier.reset();
    options.env = with;
    auto opened = DiskTier::Open(options);
    if (!opened.ok()) return opened.status();
    tier = std::move(opened).value();
    return Status::Ok();
  }

  Status Setup() {
    ARGUS_RETURN_IF_ERROR(Reopen(&env));
    const Bytes a = Payload(kA, 0), b = Payload(kB, 0), c = Payload(kC, 0);
    ARGUS_RETURN_IF_ERROR(tier->Put(std::vector<PagePut>{{Key(kA), "a", a}, {Key(kB), "b", b}}));
    ARGUS_RETURN_IF_ERROR(tier->Put({Key(kC), "c", c}));
    return tier->PutRecord("r", Payload(kRecord, 0, 40));
  }
};

// Reads every key of the model; the bytes must be one of the allowed states (exactly `after`
// when `exact`).
void ExpectAllowed(DiskTier& tier, const Expectations& model, bool exact, const std::string& context) {
  for (const auto& [k, allowed] : model) {
    std::optional<Bytes> got;
    if (k == kRecord) {
      auto record = tier.GetRecord("r");
      if (record.ok()) got = *record;
    } else if (tier.Contains(Key(k))) {
      Bytes bytes(tier.Info(Key(k))->payload_bytes);
      Status s = tier.Read(Key(k), bytes);
      ASSERT_TRUE(s.ok()) << context << ": key " << k << ": " << s.ToString();
      got = bytes;
    }
    if (exact) {
      EXPECT_TRUE(got == allowed.after) << context << ": key " << k << " is not its new state";
    } else {
      EXPECT_TRUE(got == allowed.before || got == allowed.after)
          << context << ": key " << k << " holds neither its old nor its new state";
    }
  }
}

std::vector<Phase> Phases() {
  const Expectations unchanged = {{kA, {Payload(kA, 0), Payload(kA, 0)}},
                           {kB, {Payload(kB, 0), Payload(kB, 0)}},
                           {kC, {Payload(kC, 0), Payload(kC, 0)}},
                           {kRecord, {Payload(kRecord, 0, 40), Payload(kRecord, 0, 40)}}};
  std::vector<Phase> phases;
  phases.push_back({"create", false, [](Harness& h) { return h.Reopen(&h.env); }, {}});
  Expectations put = unchanged;
  put[kA].after = Payload(kA, 1);
  put[kD] = {std::nullopt, Payload(kD, 0)};
  phases.push_back(
      {"put", true,
       [](Harness& h) {
         const Bytes a = Payload(kA, 1), d = Payload(kD, 0);
         return h.tier->Put(std::vector<PagePut>{{Key(kA), "a1", a}, {Key(kD), "d", d}});
       },
       put});
  Expectations erase = unchanged;
  erase[kB].after = std::nullopt;
  phases.push_back({"erase", true,
                    [](Harness& h) {
                      const PageKey b = Key(kB);
                      return h.tier->Erase(std::span(&b, 1));
                    },
                    erase});
  Expectations record = unchanged;
  record[kRecord].after = Payload(kRecord, 1, 40);
  phases.push_back({"record", true,
                    [](Harness& h) { return h.tier->PutRecord("r", Payload(kRecord, 1, 40)); },
                    record});
  phases.push_back({"read", true,
                    [](Harness& h) -> Status {
                      Bytes a(1500);
                      ARGUS_RETURN_IF_ERROR(h.tier->Read(Key(kA), a));
                      if (a != Payload(kA, 0)) return Status::Internal("Read: wrong bytes");
                      const std::vector<PageKey> keys = {Key(kA), Key(kB), Key(kC)};
                      ARGUS_ASSIGN_OR_RETURN(auto batch, h.tier->ReadBatch(keys));
                      for (size_t i = 0; i < keys.size(); ++i) {
                        ARGUS_ASSIGN_OR_RETURN(auto page, batch->Get(i));
                        if (!std::ranges::equal(page, Payload(keys[i].lo, 0))) {
                          return Status::Internal("ReadBatch: wrong bytes");
                        }
                        batch->Release(i);
                      }
                      return Status::Ok();
                    },
                    unchanged});
  phases.push_back({"reopen", true, [](Harness& h) { return h.Reopen(&h.env); }, unchanged});
  phases.push_back({"compact", true, [](Harness& h) { return h.tier->Compact(); }, unchanged});
  return phases;
}

enum class Fault { kEio, kNoSpace, kShort, kTorn };

// Injects `fault` at call nth (of n_calls) of kind `op` while `phase` runs, and checks that the
// outcome is a clear error or a clean recovery and that every key holds an allowed state.
void RunOneCallSite(const Phase& phase, FaultOp op, uint64_t nth, uint64_t n_calls, Fault fault,
                    size_t keep_bytes) {
  const std::string context = phase.name + ": " + testing::FaultOpName(op) + " call " +
                              std::to_string(nth) + " of " + std::to_string(n_calls);
  Harness h;
  if (phase.setup) {
    Status setup = h.Setup();
    if (!setup.ok()) {
      ADD_FAILURE() << context << ": setup: " << setup.ToString();
      return;
    }
  }
  h.env.Reset();
  switch (fault) {
    case Fault::kEio:
      h.env.FailNth(op, nth, EIO);
      break;
    case Fault::kNoSpace:
      h.env.FailNth(op, nth, ENOSPC);
      break;
    case Fault::kShort:
      h.env.ShortNth(op, nth, keep_bytes);
      break;
    case Fault::kTorn:
      h.env.TearNth(nth, keep_bytes);
      break;
  }
  const Status s = phase.run(h);
  EXPECT_TRUE(h.env.fired()) << context;
  EXPECT_NE(s.code(), StatusCode::kInternal) << context << ": " << s.ToString();
  switch (fault) {
    case Fault::kEio:
    case Fault::kNoSpace:
      EXPECT_EQ(s.code(), fault == Fault::kEio ? StatusCode::kIOError : StatusCode::kNoSpace)
          << context << ": " << s.ToString();
      EXPECT_NE(s.message().find(h.dir.path()), std::string::npos)
          << context << ": the error names no file: " << s.ToString();
      break;
    case Fault::kShort:
      EXPECT_TRUE(s.ok()) << context << ": a short transfer is continued: " << s.ToString();
      break;
    case Fault::kTorn:
      EXPECT_FALSE(s.ok()) << context;
      break;
  }
  // Still open and not crashed: whatever the store serves now is an allowed state, and
  // exactly the new one when the call succeeded.
  if (h.tier && !h.env.crashed()) ExpectAllowed(*h.tier, phase.model, s.ok(), context);
  Status reopened = h.Reopen(Env::Default());
  if (!reopened.ok()) {
    ADD_FAILURE() << context << ": reopen: " << reopened.ToString();
    return;
  }
  ExpectAllowed(*h.tier, phase.model, s.ok() && fault != Fault::kTorn, context + ", reopened");
  auto report = h.tier->Check();
  EXPECT_TRUE(report.ok() && report->ok()) << context << ": check: " << report.status().ToString();
  // The recovered store takes writes again.
  const Bytes e = Payload(99, 0);
  EXPECT_TRUE(h.tier->Put({Key(99), "", e}).ok()) << context;
}

// Runs `phase` once per call of each kind in `ops` it makes, injecting `fault` at that call, and
// checks the outcome. Returns how many call sites of each kind were covered.
std::map<FaultOp, uint64_t> RunEveryCallSite(const Phase& phase, std::span<const FaultOp> ops,
                                             Fault fault, size_t keep_bytes = 512) {
  std::map<FaultOp, uint64_t> n_calls;
  {
    Harness h;
    if (phase.setup) {
      EXPECT_TRUE(h.Setup().ok());
    }
    h.env.Reset();
    EXPECT_TRUE(phase.run(h).ok()) << phase.name << " fails without faults";
    for (FaultOp op : ops) n_calls[op] = h.env.count(op);
  }
  for (const auto& [op, n] : n_calls) {
    for (uint64_t nth = 1; nth <= n; ++nth) RunOneCallSite(phase, op, nth, n, fault, keep_bytes);
  }
  return n_calls;
}

constexpr FaultOp kAllOps[] = {
    FaultOp::kOpen,      FaultOp::kRead,     FaultOp::kWrite,     FaultOp::kSync,
    FaultOp::kSize,      FaultOp::kTruncate, FaultOp::kCreateDir, FaultOp::kSyncDir,
    FaultOp::kRename,    FaultOp::kRemove,   FaultOp::kExists,    FaultOp::kListDir,
    FaultOp::kAlignment,
};

constexpr FaultOp kWriteOnly[] = {FaultOp::kWrite};
constexpr FaultOp kReadOnly[] = {FaultOp::kRead};

TEST(DiskTierFault, EioAtEveryCallSiteIsAClearErrorAndNeverServesWrongPage) {
  std::map<FaultOp, uint64_t> n_sites;
  for (const Phase& phase : Phases()) {
    for (const auto& [op, n] : RunEveryCallSite(phase, kAllOps, Fault::kEio)) n_sites[op] += n;
  }
  // Every kind of call the store makes on its success paths was failed at least once (Remove
  // only runs to clean up a compaction cut short).
  for (FaultOp op : kAllOps) {
    if (op != FaultOp::kRemove) {
      EXPECT_GT(n_sites[op], 0u) << testing::FaultOpName(op);
    }
  }
}

TEST(DiskTierFault, ShortWriteAtEveryCallSiteNeverServesWrongPage) {
  for (const Phase& phase : Phases()) RunEveryCallSite(phase, kWriteOnly, Fault::kShort);
}

TEST(DiskTierFault, ShortReadAtEveryCallSiteNeverServesWrongPage) {
  for (const Phase& phase : Phases()) RunEveryCallSite(phase, kReadOnly, Fault::kShort);
}

TEST(DiskTierFault, NoSpaceOnEveryWriteIsNoSpaceAndLosesNothing) {
  for (const Phase& phase : Phases()) RunEveryCallSite(phase, kWriteOnly, Fault::kNoSpace);
}

TEST(DiskTierFault, TornWriteAtEveryWriteRecoversOldOrNewPage) {
  for (size_t keep : {0, 100, 512}) {
    for (const Phase& phase : Phases()) {
      RunEveryCallSite(phase, kWriteOnly, Fault::kTorn, keep);
    }
  }
}

TEST(DiskTierFault, FileSystemRefusingDirectIoFallsBackToBufferedIoAndSaysSo) {
  Harness h;
  h.env.RefuseDirect(true);
  ASSERT_TRUE(h.Setup().ok());
  EXPECT_FALSE(h.tier->stats().direct_io);
  ASSERT_TRUE(h.Reopen(&h.env).ok());
  EXPECT_FALSE(h.tier->stats().direct_io);
  ExpectAllowed(*h.tier, {{kA, {Payload(kA, 0), Payload(kA, 0)}}}, true, "buffered");
  h.env.RefuseDirect(false);
  ASSERT_TRUE(h.Reopen(&h.env).ok());
  EXPECT_TRUE(h.tier->stats().direct_io);
  ExpectAllowed(*h.tier, {{kC, {Payload(kC, 0), Payload(kC, 0)}}}, true, "direct");
}

TEST(DiskTierFault, TornSlotWriteThenReopenLeavesOldPage) {
  Harness h;
  ASSERT_TRUE(h.Setup().ok());
  h.env.Reset();
  h.env.TearNth(1, 512);  // the first write of the put is the new slot of A
  const Bytes a1 = Payload(kA, 1);
  EXPECT_EQ(h.tier->Put({Key(kA), "a1", a1}).code(), StatusCode::kIOError);
  ASSERT_TRUE(h.Reopen(Env::Default()).ok());
  Bytes got(1500);
  ASSERT_TRUE(h.tier->Read(Key(kA), got).ok());
  EXPECT_EQ(got, Payload(kA, 0));
  EXPECT_EQ(h.tier->Info(Key(kA))->tag, "a");
}

TEST(DiskTierFault, FailedSyncRefusesLaterWritesNamingItButReadsContinue) {
  Harness h;
  ASSERT_TRUE(h.Setup().ok());
  h.env.Reset();
  h.env.FailNth(FaultOp::kSync, 1, EIO);
  const Bytes d = Payload(kD, 0);
  const Status s = h.tier->Put({Key(kD), "", d});
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  const Status later = h.tier->Put({Key(kD), "", d});
  EXPECT_EQ(later.code(), StatusCode::kIOError);
  EXPECT_NE(later.message().find("failed sync"), std::string::npos) << later.message();
  EXPECT_NE(later.message().find(s.message()), std::string::npos) << later.message();
  EXPECT_EQ(h.tier->PutRecord("x", d).code(), StatusCode::kIOError);
  Bytes got(1500);
  ASSERT_TRUE(h.tier->Read(Key(kB), got).ok());
  EXPECT_EQ(got, Payload(kB, 0));
}

TEST(DiskTierFault, NoSpaceOnSlotWriteIsNoSpaceAndTheStoreKeepsWorking) {
  Harness h;
  ASSERT_TRUE(h.Setup().ok());
  h.env.Reset();
  h.env.FailNth(FaultOp::kWrite, 1, ENOSPC);
  const Bytes d = Payload(kD, 0);
  const Status s = h.tier->Put({Key(kD), "", d});
  EXPECT_EQ(s.code(), StatusCode::kNoSpace) << s.ToString();
  EXPECT_NE(s.message().find("slots-"), std::string::npos) << s.message();
  EXPECT_FALSE(h.tier->Contains(Key(kD)));
  EXPECT_EQ(h.tier->stats().used_bytes, 3 * h.tier->Info(Key(kA))->slot_bytes);
  ASSERT_TRUE(h.tier->Put({Key(kD), "", d}).ok());  // space came back: NoSpace is retryable
  ExpectAllowed(*h.tier, {{kA, {Payload(kA, 0), Payload(kA, 0)}}, {kD, {d, d}}}, true, "retry");
}

// Flips one byte of A's payload in its slot file, behind the store's back.
std::string FlipPayloadByte(Harness& h) {
  const StoredPageInfo info = h.tier->Info(Key(kA)).value();
  const std::string file = h.options.dir + "/slots-" + std::to_string(info.slot_bytes) + ".dat";
  const int fd = ::open(file.c_str(), O_RDWR);
  EXPECT_GE(fd, 0) << file;
  std::byte b{};
  const off_t at = 128 + 700;  // A went first into slot 0
  EXPECT_EQ(::pread(fd, &b, 1, at), 1);
  b ^= std::byte{0x10};
  EXPECT_EQ(::pwrite(fd, &b, 1, at), 1);
  ::close(fd);
  return file;
}

TEST(DiskTierFault, BitFlipInStoredPageIsCorruptionNamingPageAndFileAndCheckListsItLost) {
  Harness h;
  ASSERT_TRUE(h.Setup().ok());
  const std::string file = FlipPayloadByte(h);
  Bytes got(1500);
  const Status s = h.tier->Read(Key(kA), got);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(),
            "page " + Key(kA).ToString() + " in " + file + " slot 0: payload checksum mismatch");
  auto batch = h.tier->ReadBatch(std::vector<PageKey>{Key(kA)});
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ((*batch)->Get(0).status().code(), StatusCode::kCorruption);
  batch->reset();
  auto report = h.tier->Check();
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->lost.size(), 1u);
  EXPECT_EQ(report->lost[0].first, Key(kA));
  EXPECT_EQ(report->n_pages, 2u);
  EXPECT_EQ(h.tier->stats().n_lost_pages, 1u);
  EXPECT_EQ(h.tier->stats().n_corrupt_reads, 3u);
  // B and C are intact.
  ASSERT_TRUE(h.tier->Read(Key(kB), got).ok());
  EXPECT_EQ(got, Payload(kB, 0));
}

TEST(DiskTierFault, PageCorruptAtOpenIsNeverOfferedAndCheckListsIt) {
  Harness h;
  ASSERT_TRUE(h.Setup().ok());
  FlipPayloadByte(h);
  ASSERT_TRUE(h.Reopen(Env::Default()).ok());
  EXPECT_FALSE(h.tier->Contains(Key(kA)));
  EXPECT_EQ(h.tier->stats().n_lost_pages, 1u);
  auto report = h.tier->Check();
  ASSERT_TRUE(report.ok());
  ASSERT_EQ(report->lost.size(), 1u);
  EXPECT_EQ(report->lost[0].first, Key(kA));
  EXPECT_NE(report->lost[0].second.find("payload checksum mismatch"), std::string::npos);
  // Its slot is not reused: new pages never overwrite the evidence.
  const Bytes d = Payload(kD, 0);
  ASSERT_TRUE(h.tier->Put({Key(kD), "", d}).ok());
  Bytes got(1500);
  ASSERT_TRUE(h.tier->Read(Key(kD), got).ok());
  EXPECT_EQ(got, d);
  // Storing the key again makes it whole.
  const Bytes a1 = Payload(kA, 1);
  ASSERT_TRUE(h.tier->Put({Key(kA), "", a1}).ok());
  ASSERT_TRUE(h.tier->Read(Key(kA), got).ok());
  EXPECT_EQ(got, a1);
}

// Journal sizes after each of five publications: setup (3 records) then D and E.
struct JournalStore {
  TempDir dir;
  std::string store, journal;
  std::vector<uint64_t> ends;  // journal size after each record
  JournalStore() : store(dir / "store"), journal(store + "/journal") {
    DiskTierOptions o;
    o.dir = store;
    o.disk_budget_bytes = size_t{64} << 20;
    o.io = DiskIoBackend::kThreads;
    auto tier = DiskTier::Open(o).value();
    auto add = [&](Status s) {
      EXPECT_TRUE(s.ok()) << s.ToString();
      ends.push_back(tier->stats().journal_bytes);
    };
    add(tier->Put({Key(kA), "", Payload(kA, 0)}));
    add(tier->Put({Key(kB), "", Payload(kB, 0)}));
    add(tier->PutRecord("r", Payload(kRecord, 0, 40)));
    add(tier->Put({Key(kA), "", Payload(kA, 1)}));
    const PageKey b = Key(kB);
    add(tier->Erase(std::span(&b, 1)));
  }

  // Copies the store, cuts the copy's journal at `cut` and reopens it.
  void ExpectRecoveryAt(uint64_t cut) {
    TempDir copy;
    const std::string dst = copy / "store";
    std::filesystem::copy(store, dst);
    std::filesystem::resize_file(dst + "/journal", cut);
    DiskTierOptions o;
    o.dir = dst;
    o.disk_budget_bytes = size_t{64} << 20;
    o.io = DiskIoBackend::kThreads;
    auto tier = DiskTier::Open(o);
    ASSERT_TRUE(tier.ok()) << "cut at " << cut << ": " << tier.status().ToString();
    size_t n_whole = 0;
    while (n_whole < ends.size() && ends[n_whole] <= cut) ++n_whole;
    const uint64_t kept = n_whole == 0 ? 16 : ends[n_whole - 1];
    EXPECT_EQ((*tier)->stats().journal_bytes, kept) << cut;
    EXPECT_EQ((*tier)->stats().journal_dropped_bytes, cut - std::min(cut, kept)) << cut;
    EXPECT_EQ(std::filesystem::file_size(dst + "/journal"), std::max<uint64_t>(kept, 16)) << cut;
    // The state after the first n_whole records.
    std::optional<Bytes> a, b, r;
    if (n_whole >= 1) a = Payload(kA, 0);
    if (n_whole >= 2) b = Payload(kB, 0);
    if (n_whole >= 3) r = Payload(kRecord, 0, 40);
    if (n_whole >= 4) a = Payload(kA, 1);
    if (n_whole >= 5) b.reset();
    const Expectations model = {{kA, {a, a}}, {kB, {b, b}}, {kRecord, {r, r}}};
    ExpectAllowed(**tier, model, true, "cut at " + std::to_string(cut));
    // Appends continue cleanly after the cut.
    const Bytes d = Payload(kD, 0);
    ASSERT_TRUE((*tier)->Put({Key(kD), "", d}).ok());
    tier->reset();
    auto again = DiskTier::Open(o);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE((*again)->Contains(Key(kD))) << cut;
    EXPECT_EQ((*again)->stats().journal_dropped_bytes, 0u) << cut;
  }
};

TEST(DiskTierFault, TruncatedJournalAtEveryByteOfTheLastRecordRecoversEveryEarlierRecord) {
  JournalStore js;
  for (uint64_t cut = js.ends[3]; cut <= js.ends[4]; ++cut) js.ExpectRecoveryAt(cut);
}

TEST(DiskTierFault, TruncatedJournalInTheMiddleRecoversTheRecordsBeforeTheCut) {
  JournalStore js;
  for (uint64_t cut : {uint64_t{0}, uint64_t{7}, uint64_t{16}, js.ends[0] - 1, js.ends[0] + 5,
                       (js.ends[1] + js.ends[2]) / 2, js.ends[2], js.ends[3] - 16}) {
    js.ExpectRecoveryAt(cut);
  }
}

TEST(DiskTierFault, GarbageAfterTheLastRecordIsCutOffAndCounted) {
  JournalStore js;
  TempDir copy;
  const std::string dst = copy / "store";
  std::filesystem::copy(js.store, dst);
  {
    const int fd = ::open((dst + "/journal").c_str(), O_WRONLY | O_APPEND);
    ASSERT_GE(fd, 0);
    const Bytes junk = Payload(77, 0, 300);
    ASSERT_EQ(::write(fd, junk.data(), junk.size()), 300);
    ::close(fd);
  }
  DiskTierOptions o;
  o.dir = dst;
  o.disk_budget_bytes = size_t{64} << 20;
  auto tier = DiskTier::Open(o);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_EQ((*tier)->stats().journal_dropped_bytes, 300u);
  EXPECT_EQ((*tier)->stats().journal_bytes, js.ends.back());
  EXPECT_TRUE((*tier)->Contains(Key(kA)));
  EXPECT_FALSE((*tier)->Contains(Key(kB)));
}

// A flipped bit in the second record, with three valid records after it, is damage, not a
// torn tail: Open refuses, naming both offsets, and the journal keeps every byte.
TEST(DiskTierFault, DamageInTheMiddleOfTheJournalIsCorruptionAndCutsNothing) {
  JournalStore js;
  TempDir copy;
  const std::string dst = copy / "store";
  std::filesystem::copy(js.store, dst);
  const uint64_t size = std::filesystem::file_size(dst + "/journal");
  {
    std::fstream f(dst + "/journal", std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>((js.ends[0] + js.ends[1]) / 2);
    f.seekg(at);
    char c = 0;
    f.get(c);
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x04));
  }
  DiskTierOptions o;
  o.dir = dst;
  o.disk_budget_bytes = size_t{64} << 20;
  auto tier = DiskTier::Open(o);
  ASSERT_EQ(tier.status().code(), StatusCode::kCorruption) << tier.status().ToString();
  EXPECT_NE(tier.status().message().find("byte " + std::to_string(js.ends[0])), std::string::npos)
      << tier.status().ToString();
  EXPECT_NE(
      tier.status().message().find("valid record follows at byte " + std::to_string(js.ends[1])),
      std::string::npos)
      << tier.status().ToString();
  EXPECT_EQ(std::filesystem::file_size(dst + "/journal"), size);
}

}  // namespace
}  // namespace argus
