// Running the placement engine's migrations: inline, or queued for the worker thread under the
// staging bound; and committing what finished, in the foreground, where the page table changes.
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "policy/engine_impl.h"

namespace argus {

Status PlacementEngine::Impl::Start(Job job, bool synchronous) {
  if (synchronous || !worker.joinable()) {
    Execute(job, inline_scratch.as<float>());
    Commit(job);
    return Status::Ok();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    // Bounded staging: a job that does not fit beside those in flight waits for a later step.
    // Promotions waiting for RAM hold staging too, but must not block the demotions that
    // free it: they are not counted here.
    const size_t moving = staged_bytes - waiting_bytes;
    if (moving > 0 && moving + job.staged_bytes() > options.staging_bytes) {
      return Status::Ok();
    }
    staged_bytes += job.staged_bytes();
    in_flight[job.page] = 1;
    queue.push_back(std::move(job));
  }
  cv.notify_all();
  return Status::Ok();
}

void PlacementEngine::Impl::Execute(Job& job, float* scratch) {
  DiskTier& disk = *cache.disk();
  if (job.kind == Job::Kind::kWriteMaster) {
    job.status = disk.Put({job.key, job.tag, job.src.span()});
    return;
  }
  if (job.from_master) {
    job.status = disk.Read(job.key, job.src.span());
    if (job.status.ok() && Checksum64(job.src.span()) != job.checksum) {
      job.status = Status::Corruption("master " + job.key.ToString() + " of page " +
                                      std::to_string(job.page) + " fails its checksum");
    }
    if (!job.status.ok()) return;
  }
  job.summary.resize(SummaryFloats(cache));
  job.status = TranscodePage(cache, job.src.span(), job.src_k, job.src_v, job.dst.span(), job.dst_k,
                             job.dst_v, job.summary.data(), scratch);
}

void PlacementEngine::Impl::Commit(Job& job) {
  const PageId p = job.page;
  if (job.kind == Job::Kind::kWriteMaster) {
    if (job.status.ok()) {
      stats.master_bytes_written += job.src.size();
      job.status = AttachMaster(cache, p, job.generation, job.key, job.checksum);
      if (!job.status.ok()) (void)cache.disk()->Erase(std::span<const PageKey>(&job.key, 1));
    }
  } else {
    if (job.from_master && job.status.ok() && !job.counted) {
      stats.promoted_bytes_read += job.src.size();
      job.counted = true;
    }
    if (job.status.ok()) {
      job.status = InstallPage(cache, p, job.generation, job.dst_k, job.dst_v, job.dst.span(),
                               job.summary.data());
    }
    if (job.status.ok() && job.promotion) {
      ++stats.n_promotions;
      if (on_demand) {
        ++stats.n_promotions_on_demand;
      } else {
        ++stats.n_prefetches;
      }
      prefetched[p] = on_demand ? 0 : 1;
    } else if (job.status.ok()) {
      ++stats.n_demotions;
      if (prefetched[p]) {
        ++stats.n_prefetches_wasted;
        prefetched[p] = 0;
      }
    }
  }
  if (job.status.ok() || job.status.code() == StatusCode::kResourceExhausted) return;
  ++stats.n_migrations_dropped;
  if (job.status.code() != StatusCode::kAborted) stats.last_error = job.status.ToString();
}

void PlacementEngine::Impl::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    cv.wait(lock, [&] { return stopping || !queue.empty(); });
    if (stopping) return;
    // Consecutive master writes go out as one durable Put.
    std::vector<Job> jobs;
    do {
      jobs.push_back(std::move(queue.front()));
      queue.pop_front();
    } while (jobs.back().kind == Job::Kind::kWriteMaster && !queue.empty() &&
             queue.front().kind == Job::Kind::kWriteMaster && jobs.size() < 64);
    n_running += jobs.size();
    lock.unlock();
    if (jobs.size() > 1) {
      std::vector<PagePut> puts;
      for (const Job& job : jobs) puts.push_back({job.key, job.tag, job.src.span()});
      const Status status = cache.disk()->Put(puts);
      for (Job& job : jobs) job.status = status;
    } else {
      Execute(jobs[0], worker_scratch.as<float>());
    }
    lock.lock();
    n_running -= jobs.size();
    for (Job& job : jobs) done.push_back(std::move(job));
    cv.notify_all();
  }
}

void PlacementEngine::Impl::Release(const Job& job) {
  std::lock_guard<std::mutex> lock(mu);
  staged_bytes -= job.staged_bytes();
  in_flight[job.page] = 0;
}

// Commits what the worker finished. A promotion that finds no RAM yet (the demotions that make
// room are still in flight) waits, holding its staging, until the plan no longer wants it.
void PlacementEngine::Impl::CommitDone() {
  std::vector<Job> finished;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (Job& job : done) finished.push_back(std::move(job));
    done.clear();
  }
  for (Job& job : waiting) finished.push_back(std::move(job));
  waiting.clear();
  waiting_bytes = 0;
  for (Job& job : finished) {
    Commit(job);
    if (job.status.code() == StatusCode::kResourceExhausted) {
      if (target[job.page] == job.target) {
        job.status = Status::Ok();
        waiting_bytes += job.staged_bytes();
        waiting.push_back(std::move(job));
        continue;
      }
      ++stats.n_migrations_dropped;
    }
    Release(job);
  }
}

// Waits for the worker to finish everything queued, then commits it; promotions still without
// RAM are dropped.
void PlacementEngine::Impl::Drain() {
  if (worker.joinable()) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return queue.empty() && n_running == 0; });
  }
  CommitDone();
  for (Job& job : waiting) {
    ++stats.n_migrations_dropped;
    Release(job);
  }
  waiting.clear();
  waiting_bytes = 0;
}

}  // namespace argus
