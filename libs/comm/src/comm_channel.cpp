// The calling thread's channel (hp/comm/comm.h: set_channel): both transports key their
// communicators and call sequences by (channel, group), so two threads of a rank may run
// collectives on one group at once without their calls pairing up differently on different ranks.
// And its cancel flag (set_cancel_flag), which both transports' waits check.
#include "hp/comm/comm.h"

namespace hp::comm {

namespace {
thread_local int t_channel = 0;
thread_local const std::atomic<bool>* t_cancel = nullptr;
}  // namespace

void set_cancel_flag(const std::atomic<bool>* flag) { t_cancel = flag; }

bool cancellable() { return t_cancel != nullptr; }

bool cancelled() { return t_cancel && t_cancel->load(std::memory_order_acquire); }

void set_channel(int channel) { t_channel = channel; }

int channel() { return t_channel; }

}  // namespace hp::comm
