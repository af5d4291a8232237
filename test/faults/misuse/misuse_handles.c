/* SPDX-License-Identifier: Apache-2.0 */
/* C API misuse with request handles, in a world of one (no launcher): a freed handle, a double
   free, made-up handles (a stack address, a heap address, small integers, all-ones), a handle
   used after a shutdown and a new init. Every call must return HORA_ERR_INVALID_ARGUMENT (or
   NULL) with hora_last_error naming the call, never crash; a live handle must keep working.
   Each check runs in a child process, so a crash fails that check by name instead of the run. */
#define _POSIX_C_SOURCE 200809L /* strsignal */
#include <hora/hora.h>

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures = 0;

#define EXPECT(cond)                                                                  \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "  %s:%d: expected %s (last error: '%s')\n", __FILE__, __LINE__, \
              #cond, hora_last_error());                                              \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static float data[4];
static int64_t shape[1] = {4};

static hora_request_t submitted(const char *name) {
  DLTensor t = {data, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
  hora_request_t r = NULL;
  EXPECT(hora_allreduce_async(name, &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &r) == HORA_SUCCESS);
  EXPECT(r != NULL);
  return r;
}

/* Every entry point on `bad`: refused, with the call and "not a live request" in the error. */
static void expectRefused(hora_request_t bad) {
  int done = 7;
  EXPECT(hora_wait(bad) == HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "hora_wait: request ") != NULL);
  EXPECT(strstr(hora_last_error(), "is not a live request") != NULL);
  EXPECT(hora_poll(bad, &done) == HORA_ERR_INVALID_ARGUMENT && done == 7);
  EXPECT(strstr(hora_last_error(), "hora_poll: ") != NULL);
  EXPECT(hora_request_output(bad) == NULL);
  EXPECT(strstr(hora_last_error(), "hora_request_output: ") != NULL);
  EXPECT(strstr(hora_last_error(), "is not a live request") != NULL);
  EXPECT(hora_request_received_splits(bad) == NULL);
  EXPECT(strstr(hora_last_error(), "hora_request_received_splits: ") != NULL);
  hora_request_free(bad);
  EXPECT(strstr(hora_last_error(), "hora_request_free: ") != NULL);
  EXPECT(strstr(hora_last_error(), "nothing was freed") != NULL);
}

static void expectWorks(hora_request_t r) {
  int done = 0;
  EXPECT(hora_wait(r) == HORA_SUCCESS);
  EXPECT(hora_poll(r, &done) == HORA_SUCCESS && done == 1);
  hora_request_free(r);
}

static void freedHandle(void) {
  data[0] = 2.0f;
  hora_request_t r = submitted("freed");
  EXPECT(hora_wait(r) == HORA_SUCCESS);
  EXPECT(data[0] == 2.0f); /* a world of one: the sum is the input */
  hora_request_free(r);
  expectRefused(r);
}

static void doubleFree(void) {
  hora_request_t r = submitted("double");
  EXPECT(hora_wait(r) == HORA_SUCCESS);
  hora_request_free(r);
  hora_request_free(r);
  EXPECT(strstr(hora_last_error(), "hora_request_free: ") != NULL);
  hora_request_free(r);
  expectWorks(submitted("after.double"));
}

/* A freed handle whose slot a new request took: still refused, and the new one unharmed. */
static void staleAfterReuse(void) {
  hora_request_t old = submitted("old");
  EXPECT(hora_wait(old) == HORA_SUCCESS);
  hora_request_free(old);
  hora_request_t fresh = submitted("fresh");
  expectRefused(old);
  expectWorks(fresh);
  expectRefused(fresh);
}

static void madeUpHandles(void) {
  int onStack = 0;
  void *onHeap = malloc(64);
  memset(onHeap, 0xab, 64);
  hora_request_t bad[] = {
      (hora_request_t)(void *)&onStack, (hora_request_t)onHeap, (hora_request_t)(uintptr_t)1,
      (hora_request_t)(uintptr_t)0x10, (hora_request_t)(uintptr_t)0xdeadbeef,
      (hora_request_t)(~(uintptr_t)0), (hora_request_t)(~(uintptr_t)0 >> 1),
      (hora_request_t)(((uintptr_t)1 << (sizeof(uintptr_t) * 8 - 1)) | 1)};
  hora_request_t live = submitted("live");
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) expectRefused(bad[i]);
  /* a live handle with its bits flipped one at a time */
  for (unsigned bit = 0; bit < sizeof(uintptr_t) * 8; ++bit) {
    expectRefused((hora_request_t)((uintptr_t)live ^ ((uintptr_t)1 << bit)));
  }
  expectWorks(live);
  free(onHeap);
}

static void nullHandle(void) {
  int done = 0;
  EXPECT(hora_wait(NULL) == HORA_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(hora_last_error(), "hora_wait: request is NULL") != NULL);
  EXPECT(hora_poll(NULL, &done) == HORA_ERR_INVALID_ARGUMENT);
  EXPECT(hora_request_output(NULL) == NULL);
  hora_request_free(NULL); /* as free(NULL): nothing */
}

/* A request from before a shutdown stays a live request until freed (the design: pending
   requests complete with HORA_ERR_SHUT_DOWN); freed once, refused after. */
static void acrossShutdown(void) {
  hora_request_t r = submitted("before.shutdown");
  EXPECT(hora_wait(r) == HORA_SUCCESS);
  EXPECT(hora_shutdown() == HORA_SUCCESS);
  EXPECT(hora_wait(r) == HORA_SUCCESS);
  EXPECT(hora_init() == HORA_SUCCESS);
  hora_request_free(r);
  expectRefused(r);
  expectWorks(submitted("after.init"));
}

/* Two threads' worth of churn is out of scope for C99 without pthreads flags; many handles in
   flight at once exercise slot reuse instead. */
static void manyHandles(void) {
  enum { kN = 1000 };
  static hora_request_t rs[kN];
  static float bufs[kN];
  static int64_t one[1] = {1};
  for (int i = 0; i < kN; ++i) {
    DLTensor t = {&bufs[i], {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, one, NULL, 0};
    char name[32];
    snprintf(name, sizeof name, "many.%d", i);
    bufs[i] = (float)i;
    EXPECT(hora_allreduce_async(name, &t, &t, HORA_OP_SUM, 1.0, 1.0, 0, &rs[i]) == HORA_SUCCESS);
  }
  for (int i = 0; i < kN; ++i) {
    EXPECT(hora_wait(rs[i]) == HORA_SUCCESS);
    EXPECT(bufs[i] == (float)i);
  }
  for (int i = 0; i < kN; i += 2) hora_request_free(rs[i]);
  for (int i = 0; i < kN; i += 2) expectRefused(rs[i]);
  for (int i = 1; i < kN; i += 2) expectWorks(rs[i]);
}

struct Case {
  const char *name;
  void (*run)(void);
};

int main(void) {
  const struct Case cases[] = {{"freed handle", freedHandle},
                               {"double free", doubleFree},
                               {"stale handle after its slot is reused", staleAfterReuse},
                               {"made-up handles", madeUpHandles},
                               {"NULL handle", nullHandle},
                               {"handle across shutdown and init", acrossShutdown},
                               {"1000 handles, half freed", manyHandles}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    fflush(NULL);
    const pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) {
      alarm(20); /* a hang becomes SIGALRM, reported below */
      if (hora_init() != HORA_SUCCESS) {
        fprintf(stderr, "  hora_init: %s\n", hora_last_error());
        _exit(1);
      }
      cases[i].run();
      if (hora_shutdown() != HORA_SUCCESS) {
        fprintf(stderr, "  hora_shutdown: %s\n", hora_last_error());
        _exit(1);
      }
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      printf("ok   %s\n", cases[i].name);
    } else {
      ++failures;
      if (WIFSIGNALED(status)) {
        printf("FAIL %s: killed by signal %d (%s)\n", cases[i].name, WTERMSIG(status),
               strsignal(WTERMSIG(status)));
      } else {
        printf("FAIL %s: exit status %d\n", cases[i].name, WEXITSTATUS(status));
      }
    }
  }
  printf("%d of %zu failed\n", failures, sizeof cases / sizeof cases[0]);
  return failures == 0 ? 0 : 1;
}
