// StopSignals: a real SIGTERM or SIGUSR1 only sets the flag (the process survives), and the
// previous handlers come back afterwards.
#include <gtest/gtest.h>

#include <csignal>

#include "core/signals.hpp"

namespace caviar {
namespace {

volatile std::sig_atomic_t g_previous = 0;
extern "C" void previous_handler(int sig) {
  g_previous = sig;
}

TEST(StopSignals, SignalsSetTheFlagAndHandlersAreRestored) {
  std::signal(SIGUSR1, &previous_handler);
  {
    StopSignals guard;
    EXPECT_EQ(StopSignals::received(), 0);
    ASSERT_EQ(std::raise(SIGUSR1), 0);  // would end the process without the handler
    EXPECT_EQ(StopSignals::received(), SIGUSR1);
    ASSERT_EQ(std::raise(SIGTERM), 0);
    EXPECT_EQ(StopSignals::received(), SIGTERM);
    EXPECT_EQ(g_previous, 0);
  }
  ASSERT_EQ(std::raise(SIGUSR1), 0);
  EXPECT_EQ(g_previous, SIGUSR1);
  std::signal(SIGUSR1, SIG_DFL);
  StopSignals again;  // a new guard starts clear
  EXPECT_EQ(StopSignals::received(), 0);
}

// main() installs the same handlers before MPI_Init: a signal during start-up survives into the
// driver's guard, and commands that poll nothing get it back at end_early().
TEST(StopSignals, EarlySignalSurvivesIntoTheGuardAndIsRaisedAgainAtEndEarly) {
  g_previous = 0;
  std::signal(SIGUSR1, &previous_handler);
  StopSignals::install_early();
  ASSERT_EQ(std::raise(SIGUSR1), 0);  // "during MPI_Init"
  EXPECT_EQ(g_previous, 0);
  {
    StopSignals guard;
    EXPECT_EQ(StopSignals::received(), SIGUSR1);
  }
  EXPECT_EQ(StopSignals::received(), SIGUSR1);
  StopSignals::end_early();  // the previous handler again, and the pending signal raised to it
  EXPECT_EQ(g_previous, SIGUSR1);
  EXPECT_EQ(StopSignals::received(), 0);
  std::signal(SIGUSR1, SIG_DFL);
}

}  // namespace
}  // namespace caviar
