// SendProgress (send_progress.h).
#include "send_progress.h"

#include <chrono>

namespace hp::train::detail {

SendProgress::SendProgress(comm::Transport& t) : t_(t) {
  if (t_.any_thread()) thread_ = std::thread([this] { loop(); });
}

SendProgress::~SendProgress() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void SendProgress::sent() {
  pending_ = true;
  cv_.notify_one();
}

void SendProgress::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    if (!pending_) {
      cv_.wait(lk, [this] { return stop_ || pending_; });
      continue;
    }
    // An error here is the send's: the rank's flush at the end of the step reports it.
    auto left = t_.progress();
    pending_ = left && *left;
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    lk.lock();
  }
}

}  // namespace hp::train::detail
