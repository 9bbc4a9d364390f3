/* The threads of the data path: the GIL on Triton's threads, a caller waiting
 * for its call (spinning, then a futex; Ctrl-C on the main thread), what a
 * thread is running (an execute, a model's event loop), and the sleeping
 * callers met inside one execute, woken once it is done. (Asyncio completions
 * are batched the same way by complete.c.) */
#include "threads.h"

#include "graveyard.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- the GIL on Triton's threads ----------------------------------------
 * PyGILState_Ensure/Release create and destroy a thread state each time on a
 * thread Python did not start; Triton's threads keep theirs instead and only
 * hand the GIL back and forth. Reentrant (a response callback can run inside
 * our own execute, which already holds the GIL). */
static __thread PyThreadState* t_state = NULL;
__thread int t_gil_depth = 0;

/* Returns whether it took the GIL (0 when this thread already held it). */
int gil_enter(void)
{
  if (t_gil_depth > 0 || PyGILState_Check()) return 0;
  t_gil_depth = 1;
  if (t_state == NULL) {
    PyGILState_Ensure(); /* never released: the thread state stays */
    t_state = PyThreadState_Get();
  } else {
    PyEval_RestoreThread(t_state);
  }
  return 1;
}

void gil_leave(int entered)
{
  if (!entered) return;
  t_gil_depth = 0;
  t_state = PyEval_SaveThread();
}

/* ---- waiting for a call ---------------------------------------------------
 * A synchronous caller spins briefly (GIL released) before it sleeps on a
 * futex: most responses come back within tens of microseconds, and waking a
 * sleeping thread costs about as much. Only a lone call spins: with others in
 * flight the cores are better left to Triton and the other callers. */
uint64_t spin_ns = 100000; /* EMBEDTRITON_SPIN_US overrides */
static atomic_int spinners = 0;
atomic_int in_flight = 0; /* calls handed to Triton, not yet complete */

void wait_signal(atomic_int* state)
{
  if (atomic_exchange(state, WAIT_DONE) == WAIT_SLEEPING)
    syscall(SYS_futex, state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* Wait (without the GIL) until *state is WAIT_DONE, spinning first when asked.
 * timeout_ns 0: for ever. Returns whether it is done. */
int wait_for(atomic_int* state, int spin, uint64_t timeout_ns)
{
  if (spin && atomic_fetch_add(&spinners, 1) == 0 && spin_ns && atomic_load(&in_flight) <= 1) {
    uint64_t until = now_ns() + spin_ns;
    for (int i = 0; atomic_load_explicit(state, memory_order_acquire) != WAIT_DONE; i++) {
      cpu_relax();
      if ((i & 63) == 0 && now_ns() > until) break;
    }
  }
  if (spin) atomic_fetch_sub(&spinners, 1);
  int expected = WAIT_PENDING;
  if (atomic_compare_exchange_strong(state, &expected, WAIT_SLEEPING) ||
      expected == WAIT_SLEEPING) {
    struct timespec ts = {(time_t)(timeout_ns / 1000000000ull), (long)(timeout_ns % 1000000000ull)};
    while (atomic_load(state) != WAIT_DONE) {
      long r = syscall(SYS_futex, state, FUTEX_WAIT_PRIVATE, WAIT_SLEEPING, timeout_ns ? &ts : NULL,
                       NULL, 0);
      if (r != 0 && errno == ETIMEDOUT) return atomic_load(state) == WAIT_DONE;
    }
  }
  return 1;
}

/* ---- a model thread lingering after its execute --------------------------
 * A thread that sleeps is slow to wake on a VM (tens of µs: its idle vCPU halts), and a
 * synchronous caller's next request always finds Triton's instance thread asleep: it went to
 * wait for work while the caller read its outputs. So after an execute that left nothing in
 * flight, the instance thread spins for up to linger_ns (GIL released) until the next request
 * is handed to Triton, and only then goes back to Triton's queue:
 * - without a batcher thread, once the request is in that queue (handed_over counts requests
 *   ServerInferAsync took), where the instance thread takes it without sleeping;
 * - with one (dynamic or sequence batcher), as soon as a request is on its way (in_flight):
 *   the batcher only hands it on to an instance that execute gave back, and it runs on the
 *   core the lingering thread leaves.
 * One thread lingers at a time. Lingers that time out make the next ones skip (1, 3, 7, then
 * 15 executes), so a server that sees one request now and then spins rarely. */
uint64_t linger_ns = 250000;        /* EMBEDTRITON_LINGER_US overrides */
static atomic_uint handed_over = 0; /* requests ServerInferAsync took, so far (hand_over) */
static atomic_int lingering = 0;
static int linger_misses = 0, linger_skip = 0; /* (the lingering thread's) */
static atomic_llong n_lingers = 0, n_caught = 0;

/* The one hand-over of a request to Triton: ServerInferAsync, and the count linger() watches.
 * The callers choose whether the GIL is held around it (see submit_locked). */
TRITONSERVER_Error* hand_over(TRITONSERVER_Server* server, TRITONSERVER_InferenceRequest* req,
                              TRITONSERVER_InferenceTrace* trace)
{
  TRITONSERVER_Error* err = api.TRITONSERVER_ServerInferAsync(server, req, trace);
  if (err == NULL) atomic_fetch_add(&handed_over, 1);
  return err;
}

void linger(int with_batcher)
{
  if (linger_ns == 0 || atomic_load(&in_flight) != 0 || atomic_exchange(&lingering, 1)) return;
  if (linger_skip > 0) {
    linger_skip--;
    atomic_store(&lingering, 0);
    return;
  }
  unsigned seen = atomic_load(&handed_over);
  uint64_t until = now_ns() + linger_ns;
  int caught = 0;
  for (int i = 0; !caught; i++) {
    caught = with_batcher ? atomic_load_explicit(&in_flight, memory_order_acquire) != 0
                          : atomic_load_explicit(&handed_over, memory_order_acquire) != seen;
    cpu_relax();
    if ((i & 63) == 0 && now_ns() > until) break;
  }
  atomic_fetch_add(&n_lingers, 1);
  if (caught) {
    atomic_fetch_add(&n_caught, 1);
    linger_misses = 0;
  } else {
    if (linger_misses < 4) linger_misses++;
    linger_skip = (1 << linger_misses) - 1;
  }
  atomic_store(&lingering, 0);
}

/* linger_stats() -> (lingers, caught): lingers so far, and those that met a request. */
PyObject* py_linger_stats(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  return Py_BuildValue("(LL)", (long long)atomic_load(&n_lingers),
                       (long long)atomic_load(&n_caught));
}

/* Signal handlers (Ctrl-C) run on the main thread only, between bytecodes:
 * a main thread waiting for Triton wakes every SIGNAL_CHECK_NS to run them. */
unsigned long main_thread_ident = 0;

int on_main_thread(void)
{
  return main_thread_ident != 0 && PyThread_get_thread_ident() == main_thread_ident;
}

/* With the GIL: wait until *state is WAIT_DONE. Returns -1 with the exception
 * set when a signal handler raised (KeyboardInterrupt) on the main thread. */
int wait_interruptible(atomic_int* state)
{
  return wait_released(state, PyEval_SaveThread());
}

/* wait_interruptible for a caller that let go of the GIL already (ts: its thread state, from
 * PyEval_SaveThread); it holds the GIL again on return. */
int wait_released(atomic_int* state, PyThreadState* ts)
{
  int main = on_main_thread();
  delete_buried(GRAVE_STEP_WAITING); /* while Triton runs the call, without the GIL */
  int done = wait_for(state, 1, main ? SIGNAL_CHECK_NS : 0);
  while (!done) {
    PyEval_RestoreThread(ts);
    if (PyErr_CheckSignals() < 0) return -1;
    ts = PyEval_SaveThread();
    done = wait_for(state, 0, SIGNAL_CHECK_NS);
  }
  PyEval_RestoreThread(ts);
  return 0;
}

/* Synchronous callers completed inside one execute are woken after it lets
 * go of the GIL, which they need next: woken earlier, each would go straight
 * back to sleep waiting for the GIL. */
__thread atomic_int** t_wake = NULL;
__thread size_t t_wake_len = 0, t_wake_cap = 0;
__thread const char* t_model_name = NULL;

void flush_wakes(void)
{
  for (size_t i = 0; i < t_wake_len; i++) wait_signal(t_wake[i]);
  t_wake_len = 0;
}
