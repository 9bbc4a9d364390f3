/* The threads of the data path: the GIL on Triton's threads, a caller waiting
 * for its call (spinning, then a futex; Ctrl-C on the main thread), and the
 * completions met inside one execute, handed on in batches once it is done
 * (asyncio futures to their event loops, sleeping callers woken). */
#include "native.h"

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
      __builtin_ia32_pause();
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
  int main = on_main_thread();
  PyThreadState* ts = PyEval_SaveThread();
  drain_graveyard(GRAVE_STEP_WAITING); /* while Triton runs the call, without the GIL */
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

/* Async completions met inside one execute are handed to each event loop in
 * one call_soon_threadsafe (one wake-up of the loop per batch, not per
 * request): t_deferred maps loop -> list of calls while execute runs.
 * Across executes, a loop that has not yet run the _complete it was handed
 * gets later completions added to that same list (its mailbox) instead of
 * another call_soon_threadsafe: under load one wake-up of the loop resolves
 * the completions of many batches. g_mailboxes maps loop -> the list its
 * pending _complete will take; all of it under the GIL. */
__thread PyObject* t_deferred = NULL;
static PyObject* g_mailboxes = NULL;

static void free_calls(PyObject* calls)
{
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(calls); i++)
    call_free((Call*)PyCapsule_GetPointer(PyList_GET_ITEM(calls, i), "embedtriton.call"));
  PyList_SetSlice(calls, 0, PyList_GET_SIZE(calls), NULL);
}

/* Whether an asyncio loop was closed (its pending callbacks will never run). */
static int loop_closed(PyObject* loop)
{
  static PyObject* s_is_closed = NULL;
  if (s_is_closed == NULL && (s_is_closed = PyUnicode_InternFromString("is_closed")) == NULL) {
    PyErr_Clear();
    return 0;
  }
  PyObject* r = PyObject_CallMethodNoArgs(loop, s_is_closed);
  int closed = r == Py_True;
  if (r == NULL) PyErr_Clear(); /* not an asyncio loop: it runs what it is handed */
  Py_XDECREF(r);
  return closed;
}

static void hand_to_loop(PyObject* loop, PyObject* calls)
{
  if (g_mailboxes == NULL && (g_mailboxes = PyDict_New()) == NULL) {
    PyErr_WriteUnraisable(loop);
    free_calls(calls);
    return;
  }
  int closed = 0;
  PyObject* mailbox = PyDict_GetItemWithError(g_mailboxes, loop); /* borrowed */
  if (mailbox != NULL) {
    closed = loop_closed(loop); /* Python code: the loop may take its mailbox meanwhile */
    mailbox = PyDict_GetItemWithError(g_mailboxes, loop);
  }
  if (mailbox != NULL) {
    if (!closed) {
      if (PyList_SetSlice(mailbox, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, calls) == 0) return;
      PyErr_WriteUnraisable(loop);
      free_calls(calls);
      return;
    }
    Py_INCREF(mailbox); /* its _complete will never run */
    take_mailbox(loop, mailbox);
    free_calls(mailbox);
    Py_DECREF(mailbox);
  }
  PyErr_Clear();
  if (PyDict_SetItem(g_mailboxes, loop, calls) < 0) {
    PyErr_WriteUnraisable(loop);
    free_calls(calls);
    return;
  }
  /* (an immediate loop runs _complete inside this call, which takes the mailbox back) */
  PyObject* r =
      PyObject_CallMethodObjArgs(loop, s_call_soon_threadsafe, g_complete, loop, calls, NULL);
  if (r == NULL) { /* the loop is closed: nobody is waiting any more */
    PyErr_WriteUnraisable(loop);
    take_mailbox(loop, calls);
    free_calls(calls);
  }
  Py_XDECREF(r);
}

/* With the GIL, on the loop (from _complete): the mailbox stops taking completions. */
void take_mailbox(PyObject* loop, PyObject* calls)
{
  PyObject* mailbox = g_mailboxes ? PyDict_GetItemWithError(g_mailboxes, loop) : NULL;
  if (mailbox == calls && PyDict_DelItem(g_mailboxes, loop) < 0) PyErr_WriteUnraisable(loop);
  PyErr_Clear();
}

/* With the GIL: hand an async call's completion to its event loop. */
void schedule_async(Call* c)
{
  PyObject* capsule = PyCapsule_New(c, "embedtriton.call", NULL);
  if (capsule == NULL) {
    PyErr_WriteUnraisable(NULL);
    return;
  }
  if (t_deferred != NULL) {
    PyObject* calls = PyDict_GetItemWithError(t_deferred, c->loop);
    if (calls == NULL && !PyErr_Occurred()) {
      calls = PyList_New(0);
      if (calls && PyDict_SetItem(t_deferred, c->loop, calls) == 0) Py_DECREF(calls);
    }
    if (calls != NULL && PyList_Append(calls, capsule) == 0) {
      Py_DECREF(capsule);
      return;
    }
    PyErr_Clear();
  }
  PyObject* calls = PyList_New(1);
  if (calls != NULL) {
    PyList_SET_ITEM(calls, 0, capsule);
    hand_to_loop(c->loop, calls);
    Py_DECREF(calls);
  }
}

void flush_deferred(void)
{
  PyObject* deferred = t_deferred;
  t_deferred = NULL;
  if (deferred == NULL) return;
  Py_ssize_t pos = 0;
  PyObject *loop, *calls;
  while (PyDict_Next(deferred, &pos, &loop, &calls)) hand_to_loop(loop, calls);
  Py_DECREF(deferred);
}

/* Synchronous callers completed inside one execute are woken after it lets
 * go of the GIL, which they need next: woken earlier, each would go straight
 * back to sleep waiting for the GIL. */
__thread atomic_int** t_wake = NULL;
__thread size_t t_wake_len = 0, t_wake_cap = 0;
__thread int t_in_execute = 0;
__thread int t_model_thread = 0;
__thread const char* t_model_name = NULL;

void flush_wakes(void)
{
  for (size_t i = 0; i < t_wake_len; i++) wait_signal(t_wake[i]);
  t_wake_len = 0;
}
