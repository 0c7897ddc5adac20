/* The machine's floor for a launch: the least a launcher can do to have N
 * workers run and exit. posix_spawn(3) N copies of a program (no environment
 * work, no pipes, no rendezvous, no process groups), then wait for them all.
 * bench/launch_latency.py compiles it with cc and times it like ddprun, from
 * its own exec to its exit, as the "floor" column.
 *
 *   cc -O2 -o spawn_floor bench/spawn_floor.c && ./spawn_floor 8 /usr/bin/true
 */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char** environ;

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: spawn_floor N PROGRAM [ARGS...]\n");
    return 2;
  }
  const int n = atoi(argv[1]);
  if (n <= 0 || n > 4096) {
    fprintf(stderr, "spawn_floor: N must be 1-4096, not '%s'\n", argv[1]);
    return 2;
  }
  int started = 0, failed = 0;
  for (; started < n; ++started) {
    pid_t pid;
    const int rc = posix_spawn(&pid, argv[2], NULL, NULL, argv + 2, environ);
    if (rc != 0) {
      fprintf(stderr, "spawn_floor: cannot start '%s': %s; give a runnable program\n", argv[2],
              strerror(rc));
      failed = 1;
      break;
    }
  }
  for (int i = 0; i < started; ++i) {  // every started worker is waited for
    int status = 0;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  if (failed > 0 && started == n) {
    fprintf(stderr, "spawn_floor: %d of %d workers did not exit 0; the floor needs a program "
            "that succeeds (true)\n", failed, n);
  }
  return failed > 0;
}
