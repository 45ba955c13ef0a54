#include "core/signals.hpp"

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace caviar {

namespace {
volatile std::sig_atomic_t g_signal = 0;
bool g_early = false;  // install_early() has run and end_early() not yet
struct sigaction g_early_term {
}, g_early_usr1{};

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
  if (!g_early) g_signal = 0;  // with the early handlers, a start-up signal must survive
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

void StopSignals::install_early() {
  if (g_early) return;
  g_signal = 0;
  install(SIGTERM, &g_early_term);
  install(SIGUSR1, &g_early_usr1);
  g_early = true;
}

void StopSignals::end_early() {
  if (!g_early) return;
  g_early = false;
  sigaction(SIGTERM, &g_early_term, nullptr);
  sigaction(SIGUSR1, &g_early_usr1, nullptr);
  const int sig = g_signal;
  g_signal = 0;
  if (sig != 0) std::raise(sig);  // to the disposition from before: by default, the end
}

}  // namespace caviar
