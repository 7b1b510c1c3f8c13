// libFuzzer target for the disk store's recovery from a hostile journal and slot file (the
// input format and what must hold: journal_recovery.h). Run, for example:
//   build/fuzz/argus_journal_fuzz tests/fuzz/corpus/journal
#include <cstdio>
#include <cstdlib>

#include "journal_recovery.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string error = argus::testing::CheckJournalRecovery(data, size);
  if (!error.empty()) {
    std::fprintf(stderr, "journal_fuzz: %s\n", error.c_str());
    std::abort();
  }
  return 0;
}
