// Drives a pipeline rank's outstanding sends while it computes (pipeline_stage.cpp).
//
// A stage sends an activation and goes on with its next action. Over MPI a message of more than a
// few kilobytes uses the rendezvous protocol: its bytes move only while the sender is inside an MPI
// call, so without help the receiver waits until the sender's computation ends and it next calls
// MPI (measured: 20-55 ms of a 40 ms forward on tests/bench/train/bench_pipeline.py's model). While
// sends are outstanding, this thread calls Transport::progress every 200 µs; it sleeps otherwise.
// Every transport call of the rank is made holding lock(), which makes the two threads take turns
// (MPI_THREAD_SERIALIZED); a blocking receive holding the lock moves the sends itself.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

#include "hp/comm/comm.h"

namespace hp::train::detail {

class SendProgress {
 public:
  /// Starts the thread when the transport may be called from another thread.
  explicit SendProgress(comm::Transport& t);
  ~SendProgress();
  SendProgress(const SendProgress&) = delete;
  SendProgress& operator=(const SendProgress&) = delete;

  /// Held around every call of the transport.
  std::unique_lock<std::mutex> lock() { return std::unique_lock<std::mutex>(mu_); }
  /// After a send (with the lock held): there is something to drive.
  void sent();

 private:
  void loop();
  comm::Transport& t_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace hp::train::detail
