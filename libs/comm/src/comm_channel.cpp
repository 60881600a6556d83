// The calling thread's channel (hp/comm/comm.h: set_channel): both transports key their
// communicators and call sequences by (channel, group), so two threads of a rank may run
// collectives on one group at once without their calls pairing up differently on different ranks.
#include "hp/comm/comm.h"

namespace hp::comm {

namespace {
thread_local int t_channel = 0;
}  // namespace

void set_channel(int channel) { t_channel = channel; }

int channel() { return t_channel; }

}  // namespace hp::comm
