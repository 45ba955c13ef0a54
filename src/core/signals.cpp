#include "core/signals.hpp"

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace caviar {

namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int sig) {
  g_signal = sig;  // the only thing a handler may safely do here
}

void install(int sig, struct sigaction* old) {
  struct sigaction sa {};
  sa.sa_handler = &on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // interrupted reads and writes resume instead of failing with EINTR
  if (sigaction(sig, &sa, old) != 0)
    throw Error(std::string("cannot install a signal handler: ") + std::strerror(errno));
}
}  // namespace

StopSignals::StopSignals() {
  g_signal = 0;
  install(SIGTERM, &old_term_);
  install(SIGUSR1, &old_usr1_);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGUSR1, &old_usr1_, nullptr);
}

int StopSignals::received() {
  return g_signal;
}

void StopSignals::raise_for_test(int sig) {
  g_signal = sig;
}

}  // namespace caviar
