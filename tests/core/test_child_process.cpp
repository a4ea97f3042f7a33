// The one child-process spawner (core/detail/child_process.hpp), with /bin/sh and /bin/true as
// children: exit codes, signals, a wait that times out and a kill, the environment asked for,
// descriptors passed, redirected and swapped, nothing else leaked, reaping on destruction.
#include <cubridge/core/detail/child_process.hpp>
#include <cubridge/core/error.hpp>
#include <cubridge/core/unique_fd.hpp>

#include "temp_dir.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

namespace {

using cubridge::unique_fd;
using cubridge::detail::child_exit;
using cubridge::detail::child_fd;
using cubridge::detail::child_process;
using cubridge::detail::child_spec;
using namespace std::chrono_literals;

const std::vector<std::string> plain_env = {"PATH=/usr/bin:/bin"};

child_spec shell(const std::string& script, std::vector<child_fd> fds = {}) {
  return {"/bin/sh", {"-c", script}, plain_env, std::move(fds), {}};
}

struct pipe_pair {
  pipe_pair() {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) std::abort();
    read.reset(p[0]);
    write.reset(p[1]);
  }
  unique_fd read, write;
};

/// Everything readable from `fd` until every writer has closed it.
std::string read_all(int fd) {
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  return text;
}

/// Runs `spec` with its stdout into a pipe; returns what it wrote and how it ended.
std::pair<std::string, child_exit> output_of(child_spec spec) {
  pipe_pair out;
  spec.fds.push_back({1, out.write.get()});
  auto child = child_process::spawn(spec);
  out.write.reset();
  auto text = read_all(out.read.get());
  return {text, child.wait()};
}

TEST(ChildProcess, ReportsTheExitCode) {
  auto t = child_process::spawn({"/bin/true", {}, plain_env, {}, {}});
  EXPECT_GT(t.pid(), 0);
  EXPECT_TRUE(t.running());
  const auto ok = t.wait();
  EXPECT_TRUE(ok.exited());
  EXPECT_EQ(ok.exit_code, 0);
  EXPECT_FALSE(t.running());
  EXPECT_EQ(t.pid(), 0);

  const auto three = child_process::spawn(shell("exit 3")).wait();
  EXPECT_EQ(three.how, child_exit::kind::exited);
  EXPECT_EQ(three.exit_code, 3);
  EXPECT_EQ(three.describe(), "exited with status 3");
}

TEST(ChildProcess, ReportsTheSignalThatEndedIt) {
  const auto e = child_process::spawn(shell("kill -SEGV $$")).wait();
  EXPECT_TRUE(e.signaled());
  EXPECT_EQ(e.signal, SIGSEGV);
  EXPECT_NE(e.describe().find("killed by signal 11 ("), std::string::npos) << e.describe();
}

TEST(ChildProcess, AWaitThatTimesOutLeavesItRunningAndKillReapsIt) {
  auto child = child_process::spawn(shell("exec sleep 30"));
  const pid_t pid = child.pid();
  EXPECT_FALSE(child.try_wait().has_value());
  EXPECT_FALSE(child.wait_for(20ms).has_value());
  EXPECT_TRUE(child.running());
  EXPECT_EQ(::kill(pid, 0), 0);
  const auto e = child.kill();
  EXPECT_TRUE(e.signaled());
  EXPECT_EQ(e.signal, SIGKILL);
  EXPECT_FALSE(child.running());
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1) << "not reaped";
  EXPECT_EQ(errno, ECHILD);
}

TEST(ChildProcess, AWaitWithTimeReturnsOnceTheChildEnds) {
  pipe_pair go;
  auto child = child_process::spawn(shell("read line; exit 4", {{0, go.read.get()}}));
  EXPECT_FALSE(child.wait_for(10ms).has_value());
  ASSERT_EQ(::write(go.write.get(), "\n", 1), 1);
  const auto e = child.wait_for(std::chrono::nanoseconds::max());  // no limit, no overflow
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->exit_code, 4);
}

TEST(ChildProcess, KillAfterTheChildEndedReportsWhatItDid) {
  auto child = child_process::spawn(shell("exit 5"));
  // Wait until it has ended without reaping it (WNOWAIT): the kill then finds a zombie.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child.pid()), &info, WEXITED | WNOWAIT), 0);
  const auto e = child.kill();
  EXPECT_TRUE(e.exited());
  EXPECT_EQ(e.exit_code, 5);
}

TEST(ChildProcess, DestructionKillsAndReaps) {
  pid_t pid = 0;
  {
    auto child = child_process::spawn(shell("exec sleep 30"));
    pid = child.pid();
    ASSERT_EQ(::kill(pid, 0), 0);
  }
  EXPECT_EQ(::waitpid(pid, nullptr, WNOHANG), -1) << "the child was not reaped";
  EXPECT_EQ(errno, ECHILD);
}

TEST(ChildProcess, AMoveHandsTheChildOver) {
  auto first = child_process::spawn(shell("exit 6"));
  const pid_t pid = first.pid();
  child_process second = std::move(first);
  EXPECT_EQ(first.pid(), 0);
  EXPECT_EQ(second.pid(), pid);
  EXPECT_EQ(first.wait().wait_error, ECHILD);  // a moved-from object holds none
  EXPECT_EQ(second.wait().exit_code, 6);
}

TEST(ChildProcess, TheChildGetsExactlyTheEnvironmentAskedFor) {
  ::setenv("CUBRIDGE_TEST_PARENT_ONLY", "1", 1);
  const auto [text, e] = output_of({"/bin/sh",
                                    {"-c", "echo \"$GREETING|${CUBRIDGE_TEST_PARENT_ONLY-unset}\""},
                                    {"GREETING=hello there", "PATH=/usr/bin:/bin"},
                                    {},
                                    {}});
  ::unsetenv("CUBRIDGE_TEST_PARENT_ONLY");
  EXPECT_EQ(text, "hello there|unset\n");
  EXPECT_EQ(e.exit_code, 0);
}

TEST(ChildProcess, EnvironmentWithOverridesAndRemoves) {
  ::setenv("CUBRIDGE_TEST_KEPT", "old", 1);
  ::setenv("CUBRIDGE_TEST_REMOVED", "here", 1);
  const auto env = cubridge::detail::environment_with(
      {"CUBRIDGE_TEST_KEPT=new", "CUBRIDGE_TEST_SET=1"}, {"CUBRIDGE_TEST_REMOVED"});
  ::unsetenv("CUBRIDGE_TEST_KEPT");
  ::unsetenv("CUBRIDGE_TEST_REMOVED");
  const auto count = [&](const std::string& prefix) {
    return std::count_if(env.begin(), env.end(),
                         [&](const std::string& e) { return e.starts_with(prefix); });
  };
  EXPECT_EQ(count("CUBRIDGE_TEST_KEPT="), 1);
  EXPECT_NE(std::find(env.begin(), env.end(), "CUBRIDGE_TEST_KEPT=new"), env.end());
  EXPECT_EQ(count("CUBRIDGE_TEST_SET=1"), 1);
  EXPECT_EQ(count("CUBRIDGE_TEST_REMOVED="), 0);
}

TEST(ChildProcess, PassesAndRedirectsDescriptors) {
  pipe_pair in, side;
  ASSERT_EQ(::write(in.write.get(), "from the parent\n", 16), 16);
  in.write.reset();
  const auto [text, e] = output_of(shell("read line; echo \"got $line\"; echo side >&5",
                                         {{0, in.read.get()}, {5, side.write.get()}}));
  side.write.reset();
  EXPECT_EQ(text, "got from the parent\n");
  EXPECT_EQ(read_all(side.read.get()), "side\n");
  EXPECT_EQ(e.exit_code, 0);
}

TEST(ChildProcess, DescriptorsThatSwapNumbersArriveIntact) {
  // The parent's 40 becomes the child's 41 and its 41 the child's 40: a naive dup2 in order
  // would overwrite one source before it is duplicated.
  pipe_pair a, b;
  unique_fd forty(::fcntl(a.write.get(), F_DUPFD_CLOEXEC, 40));
  unique_fd forty_one(::fcntl(b.write.get(), F_DUPFD_CLOEXEC, 41));
  ASSERT_EQ(forty.get(), 40);
  ASSERT_EQ(forty_one.get(), 41);
  a.write.reset();
  b.write.reset();
  auto child = child_process::spawn(
      shell("echo to-a >/proc/self/fd/41; echo to-b >/proc/self/fd/40", {{41, 40}, {40, 41}}));
  forty.reset();  // the child's copies are the only writers left
  forty_one.reset();
  EXPECT_EQ(child.wait().exit_code, 0);
  EXPECT_EQ(read_all(a.read.get()), "to-a\n");
  EXPECT_EQ(read_all(b.read.get()), "to-b\n");
}

TEST(ChildProcess, NoOtherDescriptorReachesTheChild) {
  int leaky[2];  // without O_CLOEXEC: exec alone would pass them on
  ASSERT_EQ(::pipe(leaky), 0);
  const unique_fd r(leaky[0]), w(leaky[1]);
  pipe_pair passed;
  const auto [text, e] = output_of(
      shell("n=0; while [ $n -lt 64 ]; do [ -e /proc/self/fd/$n ] && echo $n; n=$((n+1)); done",
            {{7, passed.write.get()}}));
  EXPECT_EQ(text, "0\n1\n2\n7\n") << "the leaky pipe was " << leaky[0] << ", " << leaky[1];
  EXPECT_EQ(e.exit_code, 0);
}

TEST(ChildProcess, TheChildStartsWithNoSignalBlocked) {
  sigset_t block, before;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &block, &before), 0);
  // grep itself, not a shell: dash clears its signal mask when it starts.
  const auto [text, e] =
      output_of({"/usr/bin/grep", {"SigBlk", "/proc/self/status"}, plain_env, {}, {}});
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  EXPECT_EQ(text, "SigBlk:\t0000000000000000\n");
}

TEST(ChildProcess, StartsInTheWorkingDirectoryAskedFor) {
  cubridge::testing::temp_dir dir;
  auto spec = shell("pwd");
  spec.working_directory = dir.path;
  const auto [text, e] = output_of(spec);
  EXPECT_EQ(text, std::filesystem::canonical(dir.path).string() + "\n");
}

TEST(ChildProcess, AProgramThatCannotBeStartedIsAnErrorNamingIt) {
  try {
    (void)child_process::spawn({"/nonexistent/program", {}, plain_env, {}, {}});
    FAIL() << "no error";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io)) << e.what();
    EXPECT_EQ(e.call(), "posix_spawn");
    EXPECT_EQ(e.involved(), "/nonexistent/program: No such file or directory");
  }
  cubridge::testing::temp_dir dir;
  const auto not_executable = dir.path / "script";
  cubridge::testing::write_text(not_executable, "#!/bin/sh\n");
  try {
    (void)child_process::spawn({not_executable.string(), {}, plain_env, {}, {}});
    FAIL() << "no error";
  } catch (const cubridge::error& e) {
    EXPECT_EQ(e.involved(), not_executable.string() + ": Permission denied") << e.what();
  }
}

TEST(ChildProcess, BadDescriptorRequestsArePreconditionErrors) {
  pipe_pair p;
  const auto refused = [&](std::vector<child_fd> fds) {
    try {
      (void)child_process::spawn({"/bin/true", {}, plain_env, std::move(fds), {}});
    } catch (const cubridge::error& e) {
      return e.is(cubridge::errc::precondition);
    }
    return false;
  };
  EXPECT_TRUE(refused({{3, p.write.get()}, {3, p.read.get()}}));
  EXPECT_TRUE(refused({{-1, p.write.get()}}));
  EXPECT_TRUE(refused({{cubridge::detail::max_child_fd, p.write.get()}}));
  EXPECT_TRUE(refused({{3, -1}}));
  try {
    (void)child_process::spawn({"", {}, plain_env, {}, {}});
    FAIL() << "no error";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::precondition)) << e.what();
  }
}

TEST(ChildProcess, AClosedParentDescriptorIsAnIoError) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ::close(p[0]);
  ::close(p[1]);
  try {
    (void)child_process::spawn({"/bin/true", {}, plain_env, {{3, p[1]}}, {}});
    FAIL() << "no error";
  } catch (const cubridge::error& e) {
    EXPECT_TRUE(e.is(cubridge::errc::io)) << e.what();
    EXPECT_NE(e.involved().find("cannot duplicate descriptor"), std::string::npos) << e.what();
  }
}

TEST(ChildExit, DescribesAnUnknownEnd) {
  child_exit e;
  e.wait_error = ECHILD;
  EXPECT_EQ(e.describe(),
            "ended, exit status unknown (waitpid: No child processes; is SIGCHLD ignored?)");
}

}  // namespace
