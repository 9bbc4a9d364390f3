/* embedtriton's native module: the per-request data path.
 *
 * One shared library with two faces:
 *  - a CPython extension (embedtriton._native) that builds inference requests
 *    from numpy arrays, hands them to TRITONSERVER_ServerInferAsync and turns
 *    responses into numpy arrays (caller side);
 *  - the Triton backend "embedtriton" (TRITONBACKEND_* entry points): Triton
 *    dlopens this same file and calls TRITONBACKEND_ModelInstanceExecute with a
 *    batch of requests, which we hand to the bound Python callable once per
 *    batch (model side).
 *
 * The control plane (server options, loading, metadata) stays in Python
 * (embedtriton/_capi.py). Triton functions are resolved with dlsym() from the
 * runtime that Python loaded (et_load), so nothing links against Triton. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION
#include <numpy/arrayobject.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "triton_api.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DIMS 32
#define CONTROL_PREFIX "_embedtriton_"
#define RELEASE_RESCHEDULE 2 /* TRITONSERVER_REQUEST_RELEASE_RESCHEDULE */

static et_api_t api;
static int api_loaded = 0;
static TRITONSERVER_ResponseAllocator* allocator = NULL;

/* Hooks installed from Python by set_hooks(). */
static PyObject* g_bindings = NULL;      /* dict: model directory -> Binding */
static PyObject* g_request_type = NULL;  /* embedtriton.binding.Request */
static PyObject* g_make_error = NULL;    /* (code, message) -> TritonError */
static PyObject* g_decode_bytes = NULL;  /* (bytes, shape) -> object array */
static PyObject* g_encode_bytes = NULL;  /* array -> bytes (Triton BYTES) */
static PyObject* g_complete = NULL;      /* our own _complete, for asyncio */
static PyObject* g_request_done = NULL;  /* (request key) -> None: close its generator */
static PyObject* s_call_soon_threadsafe, *s_parameters, *s_execute,
    *s_max_batch_size, *s_output_specs, *s_name, *s_done, *s_set_result,
    *s_set_exception;

static const char* const dtype_names[] = {
    "INVALID", "BOOL",  "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
    "INT32",   "INT64", "FP16",  "FP32",   "FP64",   "BYTES",  "BF16"};

static const char* dtype_name(int t)
{
  return (t >= 0 && t <= TRITONSERVER_TYPE_BF16) ? dtype_names[t] : "INVALID";
}

static uint64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the GIL on Triton's threads ----------------------------------------
 * PyGILState_Ensure/Release create and destroy a thread state each time on a
 * thread Python did not start; Triton's threads keep theirs instead and only
 * hand the GIL back and forth. Reentrant (a response callback can run inside
 * our own execute, which already holds the GIL). */
static __thread PyThreadState* t_state = NULL;
static __thread int t_depth = 0;

/* Returns whether it took the GIL (0 when this thread already held it). */
static int gil_enter(void)
{
  if (t_depth > 0 || PyGILState_Check()) return 0;
  t_depth = 1;
  if (t_state == NULL) {
    PyGILState_Ensure(); /* never released: the thread state stays */
    t_state = PyThreadState_Get();
  } else {
    PyEval_RestoreThread(t_state);
  }
  return 1;
}

static void gil_leave(int entered)
{
  if (!entered) return;
  t_depth = 0;
  t_state = PyEval_SaveThread();
}

/* ---- waiting for a call ---------------------------------------------------
 * A synchronous caller spins briefly (GIL released) before it sleeps on a
 * futex: most responses come back within tens of microseconds, and waking a
 * sleeping thread costs about as much. Only a lone call spins: with others in
 * flight the cores are better left to Triton and the other callers. */
enum { WAIT_PENDING = 0, WAIT_DONE = 1, WAIT_SLEEPING = 2 };
static uint64_t spin_ns = 100000; /* EMBEDTRITON_SPIN_US overrides */
static atomic_int spinners = 0;
static atomic_int in_flight = 0; /* calls handed to Triton, not yet complete */

static void wait_signal(atomic_int* state)
{
  if (atomic_exchange(state, WAIT_DONE) == WAIT_SLEEPING)
    syscall(SYS_futex, state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* Wait (without the GIL) until *state is WAIT_DONE, spinning first when asked.
 * timeout_ns 0: for ever. Returns whether it is done. */
static int wait_for(atomic_int* state, int spin, uint64_t timeout_ns)
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
  if (atomic_compare_exchange_strong(state, &expected, WAIT_SLEEPING) || expected == WAIT_SLEEPING) {
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
#define SIGNAL_CHECK_NS 50000000ull
static unsigned long main_thread_ident = 0;

static int on_main_thread(void)
{
  return main_thread_ident != 0 && PyThread_get_thread_ident() == main_thread_ident;
}

/* With the GIL: wait until *state is WAIT_DONE. Returns -1 with the exception
 * set when a signal handler raised (KeyboardInterrupt) on the main thread. */
static int wait_interruptible(atomic_int* state)
{
  int main = on_main_thread();
  PyThreadState* ts = PyEval_SaveThread();
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

/* ---- dtype mapping ----------------------------------------------------- */

/* Triton datatype of a numpy array; BYTES for object/bytes/str arrays. */
static TRITONSERVER_DataType triton_dtype_of(PyArrayObject* a)
{
  PyArray_Descr* d = PyArray_DESCR(a);
  npy_intp size = PyArray_ITEMSIZE(a);
  switch (d->kind) {
    case 'b':
      return TRITONSERVER_TYPE_BOOL;
    case 'i':
      return size == 1   ? TRITONSERVER_TYPE_INT8
             : size == 2 ? TRITONSERVER_TYPE_INT16
             : size == 4 ? TRITONSERVER_TYPE_INT32
             : size == 8 ? TRITONSERVER_TYPE_INT64
                         : TRITONSERVER_TYPE_INVALID;
    case 'u':
      return size == 1   ? TRITONSERVER_TYPE_UINT8
             : size == 2 ? TRITONSERVER_TYPE_UINT16
             : size == 4 ? TRITONSERVER_TYPE_UINT32
             : size == 8 ? TRITONSERVER_TYPE_UINT64
                         : TRITONSERVER_TYPE_INVALID;
    case 'f':
      return size == 2   ? TRITONSERVER_TYPE_FP16
             : size == 4 ? TRITONSERVER_TYPE_FP32
             : size == 8 ? TRITONSERVER_TYPE_FP64
                         : TRITONSERVER_TYPE_INVALID;
    case 'O':
    case 'S':
    case 'U':
      return TRITONSERVER_TYPE_BYTES;
    default:
      return TRITONSERVER_TYPE_INVALID;
  }
}

static int numpy_typenum_of(TRITONSERVER_DataType t)
{
  switch (t) {
    case TRITONSERVER_TYPE_BOOL: return NPY_BOOL;
    case TRITONSERVER_TYPE_UINT8: return NPY_UINT8;
    case TRITONSERVER_TYPE_UINT16: return NPY_UINT16;
    case TRITONSERVER_TYPE_UINT32: return NPY_UINT32;
    case TRITONSERVER_TYPE_UINT64: return NPY_UINT64;
    case TRITONSERVER_TYPE_INT8: return NPY_INT8;
    case TRITONSERVER_TYPE_INT16: return NPY_INT16;
    case TRITONSERVER_TYPE_INT32: return NPY_INT32;
    case TRITONSERVER_TYPE_INT64: return NPY_INT64;
    case TRITONSERVER_TYPE_FP16: return NPY_FLOAT16;
    case TRITONSERVER_TYPE_FP32: return NPY_FLOAT32;
    case TRITONSERVER_TYPE_FP64: return NPY_FLOAT64;
    default: return -1;
  }
}

static uintptr_t dtype_size(TRITONSERVER_DataType t)
{
  switch (t) {
    case TRITONSERVER_TYPE_UINT16: case TRITONSERVER_TYPE_INT16: case TRITONSERVER_TYPE_FP16:
      return 2;
    case TRITONSERVER_TYPE_UINT32: case TRITONSERVER_TYPE_INT32: case TRITONSERVER_TYPE_FP32:
      return 4;
    case TRITONSERVER_TYPE_UINT64: case TRITONSERVER_TYPE_INT64: case TRITONSERVER_TYPE_FP64:
      return 8;
    default:
      return 1;
  }
}

/* ---- errors ------------------------------------------------------------ */

/* Raise the TritonError subclass for code with message; returns NULL. Replaces
 * any exception already set (calling into Python with one set is an error). */
static PyObject* raise_triton(int code, const char* message)
{
  PyErr_Clear();
  PyObject* exc = PyObject_CallFunction(g_make_error, "is", code, message);
  if (exc != NULL) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

/* Raise from a Triton error; deletes it when owned. */
static PyObject* raise_from(TRITONSERVER_Error* err, int owned)
{
  raise_triton(api.TRITONSERVER_ErrorCode(err), api.TRITONSERVER_ErrorMessage(err));
  if (owned) api.TRITONSERVER_ErrorDelete(err);
  return NULL;
}

static TRITONSERVER_Error* new_error(int code, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));
static TRITONSERVER_Error* new_error(int code, const char* fmt, ...)
{
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return api.TRITONSERVER_ErrorNew((TRITONSERVER_Error_Code)code, msg);
}

/* The pending Python exception as an INTERNAL Triton error (clears it). */
static TRITONSERVER_Error* error_from_python(const char* context)
{
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject* text = value ? PyObject_Str(value) : NULL;
  const char* msg = text ? PyUnicode_AsUTF8(text) : NULL;
  TRITONSERVER_Error* err =
      new_error(TRITONSERVER_ERROR_INTERNAL, "%s: %s: %s", context,
                type ? ((PyTypeObject*)type)->tp_name : "error", msg ? msg : "");
  PyErr_Clear();
  Py_XDECREF(text);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return err;
}

/* ---- response allocator (caller side) ----------------------------------
 * Each output buffer comes with a ticket (its buffer_userp). When the caller
 * turns an output into a numpy array, the array takes the buffer over
 * (ticket->taken) and frees it when the array dies: no copy out. The ticket
 * itself always belongs to Triton's release of the buffer, which may come
 * after the array is gone (responses are deleted late, see bury()). */
typedef struct {
  void* block;
  int taken;
} Ticket;

/* An output the caller asked to receive in its own writable buffer (e.g. a
 * client's shared-memory region): Triton's output buffer is that memory. */
typedef struct Preset {
  const char* name; /* the UTF-8 of a key of the caller's dict (kept alive by owner) */
  PyObject* owner;  /* the caller's outputs dict */
  PyObject* target; /* the buffer object */
  Py_buffer view;
} Preset;

struct Call;
static const Preset* call_preset(struct Call* c, const char* name);

static TRITONSERVER_Error* alloc_fn(
    TRITONSERVER_ResponseAllocator* a, const char* tensor_name,
    size_t byte_size, TRITONSERVER_MemoryType memory_type,
    int64_t memory_type_id, void* userp, void** buffer, void** buffer_userp,
    TRITONSERVER_MemoryType* actual_memory_type, int64_t* actual_memory_type_id)
{
  (void)a, (void)memory_type, (void)memory_type_id;
  const Preset* preset = userp ? call_preset((struct Call*)userp, tensor_name) : NULL;
  if (preset != NULL) { /* no ticket: the memory is the caller's */
    if ((size_t)preset->view.len < byte_size)
      return new_error(TRITONSERVER_ERROR_INVALID_ARG,
                       "output '%s' needs %zu bytes but its buffer holds %zd",
                       tensor_name, byte_size, preset->view.len);
    *buffer = preset->view.buf;
    *buffer_userp = NULL;
    *actual_memory_type = TRITONSERVER_MEMORY_CPU;
    *actual_memory_type_id = 0;
    return NULL;
  }
  Ticket* ticket = malloc(sizeof(Ticket));
  void* block = NULL;
  if (ticket == NULL || posix_memalign(&block, 64, byte_size ? byte_size : 1) != 0) {
    free(ticket);
    return new_error(TRITONSERVER_ERROR_UNAVAILABLE,
                     "out of memory allocating %zu bytes for output '%s'",
                     byte_size, tensor_name);
  }
  ticket->block = block;
  ticket->taken = 0;
  *buffer = block;
  *buffer_userp = ticket;
  *actual_memory_type = TRITONSERVER_MEMORY_CPU;
  *actual_memory_type_id = 0;
  return NULL;
}

static TRITONSERVER_Error* release_fn(
    TRITONSERVER_ResponseAllocator* a, void* buffer, void* buffer_userp,
    size_t byte_size, TRITONSERVER_MemoryType memory_type,
    int64_t memory_type_id)
{
  (void)a, (void)buffer, (void)byte_size, (void)memory_type, (void)memory_type_id;
  Ticket* ticket = (Ticket*)buffer_userp;
  if (ticket != NULL) {
    if (!ticket->taken) free(ticket->block);
    free(ticket);
  }
  return NULL;
}

static void free_block_capsule(PyObject* capsule)
{
  free(PyCapsule_GetPointer(capsule, "embedtriton.block"));
}

/* ---- calls in flight (caller side) ------------------------------------- */

typedef struct Queued {
  struct Queued* next;
  TRITONSERVER_InferenceResponse* response;
} Queued;

typedef struct Call {
  struct Call *prev, *next; /* the held list (Triton holds the request), for stop() */
  TRITONSERVER_Server* server;
  /* The caller's side, Triton's release of the request and Triton's final
   * response each hold one: a caller that was let go early (stop's deadline,
   * Ctrl-C) leaves the call to Triton's late callbacks. */
  atomic_int refs;
  atomic_int completed; /* one-shot: the caller was completed (by Triton or by stop) */
  int finalized;        /* Triton delivered the final response */
  int is_async;
  /* streams (several responses): a queue the consumer pops, under mu */
  int is_stream;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct Queued* head;
  struct Queued* tail;
  int finished;  /* the final flag arrived */
  int closed;    /* the consumer let go */
  TRITONSERVER_InferenceRequest* request; /* for cancellation, while not released */
  int aborted;  /* completed by stop(), not by Triton */
  int released; /* Triton released the request (under held_lock) */
  atomic_int done; /* sync calls: WAIT_* */
  _Atomic(TRITONSERVER_InferenceResponse*) response;
  PyObject* loop;
  PyObject* future;
  Py_ssize_t n_keep;
  PyObject** keep; /* input arrays (and BYTES buffers) Triton reads from */
  PyObject* keep_inline[8];
  Py_ssize_t n_presets;
  struct Preset* presets; /* outputs to write into the caller's buffers */
  struct TraceRecord* trace; /* when traced: Triton's timestamps for this request */
} Call;

/* Servers that accept requests. submit() holds the read lock while it hands
 * a request over, so stop() (write lock) never deletes a server under it. */
#define MAX_SERVERS 64
static pthread_rwlock_t servers_lock = PTHREAD_RWLOCK_INITIALIZER;
static TRITONSERVER_Server* servers[MAX_SERVERS];

static int server_is_open(TRITONSERVER_Server* s)
{
  for (int i = 0; i < MAX_SERVERS; i++)
    if (servers[i] == s) return 1;
  return 0;
}

/* Calls whose request Triton holds (from submit until its release), for
 * stop(): cancelling, failing and counting what a server still has. */
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static Call held = {&held, &held};

static void held_add(Call* c)
{
  pthread_mutex_lock(&held_lock);
  c->next = held.next;
  c->prev = &held;
  held.next->prev = c;
  held.next = c;
  pthread_mutex_unlock(&held_lock);
}

/* Triton let go of the request (or never took it): it leaves the list. */
static void held_release(Call* c)
{
  pthread_mutex_lock(&held_lock);
  if (c->next != NULL) {
    c->prev->next = c->next;
    c->next->prev = c->prev;
    c->next = c->prev = NULL;
  }
  c->released = 1;
  pthread_mutex_unlock(&held_lock);
}

static void mark_closed(void* request);

/* Holding held_lock: mark the request cancelled if Triton still holds it (Triton
 * only sets a flag; a released request is buried, not deleted, so the pointer is
 * still Triton's). A stream's request is also listed as closed for the iterative
 * path, where the flag does not survive a RESCHEDULE release. */
static void cancel_held_locked(Call* c)
{
  if (c->released) return;
  if (c->is_stream) mark_closed(c->request);
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceRequestCancel(c->request);
  if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
}

static void call_cancel(Call* c)
{
  pthread_mutex_lock(&held_lock);
  cancel_held_locked(c);
  pthread_mutex_unlock(&held_lock);
}

/* A call is freed when all three let go of it: the caller (after reading the
 * response and resolving its future), Triton's release of the request (when
 * Triton stops reading the input buffers) and Triton's final response. */
static void bury(TRITONSERVER_InferenceRequest* request, TRITONSERVER_InferenceResponse* response);
static int take_closed(void* request);
static void trace_deliver(struct TraceRecord* r);

/* With the GIL. */
static void call_destroy(Call* c)
{
  TRITONSERVER_InferenceResponse* late = atomic_exchange(&c->response, NULL);
  if (late != NULL) bury(NULL, late); /* arrived after its caller was let go */
  if (c->is_stream) {
    for (Queued* q = c->head; q != NULL;) {
      Queued* next = q->next;
      bury(NULL, q->response);
      free(q);
      q = next;
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
  }
  Py_CLEAR(c->loop);
  Py_CLEAR(c->future);
  if (c->keep != c->keep_inline) free(c->keep);
  for (Py_ssize_t i = 0; i < c->n_presets; i++) {
    PyBuffer_Release(&c->presets[i].view);
    Py_DECREF(c->presets[i].target);
    Py_DECREF(c->presets[i].owner);
  }
  free(c->presets);
  free(c);
}

/* Drop one reference; the last one frees the call (taking the GIL if needed). */
static void call_unref(Call* c)
{
  if (atomic_fetch_sub(&c->refs, 1) == 1) {
    int entered = gil_enter();
    call_destroy(c);
    gil_leave(entered);
  }
}

/* The caller's buffer for output `name`, or NULL. */
static const Preset* call_preset(struct Call* c, const char* name)
{
  for (Py_ssize_t i = 0; i < c->n_presets; i++)
    if (strcmp(c->presets[i].name, name) == 0) return &c->presets[i];
  return NULL;
}

/* With the GIL: drop the input references Triton was reading from. */
static void call_drop_inputs(Call* c)
{
  for (Py_ssize_t i = 0; i < c->n_keep; i++) Py_CLEAR(c->keep[i]);
  c->n_keep = 0;
}

/* With the GIL: the caller's side is done with the call. */
static void call_free(Call* c)
{
  TRITONSERVER_InferenceResponse* response = atomic_exchange(&c->response, NULL);
  if (response != NULL) bury(NULL, response); /* see bury() */
  Py_CLEAR(c->loop);
  Py_CLEAR(c->future);
  call_unref(c);
}

/* Async completions met inside one execute are handed to each event loop in
 * one call_soon_threadsafe (one wake-up of the loop per batch, not per
 * request): t_deferred maps loop -> list of calls while execute runs. */
static __thread PyObject* t_deferred = NULL;

static void hand_to_loop(PyObject* loop, PyObject* calls)
{
  PyObject* r = PyObject_CallMethodObjArgs(loop, s_call_soon_threadsafe, g_complete, calls, NULL);
  if (r == NULL) { /* the loop is closed: nobody is waiting any more */
    PyErr_WriteUnraisable(loop);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(calls); i++)
      call_free((Call*)PyCapsule_GetPointer(PyList_GET_ITEM(calls, i), "embedtriton.call"));
  }
  Py_XDECREF(r);
}

/* With the GIL: hand an async call's completion to its event loop. */
static void schedule_async(Call* c)
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

static void flush_deferred(void)
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
static __thread atomic_int** t_wake = NULL;
static __thread size_t t_wake_len = 0, t_wake_cap = 0;
static __thread int t_in_execute = 0;

static void flush_wakes(void)
{
  for (size_t i = 0; i < t_wake_len; i++) wait_signal(t_wake[i]);
  t_wake_len = 0;
}

/* Claim the call's completion (once: Triton's final response, stop() or the
 * caller giving up race for it). Returns whether this caller won. */
static int call_claim(Call* c)
{
  if (atomic_exchange(&c->completed, 1)) return 0;
  atomic_fetch_sub(&in_flight, 1);
  return 1;
}

/* The final response arrived: wake the caller or resolve its future. */
static void call_complete(Call* c)
{
  if (!call_claim(c)) return; /* stop() or the caller got there first */
  if (!c->is_async) {
    if (t_in_execute && t_wake_cap > t_wake_len)
      t_wake[t_wake_len++] = &c->done;
    else
      wait_signal(&c->done);
    return;
  }
  int entered = gil_enter();
  schedule_async(c);
  gil_leave(entered);
}

/* An asyncio stream consumer: wake its loop (loop and the wake-up callable live
 * until the call is freed). */
static void wake_stream_consumer(Call* c)
{
  int entered = gil_enter();
  PyObject* r = PyObject_CallMethodObjArgs(c->loop, s_call_soon_threadsafe, c->future, NULL);
  if (r == NULL) PyErr_Clear(); /* the loop is closed */
  Py_XDECREF(r);
  gil_leave(entered);
}

static void stream_response(Call* c, TRITONSERVER_InferenceResponse* response, uint32_t flags)
{
  Queued* q = response ? malloc(sizeof(Queued)) : NULL;
  if (q) q->next = NULL, q->response = response;
  int final = (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) != 0;
  pthread_mutex_lock(&c->mu);
  int notify = !c->closed && !c->aborted && c->loop != NULL;
  if (q && !c->closed && !c->aborted) {
    if (c->tail) c->tail->next = q; else c->head = q;
    c->tail = q;
    q = NULL;
  }
  if (final) {
    c->finalized = 1;
    if (call_claim(c)) c->finished = 1;
  }
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (q) { /* nobody reads it any more */
    bury(NULL, q->response);
    free(q);
  }
  if (notify) wake_stream_consumer(c);
  if (final) call_unref(c); /* Triton's final response */
}

static void response_cb(TRITONSERVER_InferenceResponse* response,
                        const uint32_t flags, void* userp)
{
  Call* c = (Call*)userp;
  if (c->is_stream) {
    stream_response(c, response, flags);
    return;
  }
  if (response != NULL) {
    TRITONSERVER_InferenceResponse* old =
        atomic_load(&c->completed) ? response /* its caller was let go */
                                   : atomic_exchange(&c->response, response);
    if (old != NULL) bury(NULL, old); /* (a non-decoupled request gets one response) */
  }
  if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) {
    c->finalized = 1;
    call_complete(c);
    call_unref(c); /* Triton's final response */
  }
}

/* Requests and responses hold references to their model, and the last one
 * to go lets Triton delete a model that was unloaded meanwhile. Triton 2.51's
 * model deletion reads the instance thread's bookkeeping without a lock
 * (TritonBackendThread::StopBackendThread), so it must not start while that
 * thread is still finishing the batch it just ran: it crashes there. So we
 * delete them late, never inside Triton's callbacks, and only 20-40 ms after
 * Triton let go of them: two generations, rotated every 20 ms by whichever
 * caller comes by (drain_graveyard). */
typedef struct Grave {
  struct Grave* next;
  TRITONSERVER_InferenceRequest* request;
  TRITONSERVER_InferenceResponse* response;
} Grave;
#define GRAVE_AGE_NS 20000000ull
static _Atomic(Grave*) graveyard = NULL; /* buried since the last rotation */
static Grave* graveyard_old = NULL;       /* buried in the rotation before */
static uint64_t graveyard_rotated = 0;
static pthread_mutex_t graveyard_lock = PTHREAD_MUTEX_INITIALIZER;

static void bury(TRITONSERVER_InferenceRequest* request, TRITONSERVER_InferenceResponse* response)
{
  Grave* g = malloc(sizeof(Grave));
  if (g == NULL) return; /* leak rather than crash */
  g->request = request;
  g->response = response;
  g->next = atomic_load(&graveyard);
  while (!atomic_compare_exchange_weak(&graveyard, &g->next, g)) {
  }
}

static long delete_graves(Grave* g)
{
  long n = 0;
  while (g != NULL) {
    Grave* next = g->next;
    if (g->request) api.TRITONSERVER_InferenceRequestDelete(g->request);
    if (g->response) api.TRITONSERVER_InferenceResponseDelete(g->response);
    free(g);
    g = next;
    n++;
  }
  return n;
}

/* Delete what was buried 20-40 ms ago. Returns how many are still waiting. */
static long drain_graveyard(void)
{
  if (graveyard_old == NULL && atomic_load_explicit(&graveyard, memory_order_relaxed) == NULL)
    return 0;
  uint64_t now = now_ns();
  if (now - graveyard_rotated >= GRAVE_AGE_NS && pthread_mutex_trylock(&graveyard_lock) == 0) {
    if (now - graveyard_rotated >= GRAVE_AGE_NS) {
      Grave* old = graveyard_old;
      graveyard_old = atomic_exchange(&graveyard, NULL);
      graveyard_rotated = now;
      delete_graves(old);
    }
    pthread_mutex_unlock(&graveyard_lock);
  }
  return (graveyard_old != NULL) + (atomic_load(&graveyard) != NULL);
}

static void release_cb(TRITONSERVER_InferenceRequest* request,
                       const uint32_t flags, void* userp)
{
  if (flags & RELEASE_RESCHEDULE) return; /* Triton keeps it for another iteration */
  Call* c = (Call*)userp;
  held_release(c);
  if (c->is_stream) take_closed(request); /* forget it (closed, or cancelled by stop): the pointer may be reused */
  bury(request, NULL);
  int entered = gil_enter();
  if (c->is_stream && g_request_done != NULL) {
    /* an iterative model's generator for it, if any, is done too (Triton may have
     * dropped a cancelled request without running the model again) */
    PyObject* r = PyObject_CallFunction(g_request_done, "N", PyLong_FromVoidPtr(request));
    if (r == NULL) PyErr_WriteUnraisable(g_request_done);
    Py_XDECREF(r);
  }
  if (c->trace != NULL) {
    trace_deliver(c->trace);
    c->trace = NULL;
  }
  call_drop_inputs(c);
  call_unref(c);
  gil_leave(entered);
}

static PyObject* collect_response(TRITONSERVER_InferenceResponse* resp, Call* c);

/* With the GIL: the outputs of a finished call as a dict, or NULL + error. */
static PyObject* call_collect(Call* c)
{
  if (c->aborted)
    return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE,
                        "the server stopped before this request completed");
  TRITONSERVER_InferenceResponse* response = atomic_load(&c->response);
  if (response == NULL)
    return raise_triton(TRITONSERVER_ERROR_INTERNAL,
                        "Triton completed the request without a response");
  return collect_response(response, c);
}

/* With the GIL: a response's outputs as a dict, or NULL + its error raised. */
static PyObject* collect_response(TRITONSERVER_InferenceResponse* resp, Call* c)
{
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceResponseError(resp);
  if (err != NULL) return raise_from(err, 0);
  uint32_t count = 0;
  if ((err = api.TRITONSERVER_InferenceResponseOutputCount(resp, &count)))
    return raise_from(err, 1);
  PyObject* result = PyDict_New();
  if (result == NULL) return NULL;
  for (uint32_t i = 0; i < count; i++) {
    const char* name;
    TRITONSERVER_DataType dtype;
    const int64_t* shape;
    uint64_t ndim;
    const void* base;
    size_t size;
    TRITONSERVER_MemoryType mtype;
    int64_t mtype_id;
    void* userp;
    if ((err = api.TRITONSERVER_InferenceResponseOutput(
             resp, i, &name, &dtype, &shape, &ndim, &base, &size, &mtype,
             &mtype_id, &userp))) {
      Py_DECREF(result);
      return raise_from(err, 1);
    }
    npy_intp dims[MAX_DIMS];
    for (uint64_t d = 0; d < ndim && d < MAX_DIMS; d++) dims[d] = (npy_intp)shape[d];
    PyObject* arr;
    int typenum = numpy_typenum_of(dtype);
    const Preset* preset = call_preset(c, name);
    if (preset != NULL) { /* in the caller's buffer (a cached response is copied there) */
      if ((size_t)preset->view.len < size) {
        arr = raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "an output does not fit its buffer");
      } else {
        if (base != preset->view.buf) memcpy(preset->view.buf, base, size);
        arr = dtype == TRITONSERVER_TYPE_BYTES || typenum < 0 || ndim > MAX_DIMS
                  ? raise_triton(TRITONSERVER_ERROR_UNSUPPORTED,
                                 "only numeric outputs can be written into a buffer")
                  : PyArray_New(&PyArray_Type, (int)ndim, dims, typenum, NULL,
                                preset->view.buf, 0, NPY_ARRAY_CARRAY, NULL);
        if (arr && PyArray_SetBaseObject((PyArrayObject*)arr, Py_NewRef(preset->target)) < 0)
          Py_CLEAR(arr);
      }
    } else if (dtype == TRITONSERVER_TYPE_BYTES) {
      PyObject* shape_t = PyTuple_New((Py_ssize_t)ndim);
      for (uint64_t d = 0; shape_t && d < ndim; d++)
        PyTuple_SET_ITEM(shape_t, d, PyLong_FromLongLong(shape[d]));
      PyObject* mv = PyMemoryView_FromMemory((char*)base, (Py_ssize_t)size, PyBUF_READ);
      arr = (shape_t && mv) ? PyObject_CallFunctionObjArgs(g_decode_bytes, mv, shape_t, NULL)
                            : NULL;
      Py_XDECREF(mv);
      Py_XDECREF(shape_t);
    } else if (typenum < 0 || ndim > MAX_DIMS) {
      arr = raise_triton(TRITONSERVER_ERROR_UNSUPPORTED, "output datatype has no numpy equivalent");
    } else if (userp != NULL && mtype != TRITONSERVER_MEMORY_GPU) {
      /* our allocator's block: the array takes it over */
      arr = PyArray_New(&PyArray_Type, (int)ndim, dims, typenum, NULL,
                        (void*)base, 0, NPY_ARRAY_CARRAY, NULL);
      Ticket* ticket = (Ticket*)userp;
      PyObject* owner =
          arr ? PyCapsule_New(ticket->block, "embedtriton.block", free_block_capsule) : NULL;
      if (owner != NULL && PyArray_SetBaseObject((PyArrayObject*)arr, owner) == 0) {
        ticket->taken = 1;
      } else {
        if (owner) PyCapsule_SetDestructor(owner, NULL);
        Py_XDECREF(owner);
        Py_CLEAR(arr);
      }
    } else { /* e.g. a response from the cache with foreign memory: copy */
      arr = PyArray_SimpleNew((int)ndim, dims, typenum);
      if (arr) memcpy(PyArray_DATA((PyArrayObject*)arr), base, size);
    }
    if (arr == NULL || PyDict_SetItemString(result, name, arr) < 0) {
      Py_XDECREF(arr);
      Py_DECREF(result);
      return NULL;
    }
    Py_DECREF(arr);
  }
  return result;
}

/* With the GIL, on the event loop: resolve one async call's future. */
static int complete_one(Call* c)
{
  PyObject* result = call_collect(c);
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  if (result == NULL) {
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
  }
  PyObject* fut = c->future;
  Py_INCREF(fut);
  call_free(c);
  PyObject* done = PyObject_CallMethodNoArgs(fut, s_done);
  PyObject* r = NULL;
  if (done == Py_False)
    r = PyObject_CallMethodOneArg(fut, result ? s_set_result : s_set_exception,
                                  result ? result : value);
  else if (done != NULL)
    r = Py_NewRef(Py_None);
  Py_XDECREF(done);
  Py_XDECREF(result);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  Py_DECREF(fut);
  if (r == NULL) return -1;
  Py_DECREF(r);
  return 0;
}

/* _complete(calls): runs on the event loop; resolves each call's future. */
static PyObject* py_complete(PyObject* self, PyObject* calls)
{
  (void)self;
  int failed = 0;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(calls); i++) {
    Call* c = (Call*)PyCapsule_GetPointer(PyList_GET_ITEM(calls, i), "embedtriton.call");
    if (c == NULL || complete_one(c) < 0) {
      PyErr_WriteUnraisable(calls);
      failed = 1;
    }
  }
  (void)failed;
  Py_RETURN_NONE;
}

/* Add one input to a request. Returns the object Triton reads from (new
 * reference), or NULL with an exception. */
/* ---- DLPack (our own declarations of the stable DLPack 0.x ABI) ---------- */

typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides; /* in elements; NULL: C-contiguous */
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
} DLManagedTensor;
enum { DL_CPU = 1, DL_CUDA = 2, DL_CUDA_HOST = 3 };
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_BOOL = 6 };

static TRITONSERVER_DataType dl_dtype(DLDataType t)
{
  if (t.lanes != 1) return TRITONSERVER_TYPE_INVALID;
  switch (t.code) {
    case DL_BOOL: return t.bits == 8 ? TRITONSERVER_TYPE_BOOL : TRITONSERVER_TYPE_INVALID;
    case DL_INT:
      return t.bits == 8 ? TRITONSERVER_TYPE_INT8 : t.bits == 16 ? TRITONSERVER_TYPE_INT16
           : t.bits == 32 ? TRITONSERVER_TYPE_INT32 : t.bits == 64 ? TRITONSERVER_TYPE_INT64
           : TRITONSERVER_TYPE_INVALID;
    case DL_UINT:
      return t.bits == 8 ? TRITONSERVER_TYPE_UINT8 : t.bits == 16 ? TRITONSERVER_TYPE_UINT16
           : t.bits == 32 ? TRITONSERVER_TYPE_UINT32 : t.bits == 64 ? TRITONSERVER_TYPE_UINT64
           : TRITONSERVER_TYPE_INVALID;
    case DL_FLOAT:
      return t.bits == 16 ? TRITONSERVER_TYPE_FP16 : t.bits == 32 ? TRITONSERVER_TYPE_FP32
           : t.bits == 64 ? TRITONSERVER_TYPE_FP64 : TRITONSERVER_TYPE_INVALID;
    case DL_BFLOAT: return t.bits == 16 ? TRITONSERVER_TYPE_BF16 : TRITONSERVER_TYPE_INVALID;
    default: return TRITONSERVER_TYPE_INVALID;
  }
}

/* A consumed DLPack tensor: its producer's deleter runs when the capsule goes. */
static void dl_capsule_free(PyObject* capsule)
{
  DLManagedTensor* m = PyCapsule_GetPointer(capsule, "embedtriton.dltensor");
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}

/* An input given as any object with __dlpack__ (cupy, torch, jax, numpy...): its
 * memory goes to Triton as it is, host, pinned or GPU (no copy). Returns the
 * holder that keeps it alive until Triton releases the request. */
static PyObject* add_dlpack_input(TRITONSERVER_InferenceRequest* req, const char* name,
                                  PyObject* value)
{
  PyObject* capsule = PyObject_CallMethod(value, "__dlpack__", NULL);
  if (capsule == NULL) { /* e.g. a device array not ready for export */
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject* why = v ? PyObject_Str(v) : NULL;
    char msg[512];
    snprintf(msg, sizeof msg, "input '%s' (%s): __dlpack__() failed: %s", name,
             Py_TYPE(value)->tp_name, why ? PyUnicode_AsUTF8(why) : "?");
    Py_XDECREF(why), Py_XDECREF(t), Py_XDECREF(v), Py_XDECREF(tb);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  DLManagedTensor* m = PyCapsule_GetPointer(capsule, "dltensor");
  if (m == NULL) {
    PyErr_Clear();
    Py_DECREF(capsule);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                        "__dlpack__() did not return a 'dltensor' capsule");
  }
  /* consumed: the producer must not delete it; we call its deleter later */
  PyCapsule_SetName(capsule, "used_dltensor");
  PyCapsule_SetDestructor(capsule, NULL);
  Py_DECREF(capsule);
  PyObject* holder = PyCapsule_New(m, "embedtriton.dltensor", dl_capsule_free);
  if (holder == NULL) {
    if (m->deleter) m->deleter(m);
    return NULL;
  }
  DLTensor* t = &m->dl_tensor;
  char msg[256];
  TRITONSERVER_DataType dtype = dl_dtype(t->dtype);
  TRITONSERVER_MemoryType mtype;
  int64_t mtype_id = 0;
  if (t->device.device_type == DL_CPU) {
    mtype = TRITONSERVER_MEMORY_CPU;
  } else if (t->device.device_type == DL_CUDA_HOST) {
    mtype = TRITONSERVER_MEMORY_CPU_PINNED;
  } else if (t->device.device_type == DL_CUDA) {
    mtype = TRITONSERVER_MEMORY_GPU;
    mtype_id = t->device.device_id;
  } else {
    snprintf(msg, sizeof msg, "input '%s': DLPack device type %d is not supported (CPU, CUDA "
             "and CUDA host memory are)", name, t->device.device_type);
    Py_DECREF(holder);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  if (dtype == TRITONSERVER_TYPE_INVALID || t->ndim > MAX_DIMS || t->ndim < 0) {
    snprintf(msg, sizeof msg, "input '%s': DLPack dtype (code %u, %u bits, %u lanes) or %d "
             "dimensions cannot be carried", name, t->dtype.code, t->dtype.bits,
             t->dtype.lanes, t->ndim);
    Py_DECREF(holder);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  uint64_t count = 1;
  int64_t expected = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->strides != NULL && t->shape[d] > 1 && t->strides[d] != expected) {
      snprintf(msg, sizeof msg, "input '%s' is not C-contiguous; make it contiguous first "
               "(e.g. .contiguous() / ascontiguousarray)", name);
      Py_DECREF(holder);
      return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
    }
    expected *= t->shape[d];
    count *= (uint64_t)t->shape[d];
  }
  size_t nbytes = (size_t)count * (size_t)(t->dtype.bits / 8);
  const char* data = (const char*)t->data + t->byte_offset;
  TRITONSERVER_Error* err =
      api.TRITONSERVER_InferenceRequestAddInput(req, name, dtype, t->shape, (uint64_t)t->ndim);
  if (err == NULL)
    err = api.TRITONSERVER_InferenceRequestAppendInputData(req, name, data, nbytes, mtype,
                                                           mtype_id);
  if (err != NULL) {
    Py_DECREF(holder);
    return raise_from(err, 1);
  }
  return holder;
}

static PyObject* add_input(TRITONSERVER_InferenceRequest* req, PyObject* key,
                           PyObject* value)
{
  const char* name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
  if (name == NULL) {
    PyErr_Clear();
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                        "input names must be strings");
  }
  PyArrayObject* arr;
  if (PyArray_Check(value) && PyArray_ISCARRAY_RO((PyArrayObject*)value) &&
      PyArray_ISNOTSWAPPED((PyArrayObject*)value)) {
    arr = (PyArrayObject*)Py_NewRef(value);
  } else if (!PyArray_Check(value) && PyObject_HasAttrString(value, "__dlpack__")) {
    return add_dlpack_input(req, name, value);
  } else {
    arr = (PyArrayObject*)PyArray_FromAny(
        value, NULL, 0, 0, NPY_ARRAY_CARRAY_RO | NPY_ARRAY_NOTSWAPPED, NULL);
    if (arr == NULL) { /* e.g. a ragged list */
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      PyObject* why = v ? PyObject_Str(v) : NULL;
      const char* because = why ? PyUnicode_AsUTF8(why) : NULL;
      char msg[640];
      snprintf(msg, sizeof msg, "cannot turn input '%s' (%s) into an array: %s", name,
               Py_TYPE(value)->tp_name, because ? because : "?");
      Py_XDECREF(why), Py_XDECREF(t), Py_XDECREF(v), Py_XDECREF(tb);
      return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
    }
  }
  TRITONSERVER_DataType dtype = triton_dtype_of(arr);
  if (dtype == TRITONSERVER_TYPE_INVALID) {
    PyObject* d = PyObject_Str((PyObject*)PyArray_DESCR(arr));
    char msg[512];
    snprintf(msg, sizeof msg, "input '%s' has dtype %s, which Triton cannot carry",
             name, d ? PyUnicode_AsUTF8(d) : "?");
    Py_XDECREF(d);
    Py_DECREF(arr);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  int ndim = PyArray_NDIM(arr);
  if (ndim > MAX_DIMS) {
    char msg[256];
    snprintf(msg, sizeof msg, "input '%s' has %d dimensions; at most %d are supported", name, ndim,
             MAX_DIMS);
    Py_DECREF(arr);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  int64_t shape[MAX_DIMS];
  for (int d = 0; d < ndim; d++) shape[d] = PyArray_DIM(arr, d);
  PyObject* holder = (PyObject*)arr;
  const void* data = PyArray_DATA(arr);
  Py_ssize_t nbytes = PyArray_NBYTES(arr);
  if (dtype == TRITONSERVER_TYPE_BYTES) {
    holder = PyObject_CallOneArg(g_encode_bytes, (PyObject*)arr);
    Py_DECREF(arr);
    if (holder == NULL) return NULL;
    data = PyBytes_AS_STRING(holder);
    nbytes = PyBytes_GET_SIZE(holder);
  }
  TRITONSERVER_Error* err =
      api.TRITONSERVER_InferenceRequestAddInput(req, name, dtype, shape, (uint64_t)ndim);
  if (err == NULL)
    err = api.TRITONSERVER_InferenceRequestAppendInputData(
        req, name, data, (size_t)nbytes, TRITONSERVER_MEMORY_CPU, 0);
  if (err != NULL) {
    Py_DECREF(holder);
    return raise_from(err, 1);
  }
  return holder;
}

static TRITONSERVER_Error* set_parameter(TRITONSERVER_InferenceRequest* req,
                                         PyObject* key, PyObject* value)
{
  const char* k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
  if (k == NULL) {
    PyErr_Clear();
    return new_error(TRITONSERVER_ERROR_INVALID_ARG, "parameter names must be strings");
  }
  if (PyBool_Check(value))
    return api.TRITONSERVER_InferenceRequestSetBoolParameter(req, k, value == Py_True);
  if (PyLong_Check(value)) {
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return new_error(TRITONSERVER_ERROR_INVALID_ARG,
                       "parameter '%s' does not fit in a signed 64-bit integer", k);
    }
    return api.TRITONSERVER_InferenceRequestSetIntParameter(req, k, v);
  }
  if (PyFloat_Check(value))
    return api.TRITONSERVER_InferenceRequestSetDoubleParameter(req, k, PyFloat_AS_DOUBLE(value));
  if (PyUnicode_Check(value)) {
    const char* s = PyUnicode_AsUTF8(value);
    if (s == NULL) {
      PyErr_Clear();
      return new_error(TRITONSERVER_ERROR_INVALID_ARG, "parameter '%s' is not valid text", k);
    }
    return api.TRITONSERVER_InferenceRequestSetStringParameter(req, k, s);
  }
  return new_error(TRITONSERVER_ERROR_INVALID_ARG,
                   "parameter '%s' is a %s; parameters must be str, int, float or bool",
                   k, Py_TYPE(value)->tp_name);
}

static PyObject* submit_locked(TRITONSERVER_Server* server, const char* model, long long version,
                               PyObject* inputs, PyObject* outputs, PyObject* request_id,
                               unsigned long long priority, unsigned long long timeout_us,
                               PyObject* parameters, PyObject* loop, PyObject* future,
                               int stream, PyObject* sequence, int release_gil,
                               PyObject* trace_sink, int cancellable);

/* ---- traces: Triton's timestamps for one request, handed to Python ------- */

typedef struct TraceRecord {
  atomic_int refs; /* the call's and the trace's */
  PyObject* sink;  /* called once with (trace id, timestamps tuple) */
  uint64_t id;
  uint64_t ts[TRITONSERVER_TRACE_ACTIVITIES];
} TraceRecord;

static void trace_activity(TRITONSERVER_InferenceTrace* trace, int activity,
                           uint64_t timestamp_ns, void* userp)
{
  (void)trace;
  TraceRecord* r = (TraceRecord*)userp;
  if (activity >= 0 && activity < TRITONSERVER_TRACE_ACTIVITIES) r->ts[activity] = timestamp_ns;
}

/* With the GIL: hand the timestamps to the sink (once), drop one reference. */
static void trace_deliver(TraceRecord* r)
{
  if (r->sink != NULL) {
    PyObject* stamps = PyTuple_New(TRITONSERVER_TRACE_ACTIVITIES);
    for (int i = 0; stamps && i < TRITONSERVER_TRACE_ACTIVITIES; i++)
      PyTuple_SET_ITEM(stamps, i, PyLong_FromUnsignedLongLong(r->ts[i]));
    PyObject* res = stamps ? PyObject_CallFunction(r->sink, "KN", (unsigned long long)r->id, stamps)
                           : NULL;
    if (res == NULL) PyErr_WriteUnraisable(r->sink);
    Py_XDECREF(res);
    Py_CLEAR(r->sink);
  }
  if (atomic_fetch_sub(&r->refs, 1) == 1) free(r);
}

/* Triton lets go of the trace when it deletes the request, which we do late
 * (see bury()); the timestamps are delivered earlier, when the request is
 * released (release_cb), and REQUEST_END is recorded by then. */
static void trace_release(TRITONSERVER_InferenceTrace* trace, void* userp)
{
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceTraceDelete(trace);
  if (err) api.TRITONSERVER_ErrorDelete(err);
  int entered = gil_enter();
  trace_deliver((TraceRecord*)userp);
  gil_leave(entered);
}

/* With the GIL: a trace whose timestamps go to sink, or NULL with an error. */
static TRITONSERVER_InferenceTrace* trace_new(PyObject* sink, TraceRecord** record)
{
  TraceRecord* r = calloc(1, sizeof(TraceRecord));
  if (r == NULL) return (TRITONSERVER_InferenceTrace*)PyErr_NoMemory();
  atomic_init(&r->refs, 1);
  TRITONSERVER_InferenceTrace* trace = NULL;
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceTraceNew(
      &trace, TRITONSERVER_TRACE_LEVEL_TIMESTAMPS, 0, trace_activity, trace_release, r);
  if (err != NULL) {
    free(r);
    raise_from(err, 1);
    return NULL;
  }
  atomic_fetch_add(&r->refs, 1); /* the call's */
  *record = r;
  err = api.TRITONSERVER_InferenceTraceId(trace, &r->id);
  if (err) api.TRITONSERVER_ErrorDelete(err);
  r->sink = Py_NewRef(sink);
  return trace;
}

/* dict(obj) for a mapping (new reference), or NULL with an InvalidArgumentError. */
static PyObject* as_dict(PyObject* obj, const char* message)
{
  PyObject* d = PyMapping_Check(obj) && !PySequence_Check(obj)
                    ? PyObject_CallOneArg((PyObject*)&PyDict_Type, obj)
                    : NULL;
  if (d == NULL) {
    PyErr_Clear();
    raise_triton(TRITONSERVER_ERROR_INVALID_ARG, message);
  }
  return d;
}

/* The handle of a cancellable asynchronous call holds a reference to it. */
static void request_handle_free(PyObject* capsule)
{
  Call* c = (Call*)PyCapsule_GetPointer(capsule, "embedtriton.request");
  if (c != NULL) call_unref(c);
}

/* cancel(handle): the client went away; Triton drops the request if it has not
 * run it yet (the caller still gets its completion, CANCELLED or the result). */
static PyObject* py_cancel(PyObject* self, PyObject* capsule)
{
  (void)self;
  Call* c = (Call*)PyCapsule_GetPointer(capsule, "embedtriton.request");
  if (c == NULL) return NULL;
  call_cancel(c);
  Py_RETURN_NONE;
}

/* submit(server, model, version, inputs, outputs, request_id, priority,
 *        timeout_us, parameters, loop, future[, stream, sequence, release_gil,
 *        trace_sink, cancellable])
 * Without a loop: blocks (GIL released) and returns the outputs dict.
 * With a loop: returns None (a handle for cancel() when cancellable); the
 * future is resolved on the loop. */
static PyObject* py_submit(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs < 11 || nargs > 16) {
    PyErr_SetString(PyExc_TypeError, "submit() takes 11 to 16 arguments");
    return NULL;
  }
  PyObject* trace_sink = nargs >= 15 ? args[14] : Py_None;
  int cancellable = nargs >= 16 && PyObject_IsTrue(args[15]) == 1;
  int release_gil = nargs >= 14 && PyObject_IsTrue(args[13]) == 1;
  int stream = nargs >= 12 && PyObject_IsTrue(args[11]) == 1;
  PyObject* sequence = nargs >= 13 ? args[12] : Py_None; /* (correlation id, flags) */
  if (!api_loaded || args[0] == Py_None)
    return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE,
                        "the server is not running; call start() or use 'with server:'");
  TRITONSERVER_Server* server = (TRITONSERVER_Server*)PyLong_AsVoidPtr(args[0]);
  const char* model = PyUnicode_AsUTF8(args[1]);
  long long version = PyLong_AsLongLong(args[2]);
  PyObject* request_id = args[5];
  unsigned long long priority = args[6] == Py_None ? 0 : PyLong_AsUnsignedLongLong(args[6]);
  unsigned long long timeout_us = args[7] == Py_None ? 0 : PyLong_AsUnsignedLongLong(args[7]);
  PyObject* loop = args[9];
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                        "priority and timeout_us must be non-negative integers");
  }
  if (request_id != Py_None && !PyUnicode_Check(request_id))
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "request_id must be a string");
  /* The common case costs nothing; other mappings and sequences are converted. */
  PyObject* inputs = Py_NewRef(args[3]);
  PyObject* outputs = args[4] == Py_None || PyTuple_Check(args[4]) || PyDict_Check(args[4])
                          ? Py_NewRef(args[4]) : NULL;
  PyObject* parameters = args[8] == Py_None ? Py_NewRef(Py_None) : NULL;
  int ok = 1;
  if (!PyDict_Check(inputs)) {
    Py_SETREF(inputs, as_dict(inputs, "inputs must be a mapping of input name -> array"));
    ok = inputs != NULL;
  }
  if (ok && outputs == NULL) {
    outputs = PySequence_Tuple(args[4]);
    if (outputs == NULL) {
      PyErr_Clear();
      raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "outputs must be a sequence of output names");
    }
    ok = outputs != NULL;
  }
  if (ok && parameters == NULL) {
    parameters = PyDict_Check(args[8]) ? Py_NewRef(args[8])
                                       : as_dict(args[8], "parameters must be a mapping of name -> value");
    ok = parameters != NULL;
  }
  PyObject* result = NULL;
  if (ok) {
    pthread_rwlock_rdlock(&servers_lock);
    drain_graveyard(); /* servers cannot be deleted while we hold the lock */
    if (!server_is_open(server)) {
      pthread_rwlock_unlock(&servers_lock);
      raise_triton(TRITONSERVER_ERROR_UNAVAILABLE,
                   "the server is not running; call start() or use 'with server:'");
    } else {
      result = submit_locked(server, model, version, inputs, outputs, request_id, priority,
                             timeout_us, parameters, loop, args[10], stream, sequence,
                             release_gil, trace_sink, cancellable);
    }
  }
  Py_XDECREF(inputs);
  Py_XDECREF(outputs);
  Py_XDECREF(parameters);
  return result;
}

static PyObject* submit_locked(TRITONSERVER_Server* server, const char* model, long long version,
                               PyObject* inputs, PyObject* outputs, PyObject* request_id,
                               unsigned long long priority, unsigned long long timeout_us,
                               PyObject* parameters, PyObject* loop, PyObject* future,
                               int stream, PyObject* sequence, int release_gil,
                               PyObject* trace_sink, int cancellable)
{
  TRITONSERVER_InferenceRequest* req = NULL;
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceRequestNew(&req, server, model, version);
  if (err != NULL) {
    pthread_rwlock_unlock(&servers_lock);
    return raise_from(err, 1);
  }

  Call* c = calloc(1, sizeof(Call));
  if (c == NULL) {
    pthread_rwlock_unlock(&servers_lock);
    api.TRITONSERVER_InferenceRequestDelete(req);
    return PyErr_NoMemory();
  }
  c->server = server;
  Py_ssize_t n_inputs = PyDict_GET_SIZE(inputs);
  c->keep = n_inputs <= 8 ? c->keep_inline : calloc((size_t)n_inputs, sizeof(PyObject*));
  atomic_init(&c->refs, 1); /* the caller's; Triton's is added when it takes the request */
  c->is_stream = stream;
  c->is_async = !stream && loop != Py_None;
  c->request = req;
  if (stream) {
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
  }

  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (c->keep != NULL && PyDict_Next(inputs, &pos, &key, &value)) {
    PyObject* holder = add_input(req, key, value);
    if (holder == NULL) goto fail;
    c->keep[c->n_keep++] = holder;
  }
  if (c->keep == NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  if (outputs != Py_None && PyDict_Check(outputs)) { /* name -> writable buffer or None */
    c->presets = calloc((size_t)PyDict_GET_SIZE(outputs) + 1, sizeof(Preset));
    if (c->presets == NULL) {
      PyErr_NoMemory();
      goto fail;
    }
    pos = 0;
    while (PyDict_Next(outputs, &pos, &key, &value)) {
      const char* name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
      if (name == NULL) {
        PyErr_Clear();
        raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "output names must be strings");
        goto fail;
      }
      if ((err = api.TRITONSERVER_InferenceRequestAddRequestedOutput(req, name))) goto fail_err;
      if (value == Py_None) continue;
      Preset* p = &c->presets[c->n_presets];
      if (PyObject_GetBuffer(value, &p->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                     "an output buffer must be a writable, contiguous buffer");
        goto fail;
      }
      p->name = name;
      p->owner = Py_NewRef(outputs);
      p->target = Py_NewRef(value);
      c->n_presets++;
    }
  } else if (outputs != Py_None) {
    Py_ssize_t n = PyTuple_GET_SIZE(outputs);
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject* item = PyTuple_GET_ITEM(outputs, i);
      const char* name = PyUnicode_Check(item) ? PyUnicode_AsUTF8(item) : NULL;
      if (name == NULL) {
        raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "outputs must be a sequence of output names (str)");
        goto fail;
      }
      if ((err = api.TRITONSERVER_InferenceRequestAddRequestedOutput(req, name))) goto fail_err;
    }
  }
  if (request_id != Py_None) {
    const char* id = PyUnicode_AsUTF8(request_id);
    if (id == NULL) goto fail;
    if ((err = api.TRITONSERVER_InferenceRequestSetId(req, id))) goto fail_err;
  }
  if (sequence != Py_None) {
    PyObject* id = PyTuple_Check(sequence) && PyTuple_GET_SIZE(sequence) == 2
                       ? PyTuple_GET_ITEM(sequence, 0) : NULL;
    unsigned long flags = id ? PyLong_AsUnsignedLong(PyTuple_GET_ITEM(sequence, 1)) : 0;
    if (id == NULL || PyErr_Occurred()) {
      PyErr_Clear();
      raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "bad sequence arguments");
      goto fail;
    }
    if (PyUnicode_Check(id)) {
      const char* text = PyUnicode_AsUTF8(id);
      if (text == NULL) goto fail;
      err = api.TRITONSERVER_InferenceRequestSetCorrelationIdString(req, text);
    } else {
      unsigned long long number = PyLong_AsUnsignedLongLong(id);
      if (PyErr_Occurred() || number == 0) {
        PyErr_Clear();
        raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                     "correlation_id must be a positive int or a non-empty str");
        goto fail;
      }
      err = api.TRITONSERVER_InferenceRequestSetCorrelationId(req, number);
    }
    if (err == NULL && flags) err = api.TRITONSERVER_InferenceRequestSetFlags(req, (uint32_t)flags);
    if (err != NULL) goto fail_err;
  }
  if (priority && (err = api.TRITONSERVER_InferenceRequestSetPriorityUInt64(req, priority)))
    goto fail_err;
  if (timeout_us &&
      (err = api.TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(req, timeout_us)))
    goto fail_err;
  if (parameters != Py_None) {
    pos = 0;
    while (PyDict_Next(parameters, &pos, &key, &value))
      if ((err = set_parameter(req, key, value))) goto fail_err;
  }
  if ((err = api.TRITONSERVER_InferenceRequestSetReleaseCallback(req, release_cb, c)) ||
      (err = api.TRITONSERVER_InferenceRequestSetResponseCallback(
           req, allocator, c->n_presets ? c : NULL, response_cb, c)))
    goto fail_err;

  atomic_fetch_add(&c->refs, 2); /* Triton's: dropped at its release and at its final response */
  if (c->is_async || (stream && loop != Py_None)) {
    c->loop = Py_NewRef(loop);
    c->future = Py_NewRef(future); /* a stream's: the callable that wakes its consumer */
  } else {
    atomic_init(&c->done, WAIT_PENDING);
  }
  TRITONSERVER_InferenceTrace* trace = NULL;
  if (trace_sink != Py_None && (trace = trace_new(trace_sink, &c->trace)) == NULL) {
    atomic_fetch_sub(&c->refs, 2);
    Py_CLEAR(c->loop);
    Py_CLEAR(c->future);
    goto fail;
  }
  held_add(c);
  atomic_fetch_add(&in_flight, 1);
  /* The GIL stays held: handing over a request does not block, and releasing
   * the GIL here would let the model thread in and make this caller queue
   * for it again (a convoy under load). Callbacks that Triton runs inline
   * (errors, cache hits) find the GIL already held. */
  if (release_gil) { /* a model with a batch rule: see TRITONBACKEND_ModelBatchIncludeRequest */
    Py_BEGIN_ALLOW_THREADS
    err = api.TRITONSERVER_ServerInferAsync(server, req, trace);
    Py_END_ALLOW_THREADS
  } else {
    err = api.TRITONSERVER_ServerInferAsync(server, req, trace);
  }
  pthread_rwlock_unlock(&servers_lock);
  if (err != NULL) { /* Triton did not take the request: no callbacks */
    if (c->trace != NULL) { /* the sink sees no times; Triton drops its side with the request */
      trace_deliver(c->trace);
      c->trace = NULL;
    }
    held_release(c);
    call_claim(c);
    api.TRITONSERVER_InferenceRequestDelete(req);
    raise_from(err, 1);
    call_drop_inputs(c);
    atomic_fetch_sub(&c->refs, 2); /* Triton's: never taken (the caller's remains) */
    call_free(c);
    return NULL;
  }
  if (c->is_async) {
    if (!cancellable) Py_RETURN_NONE;
    atomic_fetch_add(&c->refs, 1); /* the handle's */
    PyObject* handle = PyCapsule_New(c, "embedtriton.request", request_handle_free);
    if (handle == NULL) call_unref(c);
    return handle;
  }
  if (stream) return PyCapsule_New(c, "embedtriton.stream", NULL);

  if (wait_interruptible(&c->done) < 0) { /* Ctrl-C: cancel the request and leave */
    if (call_claim(c)) {
      call_cancel(c);
    } else { /* it completed meanwhile: its wake-up may still be on its way */
      Py_BEGIN_ALLOW_THREADS
      wait_for(&c->done, 0, 0);
      Py_END_ALLOW_THREADS
    }
    call_free(c);
    return NULL;
  }
  PyObject* result = call_collect(c);
  call_free(c);
  return result;

fail_err:
  raise_from(err, 1);
fail:
  pthread_rwlock_unlock(&servers_lock);
  api.TRITONSERVER_InferenceRequestDelete(req);
  call_drop_inputs(c);
  call_free(c);
  return NULL;
}

/* stream_next(stream, block) -> (0, outputs) | (1, None) when nothing is
 * there yet (block=False) | (2, None) at the end. An error response raises. */
static PyObject* py_stream_next(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "stream_next() takes 2 arguments");
    return NULL;
  }
  Call* c = (Call*)PyCapsule_GetPointer(args[0], "embedtriton.stream");
  if (c == NULL) return NULL;
  int block = PyObject_IsTrue(args[1]) == 1;
  Queued* q = NULL;
  int finished = 0;
  int main = block && on_main_thread();
  PyThreadState* saved = block ? PyEval_SaveThread() : NULL; /* never wait for the GIL holding mu */
  pthread_mutex_lock(&c->mu);
  while (block && c->head == NULL && !c->finished) {
    if (!main) {
      pthread_cond_wait(&c->cv, &c->mu);
      continue;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += (long)SIGNAL_CHECK_NS;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT) { /* run signal handlers */
      pthread_mutex_unlock(&c->mu);
      PyEval_RestoreThread(saved);
      if (PyErr_CheckSignals() < 0) return NULL; /* Ctrl-C: the iterator closes the stream */
      saved = PyEval_SaveThread();
      pthread_mutex_lock(&c->mu);
    }
  }
  q = c->head;
  if (q != NULL) {
    c->head = q->next;
    if (c->head == NULL) c->tail = NULL;
  }
  finished = c->finished;
  pthread_mutex_unlock(&c->mu);
  if (saved) PyEval_RestoreThread(saved);
  if (q == NULL) {
    if (finished && c->aborted)
      return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE,
                          "the server stopped before this stream completed");
    return Py_BuildValue("(iO)", finished ? 2 : 1, Py_None);
  }
  PyObject* outputs = collect_response(q->response, c);
  bury(NULL, q->response);
  free(q);
  if (outputs == NULL) return NULL;
  PyObject* r = Py_BuildValue("(iN)", 0, outputs);
  return r;
}

/* Streams whose consumer left while Triton still held the request. Triton's
 * cancellation flag does not reliably survive a RESCHEDULE release, so the
 * iterative path also checks this list (keyed by the request pointer). */
static pthread_mutex_t closed_lock = PTHREAD_MUTEX_INITIALIZER;
static void** closed_requests = NULL;
static size_t closed_len = 0, closed_cap = 0;

static void mark_closed(void* request)
{
  pthread_mutex_lock(&closed_lock);
  if (closed_len == closed_cap) {
    size_t cap = closed_cap ? 2 * closed_cap : 16;
    void** grown = realloc(closed_requests, cap * sizeof(void*));
    if (grown) closed_requests = grown, closed_cap = cap;
  }
  if (closed_len < closed_cap) closed_requests[closed_len++] = request;
  pthread_mutex_unlock(&closed_lock);
}

static int take_closed(void* request)
{
  int found = 0;
  pthread_mutex_lock(&closed_lock);
  for (size_t i = 0; i < closed_len; i++)
    if (closed_requests[i] == request) {
      closed_requests[i] = closed_requests[--closed_len];
      found = 1;
      break;
    }
  pthread_mutex_unlock(&closed_lock);
  return found;
}

/* stream_close(stream): the consumer is done; cancels the request if Triton
 * is still working on it. */
static PyObject* py_stream_close(PyObject* self, PyObject* capsule)
{
  (void)self;
  Call* c = (Call*)PyCapsule_GetPointer(capsule, "embedtriton.stream");
  if (c == NULL) return NULL;
  if (PyCapsule_SetName(capsule, "embedtriton.closed-stream") < 0) return NULL;
  pthread_mutex_lock(&c->mu);
  c->closed = 1;
  int cancel = !c->finished;
  pthread_mutex_unlock(&c->mu);
  if (cancel) call_cancel(c);
  call_unref(c);
  Py_RETURN_NONE;
}

/* With the GIL: complete a call that Triton did not complete (claimed by the
 * caller of this): its caller gets an UnavailableError. */
static void call_abort(Call* c)
{
  c->aborted = 1;
  if (c->is_stream) {
    pthread_mutex_lock(&c->mu);
    c->finished = 1;
    pthread_cond_signal(&c->cv);
    int notify = !c->closed && c->loop != NULL;
    pthread_mutex_unlock(&c->mu);
    if (notify) wake_stream_consumer(c);
  } else if (c->is_async) {
    schedule_async(c);
  } else {
    wait_signal(&c->done);
  }
}

static TRITONSERVER_Server* server_arg(PyObject* arg)
{
  return (TRITONSERVER_Server*)PyLong_AsVoidPtr(arg);
}

/* pending(server) -> (calls not completed, requests Triton still holds). */
static PyObject* py_pending(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  long waiting = 0, holding = 0;
  pthread_mutex_lock(&held_lock);
  for (Call* c = held.next; c != &held; c = c->next)
    if (c->server == server) {
      holding++;
      waiting += !atomic_load(&c->completed);
    }
  pthread_mutex_unlock(&held_lock);
  return Py_BuildValue("(ll)", waiting, holding);
}

/* cancel_all(server): mark every request Triton holds for the server
 * cancelled (queued ones are dropped by Triton's scheduler; a running
 * decoupled model stops at its next step). Returns the count. */
static PyObject* py_cancel_all(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  long n = 0;
  pthread_mutex_lock(&held_lock);
  for (Call* c = held.next; c != &held; c = c->next)
    if (c->server == server) {
      cancel_held_locked(c);
      n++;
    }
  pthread_mutex_unlock(&held_lock);
  return PyLong_FromLong(n);
}

/* Claim (under held_lock) up to cap calls of server that are not completed. */
static size_t claim_waiting(TRITONSERVER_Server* server, Call** out, size_t cap)
{
  size_t n = 0;
  pthread_mutex_lock(&held_lock);
  for (Call* c = held.next; c != &held && n < cap; c = c->next)
    if (c->server == server && call_claim(c)) out[n++] = c;
  pthread_mutex_unlock(&held_lock);
  return n;
}

/* fail_pending(server): stop()'s deadline passed: every call of the server
 * that Triton has not completed fails now (UnavailableError); what Triton
 * still runs finishes on its own and its late responses are dropped. A
 * claimed call stays alive: its caller's reference is only dropped once it
 * has been told. Returns the count. */
static PyObject* py_fail_pending(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  long n = 0;
  Call* batch[256];
  size_t got;
  while ((got = claim_waiting(server, batch, 256)) > 0) {
    for (size_t i = 0; i < got; i++) call_abort(batch[i]);
    n += (long)got;
  }
  return PyLong_FromLong(n);
}

/* abort_pending(server): after the server is deleted, no callback will come:
 * fail what is left and drop Triton's references. Returns the count. */
static PyObject* py_abort_pending(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  long n = 0;
  for (;;) {
    Call* found = NULL;
    pthread_mutex_lock(&held_lock);
    for (Call* c = held.next; c != &held; c = c->next)
      if (c->server == server) {
        found = c;
        break;
      }
    pthread_mutex_unlock(&held_lock);
    if (found == NULL) break;
    n++;
    held_release(found);
    atomic_fetch_add(&found->refs, 1); /* keep it while we tell its caller */
    if (call_claim(found)) call_abort(found);
    call_drop_inputs(found);
    if (!found->finalized) {
      found->finalized = 1;
      call_unref(found); /* Triton's final response */
    }
    call_unref(found); /* Triton's release */
    call_unref(found);
  }
  return PyLong_FromLong(n);
}

/* ---- backend (model side) ---------------------------------------------- */

typedef struct {
  char* name;
  PyObject* name_obj;
  TRITONSERVER_DataType dtype;
  int ndims;
  int64_t dims[MAX_DIMS];
} OutputSpec;

typedef struct {
  PyObject* binding;
  PyObject* execute;
  char* name;
  int64_t max_batch_size;
  int decoupled;
  int sequence; /* sequence batcher: control inputs become Request attributes */
  PyObject* include; /* custom batching: binding._include(batch, candidate), or NULL */
  PyObject* iterate; /* iterative sequences: binding._iterate(step), or NULL */
  Py_ssize_t n_outputs;
  OutputSpec* outputs;
} ModelState;

static void model_state_free(ModelState* ms)
{
  for (Py_ssize_t i = 0; ms->outputs && i < ms->n_outputs; i++) {
    free(ms->outputs[i].name);
    Py_XDECREF(ms->outputs[i].name_obj);
  }
  free(ms->outputs);
  free(ms->name);
  Py_XDECREF(ms->execute);
  Py_XDECREF(ms->include);
  Py_XDECREF(ms->iterate);
  Py_XDECREF(ms->binding);
  free(ms);
}

/* With the GIL: read the binding's output specs into the model state. */
static int read_output_specs(ModelState* ms)
{
  PyObject* specs = PyObject_GetAttr(ms->binding, s_output_specs);
  PyObject* seq = specs ? PySequence_Fast(specs, "output_specs must be a sequence") : NULL;
  Py_XDECREF(specs);
  if (seq == NULL) return -1;
  ms->n_outputs = PySequence_Fast_GET_SIZE(seq);
  ms->outputs = calloc((size_t)ms->n_outputs + 1, sizeof(OutputSpec));
  for (Py_ssize_t i = 0; i < ms->n_outputs; i++) {
    OutputSpec* o = &ms->outputs[i];
    PyObject* name;
    PyObject* dims;
    int dtype;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UiO", &name, &dtype, &dims))
      goto fail;
    o->name = strdup(PyUnicode_AsUTF8(name));
    o->name_obj = Py_NewRef(name);
    o->dtype = (TRITONSERVER_DataType)dtype;
    o->ndims = (int)PyTuple_Size(dims);
    if (o->ndims < 0 || o->ndims + (ms->max_batch_size > 0) > MAX_DIMS) {
      PyErr_Format(PyExc_ValueError, "output '%U' has too many dimensions (at most %d)", name, MAX_DIMS);
      goto fail;
    }
    for (int d = 0; d < o->ndims; d++) o->dims[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(dims, d));
  }
  Py_DECREF(seq);
  return PyErr_Occurred() ? -1 : 0;
fail:
  Py_DECREF(seq);
  return -1;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model)
{
  const char* location = NULL;
  int artifact_type = 0;
  TRITONSERVER_Error* err = api.TRITONBACKEND_ModelRepository(model, &artifact_type, &location);
  if (err != NULL) return err;
  int entered = gil_enter();
  PyObject* binding = g_bindings ? PyDict_GetItemString(g_bindings, location) : NULL;
  if (binding == NULL) {
    gil_leave(entered);
    return new_error(TRITONSERVER_ERROR_NOT_FOUND,
                     "no Python callable is bound for the model at '%s'", location);
  }
  ModelState* ms = calloc(1, sizeof(ModelState));
  ms->binding = Py_NewRef(binding);
  ms->execute = PyObject_GetAttr(binding, s_execute);
  PyObject* mbs = PyObject_GetAttr(binding, s_max_batch_size);
  PyObject* name = PyObject_GetAttr(binding, s_name);
  ms->max_batch_size = mbs ? PyLong_AsLongLong(mbs) : 0;
  PyObject* decoupled = PyObject_GetAttrString(binding, "decoupled");
  ms->decoupled = decoupled != NULL && PyObject_IsTrue(decoupled) == 1;
  Py_XDECREF(decoupled);
  PyObject* iterative = PyObject_GetAttrString(binding, "iterative");
  if (iterative != NULL && PyObject_IsTrue(iterative) == 1)
    ms->iterate = PyObject_GetAttrString(binding, "_iterate");
  Py_XDECREF(iterative);
  PyErr_Clear();
  PyObject* rule = PyObject_GetAttrString(binding, "batch_rule");
  if (rule != NULL && rule != Py_None) ms->include = PyObject_GetAttrString(binding, "_include");
  Py_XDECREF(rule);
  PyErr_Clear();
  PyObject* sequence = PyObject_GetAttrString(binding, "sequence");
  ms->sequence = sequence != NULL && PyObject_IsTrue(sequence) == 1;
  Py_XDECREF(sequence);
  ms->name = strdup(name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : "?");
  Py_XDECREF(mbs);
  Py_XDECREF(name);
  if (ms->execute == NULL || PyErr_Occurred() || read_output_specs(ms) < 0) {
    err = error_from_python("cannot read the model binding");
    model_state_free(ms);
    gil_leave(entered);
    return err;
  }
  PyObject* r = PyObject_CallMethod(binding, "_loaded", "i", 1); /* see Binding._loaded */
  if (r == NULL) PyErr_WriteUnraisable(binding);
  Py_XDECREF(r);
  gil_leave(entered);
  return api.TRITONBACKEND_ModelSetState(model, ms);
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model)
{
  void* state = NULL;
  api.TRITONBACKEND_ModelState(model, &state);
  if (state != NULL) {
    int entered = gil_enter();
    PyObject* r = PyObject_CallMethod(((ModelState*)state)->binding, "_loaded", "i", -1);
    if (r == NULL) PyErr_WriteUnraisable(NULL);
    Py_XDECREF(r);
    model_state_free((ModelState*)state);
    gil_leave(entered);
  }
  return NULL;
}

/* With the GIL: a request's parameters as a dict (NULL with *err or an exception). */
static PyObject* read_parameters(TRITONBACKEND_Request* request, TRITONSERVER_Error** err)
{
  PyObject* params = PyDict_New();
  if (params == NULL) return NULL;
  uint32_t n_params = 0;
  if ((*err = api.TRITONBACKEND_RequestParameterCount(request, &n_params))) goto fail;
  for (uint32_t i = 0; i < n_params; i++) {
    const char* key;
    TRITONSERVER_ParameterType type;
    const void* v;
    if ((*err = api.TRITONBACKEND_RequestParameter(request, i, &key, &type, &v))) goto fail;
    PyObject* value = NULL;
    switch (type) {
      case TRITONSERVER_PARAMETER_STRING: value = PyUnicode_FromString((const char*)v); break;
      case TRITONSERVER_PARAMETER_INT: value = PyLong_FromLongLong(*(const int64_t*)v); break;
      case TRITONSERVER_PARAMETER_BOOL: value = PyBool_FromLong(*(const bool*)v); break;
      case TRITONSERVER_PARAMETER_DOUBLE: value = PyFloat_FromDouble(*(const double*)v); break;
      default: continue;
    }
    if (value == NULL || PyDict_SetItemString(params, key, value) < 0) {
      Py_XDECREF(value);
      goto fail;
    }
    Py_DECREF(value);
  }
  return params;
fail:
  Py_DECREF(params);
  return NULL;
}

/* With the GIL: the inputs of one request as a Request (a dict subclass).
 * Views of Triton's buffers are appended to views[] (new references). */
static PyObject* build_request(TRITONBACKEND_Request* request, ModelState* ms,
                               PyObject** views, Py_ssize_t* n_views,
                               uint64_t* batch_size, TRITONSERVER_Error** err)
{
  PyObject* req = PyObject_CallNoArgs(g_request_type);
  PyObject* params = NULL;
  if (req == NULL) goto py_fail;
  uint32_t n_inputs = 0;
  if ((*err = api.TRITONBACKEND_RequestInputCount(request, &n_inputs))) goto fail;
  *batch_size = 1;
  for (uint32_t i = 0; i < n_inputs; i++) {
    TRITONBACKEND_Input* input;
    const char* name;
    TRITONSERVER_DataType dtype;
    const int64_t* shape;
    uint32_t ndim, n_buffers;
    uint64_t byte_size;
    if ((*err = api.TRITONBACKEND_RequestInputByIndex(request, i, &input)) ||
        (*err = api.TRITONBACKEND_InputProperties(input, &name, &dtype, &shape, &ndim,
                                                  &byte_size, &n_buffers)))
      goto fail;
    if (ndim > MAX_DIMS) {
      *err = new_error(TRITONSERVER_ERROR_INVALID_ARG, "input '%s' has too many dimensions", name);
      goto fail;
    }
    if (ms->sequence && strncmp(name, CONTROL_PREFIX, sizeof CONTROL_PREFIX - 1) == 0) {
      /* a sequence-batcher control input (int32 0/1): a Request attribute */
      const void* data = NULL;
      uint64_t size = 0;
      TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
      int64_t mtype_id = 0;
      if ((*err = api.TRITONBACKEND_InputBuffer(input, 0, &data, &size, &mtype, &mtype_id))) goto fail;
      int32_t flag = size >= 4 ? *(const int32_t*)data : 0;
      const char* attr = name + sizeof CONTROL_PREFIX - 1; /* start, end, ready */
      char full[32];
      snprintf(full, sizeof full, "sequence_%s", attr);
      if (PyObject_SetAttrString(req, full, flag ? Py_True : Py_False) < 0) goto py_fail;
      continue;
    }
    if (ms->max_batch_size > 0 && ndim > 0) *batch_size = (uint64_t)shape[0];
    npy_intp dims[MAX_DIMS];
    for (uint32_t d = 0; d < ndim; d++) dims[d] = (npy_intp)shape[d];
    const void* data = NULL;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
    int64_t mtype_id = 0;
    if (n_buffers == 1 &&
        (*err = api.TRITONBACKEND_InputBuffer(input, 0, &data, &size, &mtype, &mtype_id)))
      goto fail;
    PyObject* arr;
    int typenum = numpy_typenum_of(dtype);
    if (n_buffers == 1 && mtype != TRITONSERVER_MEMORY_GPU && dtype != TRITONSERVER_TYPE_BYTES &&
        typenum >= 0) {
      /* one host buffer: a read-only view, no copy */
      int flags = NPY_ARRAY_C_CONTIGUOUS;
      if (((uintptr_t)data % dtype_size(dtype)) == 0)
        flags |= NPY_ARRAY_ALIGNED;
      arr = PyArray_New(&PyArray_Type, (int)ndim, dims, typenum, NULL, (void*)data, 0, flags,
                        NULL);
      if (arr == NULL) goto py_fail;
      views[(*n_views)++] = Py_NewRef(arr);
    } else {
      /* several buffers (or BYTES): gather into one contiguous copy */
      char* gathered = malloc(byte_size ? byte_size : 1);
      uint64_t offset = 0;
      for (uint32_t b = 0; b < n_buffers; b++) {
        mtype = TRITONSERVER_MEMORY_CPU;
        if ((*err = api.TRITONBACKEND_InputBuffer(input, b, &data, &size, &mtype, &mtype_id))) {
          free(gathered);
          goto fail;
        }
        if (mtype == TRITONSERVER_MEMORY_GPU || offset + size > byte_size) {
          free(gathered);
          *err = new_error(TRITONSERVER_ERROR_UNSUPPORTED,
                           "input '%s' arrived in GPU memory or with inconsistent sizes", name);
          goto fail;
        }
        memcpy(gathered + offset, data, size);
        offset += size;
      }
      if (dtype == TRITONSERVER_TYPE_BYTES) {
        PyObject* shape_t = PyTuple_New(ndim);
        for (uint32_t d = 0; shape_t && d < ndim; d++)
          PyTuple_SET_ITEM(shape_t, d, PyLong_FromLongLong(shape[d]));
        PyObject* raw = PyBytes_FromStringAndSize(gathered, (Py_ssize_t)offset);
        arr = (shape_t && raw) ? PyObject_CallFunctionObjArgs(g_decode_bytes, raw, shape_t, NULL)
                               : NULL;
        Py_XDECREF(raw);
        Py_XDECREF(shape_t);
        free(gathered);
      } else if (typenum < 0) {
        free(gathered);
        *err = new_error(TRITONSERVER_ERROR_UNSUPPORTED,
                         "input '%s' has datatype %s, which numpy cannot hold", name,
                         dtype_name(dtype));
        goto fail;
      } else {
        arr = PyArray_SimpleNew((int)ndim, dims, typenum);
        if (arr) memcpy(PyArray_DATA((PyArrayObject*)arr), gathered, offset);
        free(gathered);
      }
      if (arr == NULL) goto py_fail;
    }
    int rc = PyDict_SetItemString(req, name, arr);
    Py_DECREF(arr);
    if (rc < 0) goto py_fail;
  }
  params = read_parameters(request, err);
  if (params == NULL) {
    if (*err != NULL) goto fail;
    goto py_fail;
  }
  if (PyObject_SetAttr(req, s_parameters, params) < 0) goto py_fail;
  if (ms->sequence) {
    uint64_t number = 0;
    const char* text = NULL;
    PyObject* id = NULL;
    TRITONSERVER_Error* e = api.TRITONBACKEND_RequestCorrelationId(request, &number);
    if (e == NULL) {
      id = PyLong_FromUnsignedLongLong(number);
    } else {
      api.TRITONSERVER_ErrorDelete(e);
      e = api.TRITONBACKEND_RequestCorrelationIdString(request, &text);
      if (e == NULL) id = PyUnicode_FromString(text ? text : "");
      else api.TRITONSERVER_ErrorDelete(e), id = Py_NewRef(Py_None);
    }
    int rc = id ? PyObject_SetAttrString(req, "correlation_id", id) : -1;
    Py_XDECREF(id);
    if (rc < 0) goto py_fail;
  }
  Py_DECREF(params);
  return req;
py_fail:
  *err = error_from_python("cannot hand the request to Python");
fail:
  Py_XDECREF(req);
  Py_XDECREF(params);
  return NULL;
}

/* With the GIL: check one returned output against its spec. Returns a
 * C-contiguous array (new reference) or NULL with *err set. */
static PyArrayObject* check_output(ModelState* ms, OutputSpec* o, PyObject* value,
                                   uint64_t batch_size, size_t index, TRITONSERVER_Error** err)
{
  /* NOTSWAPPED: a non-native byte order (x.astype(">i8")) is converted, never reinterpreted */
  PyArrayObject* arr =
      (PyArrayObject*)PyArray_FROM_OF(value, NPY_ARRAY_CARRAY_RO | NPY_ARRAY_NOTSWAPPED);
  if (arr == NULL) {
    *err = error_from_python("output is not an array");
    return NULL;
  }
  TRITONSERVER_DataType got = triton_dtype_of(arr);
  if (got != o->dtype) {
    PyObject* d = PyObject_Str((PyObject*)PyArray_DESCR(arr));
    *err = new_error(TRITONSERVER_ERROR_INTERNAL,
                     "model '%s' returned output '%s' with dtype %s for request %zu; "
                     "its config says %s",
                     ms->name, o->name, d ? PyUnicode_AsUTF8(d) : "?", index, dtype_name(o->dtype));
    Py_XDECREF(d);
    Py_DECREF(arr);
    return NULL;
  }
  int batched = ms->max_batch_size > 0;
  int ndim = PyArray_NDIM(arr);
  int ok = ndim == o->ndims + batched && ndim <= MAX_DIMS;
  if (ok && batched) ok = (uint64_t)PyArray_DIM(arr, 0) == batch_size;
  for (int d = 0; ok && d < o->ndims; d++)
    ok = o->dims[d] < 0 || o->dims[d] == PyArray_DIM(arr, d + batched);
  if (!ok) {
    char want[256], have[256];
    int w = snprintf(want, sizeof want, "(%s", batched ? "batch" : "");
    for (int d = 0; d < o->ndims && w < 200; d++)
      w += snprintf(want + w, sizeof want - w, "%s%lld", (d || batched) ? ", " : "",
                    (long long)o->dims[d]);
    snprintf(want + w, sizeof want - w, ")");
    int h = snprintf(have, sizeof have, "(");
    for (int d = 0; d < ndim && h < 200; d++)
      h += snprintf(have + h, sizeof have - h, "%s%lld", d ? ", " : "",
                    (long long)PyArray_DIM(arr, d));
    snprintf(have + h, sizeof have - h, ")");
    *err = new_error(TRITONSERVER_ERROR_INTERNAL,
                     "model '%s' returned output '%s' with shape %s for request %zu; "
                     "expected %s%s with batch = %llu",
                     ms->name, o->name, have, index, want, batched ? "" : " (no batch axis)",
                     (unsigned long long)batch_size);
    Py_DECREF(arr);
    return NULL;
  }
  return arr;
}

/* With the GIL: build request i's response from out (a dict), outputs copied
 * in. Returns the response to send (NULL if none could be made) and sets
 * *error when the request failed. */
static TRITONSERVER_Error* fill_response(ModelState* ms, TRITONBACKEND_Request* request,
                                         TRITONBACKEND_Response* response, PyObject* out,
                                         uint64_t batch_size, size_t index)
{
  TRITONSERVER_Error* err = NULL;
  if (ms->sequence && out == Py_None) return NULL; /* a padding request: Triton drops its response */
  if (!PyDict_Check(out)) {
    err = new_error(TRITONSERVER_ERROR_INTERNAL,
                    "model '%s' must return one dict of outputs per request; "
                    "got %s for request %zu",
                    ms->name, Py_TYPE(out)->tp_name, index);
    goto send;
  }
  uint32_t n_requested = 0;
  if ((err = api.TRITONBACKEND_RequestOutputCount(request, &n_requested))) goto send;
  for (uint32_t r = 0; r < n_requested; r++) {
    const char* name;
    if ((err = api.TRITONBACKEND_RequestOutputName(request, r, &name))) goto send;
    OutputSpec* o = NULL;
    for (Py_ssize_t k = 0; k < ms->n_outputs; k++)
      if (strcmp(ms->outputs[k].name, name) == 0) o = &ms->outputs[k];
    PyObject* value = o ? PyDict_GetItemWithError(out, o->name_obj) : NULL;
    if (value == NULL) {
      PyErr_Clear();
      PyObject* keys = PyDict_Keys(out);
      PyObject* text = keys ? PyObject_Repr(keys) : NULL;
      err = new_error(TRITONSERVER_ERROR_INTERNAL,
                      "model '%s' returned no output '%s' for request %zu (it returned %s)",
                      ms->name, name, index, text ? PyUnicode_AsUTF8(text) : "?");
      Py_XDECREF(text);
      Py_XDECREF(keys);
      goto send;
    }
    PyArrayObject* arr = check_output(ms, o, value, batch_size, index, &err);
    if (arr == NULL) goto send;
    PyObject* bytes = NULL;
    const void* data = PyArray_DATA(arr);
    size_t nbytes = (size_t)PyArray_NBYTES(arr);
    if (o->dtype == TRITONSERVER_TYPE_BYTES) {
      bytes = PyObject_CallOneArg(g_encode_bytes, (PyObject*)arr);
      if (bytes == NULL) {
        Py_DECREF(arr);
        err = error_from_python("cannot serialize a BYTES output");
        goto send;
      }
      data = PyBytes_AS_STRING(bytes);
      nbytes = (size_t)PyBytes_GET_SIZE(bytes);
    }
    int64_t shape[MAX_DIMS];
    int ndim = PyArray_NDIM(arr);
    for (int d = 0; d < ndim; d++) shape[d] = PyArray_DIM(arr, d);
    TRITONBACKEND_Output* output;
    void* buffer;
    TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
    int64_t mtype_id = 0;
    err = api.TRITONBACKEND_ResponseOutput(response, &output, name, o->dtype, shape,
                                           (uint32_t)ndim);
    if (err == NULL)
      err = api.TRITONBACKEND_OutputBuffer(output, &buffer, nbytes, &mtype, &mtype_id);
    if (err == NULL && mtype == TRITONSERVER_MEMORY_GPU)
      err = new_error(TRITONSERVER_ERROR_UNSUPPORTED,
                      "output '%s' was given GPU memory; host outputs only here", name);
    if (err == NULL && nbytes) memcpy(buffer, data, nbytes);
    Py_XDECREF(bytes);
    Py_DECREF(arr);
    if (err != NULL) goto send;
  }
send:
  return err;
}

static TRITONBACKEND_Response* respond(ModelState* ms, TRITONBACKEND_Request* request,
                                       PyObject* out, uint64_t batch_size, size_t index,
                                       TRITONSERVER_Error** error)
{
  TRITONBACKEND_Response* response = NULL;
  *error = api.TRITONBACKEND_ResponseNew(&response, request);
  if (*error != NULL) return NULL;
  /* the caller sends the error, reports it in the statistics and deletes it */
  *error = fill_response(ms, request, response, out, batch_size, index);
  return response;
}

static void send_final(TRITONBACKEND_Response* response, TRITONSERVER_Error* err)
{
  TRITONSERVER_Error* send_err =
      api.TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);
  if (send_err != NULL) {
    api.TRITONSERVER_ErrorDelete(send_err);
    api.TRITONBACKEND_ResponseDelete(response);
  }
}

/* ---- custom batching rules ------------------------------------------------
 * Triton loads this same library as the model's batch strategy
 * (TRITON_BATCH_STRATEGY_PATH) and asks, on its batcher thread, whether each
 * pending request may join the batch being formed. The binding's rule answers
 * from the candidate's parameters and the requests already accepted. */
typedef struct {
  ModelState* ms;
  PyObject* batch; /* list of accepted candidates */
} BatchRecord;

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher,
                                                               TRITONBACKEND_Model* model)
{
  void* state = NULL;
  TRITONSERVER_Error* err = api.TRITONBACKEND_ModelState(model, &state);
  *batcher = (TRITONBACKEND_Batcher*)state;
  return err;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher)
{
  (void)batcher;
  return NULL;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher,
                                                             void** userp)
{
  BatchRecord* record = calloc(1, sizeof(BatchRecord));
  record->ms = (ModelState*)batcher;
  int entered = gil_enter();
  record->batch = PyList_New(0);
  gil_leave(entered);
  *userp = record;
  return NULL;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp)
{
  BatchRecord* record = (BatchRecord*)userp;
  int entered = gil_enter();
  Py_XDECREF(record->batch);
  gil_leave(entered);
  free(record);
  return NULL;
}

static PyObject* read_parameters(TRITONBACKEND_Request* request, TRITONSERVER_Error** err);

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request,
                                                                 void* userp, bool* should_include)
{
  BatchRecord* record = (BatchRecord*)userp;
  *should_include = true;
  if (record->ms == NULL || record->ms->include == NULL || record->batch == NULL) return NULL;
  TRITONSERVER_Error* err = NULL;
  int entered = gil_enter();
  PyObject* candidate = PyObject_CallNoArgs(g_request_type);
  PyObject* params = candidate ? read_parameters(request, &err) : NULL;
  PyObject* answer = NULL;
  if (params != NULL && PyObject_SetAttr(candidate, s_parameters, params) == 0)
    answer = PyObject_CallFunctionObjArgs(record->ms->include, record->batch, candidate, NULL);
  if (answer != NULL) {
    *should_include = PyObject_IsTrue(answer) == 1;
  } else if (err == NULL) {
    PyErr_WriteUnraisable(record->ms->include); /* the binding logs rule errors itself */
  }
  PyErr_Clear();
  Py_XDECREF(answer);
  Py_XDECREF(params);
  Py_XDECREF(candidate);
  gil_leave(entered);
  if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
  return NULL;
}

/* ---- decoupled models: several responses per request --------------------
 * The binding returns an iterator of steps; each step is a list with one
 * outputs dict (or None) per request, or a str: the message of an exception.
 * Every dict is sent at once as a response of its own; when the iterator ends
 * each request gets its final flag. Before each step, requests whose caller
 * went away (cancelled) are closed; when all are, the iterator is closed. */
static void factory_finish(TRITONBACKEND_ResponseFactory** f, TRITONSERVER_Error* err)
{
  if (*f == NULL) return;
  if (err != NULL) {
    TRITONBACKEND_Response* response = NULL;
    if (api.TRITONBACKEND_ResponseNewFromFactory(&response, *f) == NULL)
      send_final(response, err);
  } else {
    TRITONSERVER_Error* e = api.TRITONBACKEND_ResponseFactorySendFlags(*f, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
    if (e) api.TRITONSERVER_ErrorDelete(e);
  }
  api.TRITONBACKEND_ResponseFactoryDelete(*f);
  *f = NULL;
}

static TRITONSERVER_Error* copy_error(TRITONSERVER_Error* err)
{
  return api.TRITONSERVER_ErrorNew(api.TRITONSERVER_ErrorCode(err), api.TRITONSERVER_ErrorMessage(err));
}

static void run_decoupled(ModelState* ms, TRITONBACKEND_Request** requests, uint32_t count,
                          PyObject* steps, uint64_t* sizes, TRITONSERVER_Error** errors)
{
  TRITONBACKEND_ResponseFactory** factories = calloc(count, sizeof(TRITONBACKEND_ResponseFactory*));
  uint32_t open = 0;
  for (uint32_t i = 0; i < count; i++) {
    errors[i] = api.TRITONBACKEND_ResponseFactoryNew(&factories[i], requests[i]);
    if (errors[i] == NULL) {
      open++;
    } else { /* answer it the plain way */
      TRITONBACKEND_Response* response = NULL;
      factories[i] = NULL;
      if (api.TRITONBACKEND_ResponseNew(&response, requests[i]) == NULL) send_final(response, errors[i]);
    }
  }
  TRITONSERVER_Error* fail = NULL;
  while (open > 0 && fail == NULL) {
    for (uint32_t i = 0; i < count; i++) {
      bool cancelled = false;
      if (factories[i] && api.TRITONBACKEND_ResponseFactoryIsCancelled(factories[i], &cancelled) == NULL &&
          cancelled) {
        factory_finish(&factories[i], NULL);
        errors[i] = new_error(TRITONSERVER_ERROR_CANCELLED, "the caller cancelled the request");
        open--;
      }
    }
    if (open == 0) break;
    PyObject* step = PyIter_Next(steps);
    if (step == NULL) {
      if (PyErr_Occurred()) fail = error_from_python("model binding failed");
      break;
    }
    if (PyUnicode_Check(step)) {
      fail = new_error(TRITONSERVER_ERROR_INTERNAL, "%s", PyUnicode_AsUTF8(step));
    } else if (!PyList_Check(step) || PyList_GET_SIZE(step) != (Py_ssize_t)count) {
      fail = new_error(TRITONSERVER_ERROR_INTERNAL,
                       "model '%s' must yield a list with one dict (or None) per request (%u)",
                       ms->name, count);
    } else {
      for (uint32_t i = 0; i < count; i++) {
        PyObject* out = PyList_GET_ITEM(step, i);
        if (out == Py_None || factories[i] == NULL) continue;
        TRITONBACKEND_Response* response = NULL;
        TRITONSERVER_Error* err = api.TRITONBACKEND_ResponseNewFromFactory(&response, factories[i]);
        if (err == NULL) err = fill_response(ms, requests[i], response, out, sizes[i], i);
        if (err != NULL) { /* this request fails; the others go on */
          if (response) send_final(response, err);
          api.TRITONBACKEND_ResponseFactoryDelete(factories[i]);
          factories[i] = NULL;
          errors[i] = err;
          open--;
          continue;
        }
        TRITONSERVER_Error* send_err = api.TRITONBACKEND_ResponseSend(response, 0, NULL);
        if (send_err) {
          api.TRITONSERVER_ErrorDelete(send_err);
          api.TRITONBACKEND_ResponseDelete(response);
        }
      }
    }
    Py_DECREF(step);
  }
  PyObject* r = PyObject_CallMethod(steps, "close", NULL); /* a no-op once exhausted */
  if (r == NULL) PyErr_Clear();
  Py_XDECREF(r);
  for (uint32_t i = 0; i < count; i++) {
    if (factories[i] != NULL && fail != NULL && errors[i] == NULL) errors[i] = copy_error(fail);
    factory_finish(&factories[i], factories[i] ? (fail ? errors[i] : NULL) : NULL);
  }
  if (fail != NULL) api.TRITONSERVER_ErrorDelete(fail);
  free(factories);
}

/* An input view that the callable kept a reference to must outlive Triton's
 * buffer: give it its own copy of the data before the request is released. */
static void detach_view(PyArrayObject* arr)
{
  if (Py_REFCNT(arr) <= 1) return;
  size_t n = (size_t)PyArray_NBYTES(arr);
  void* copy = malloc(n ? n : 1);
  PyObject* owner = copy ? PyCapsule_New(copy, "embedtriton.block", NULL) : NULL;
  if (owner == NULL) {
    free(copy);
    PyErr_Clear();
    return;
  }
  memcpy(copy, PyArray_DATA(arr), n);
  PyCapsule_SetPointer(owner, copy);
  PyCapsule_SetDestructor(owner, (PyCapsule_Destructor)NULL);
  /* free through the capsule destructor: */
  PyCapsule_SetDestructor(owner, free_block_capsule);
  ((PyArrayObject_fields*)arr)->data = copy;
  if (PyArray_SetBaseObject(arr, owner) < 0) PyErr_Clear();
}

/* ---- iterative sequences (continuous batching) -----------------------------
 * Each in-flight request has a generator in the binding; every execute
 * advances the generators of the requests Triton scheduled together by one
 * step and streams each yield to its caller. A request whose generator is
 * not done is released with RESCHEDULE: Triton puts it back, and new
 * requests join the next iteration instead of waiting for the batch. */
/* Whether a sequence request is real: the sequence batcher pads batches with
 * copies of real requests whose READY control input is 0. */
static int request_ready(TRITONBACKEND_Request* request)
{
  TRITONBACKEND_Input* input = NULL;
  const void* data = NULL;
  uint64_t size = 0;
  TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
  int64_t mtype_id = 0;
  TRITONSERVER_Error* err = api.TRITONBACKEND_RequestInput(request, CONTROL_PREFIX "ready", &input);
  if (err == NULL) err = api.TRITONBACKEND_InputBuffer(input, 0, &data, &size, &mtype, &mtype_id);
  if (err != NULL) {
    api.TRITONSERVER_ErrorDelete(err);
    return 1;
  }
  return size < 4 || *(const int32_t*)data != 0;
}

static void run_iterative(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                          TRITONBACKEND_Request** requests, uint32_t count, uint64_t exec_start)
{
  int entered = gil_enter();
  t_deferred = PyDict_New();
  PyObject* step = PyList_New(count); /* (key, Request or None) per request */
  uint64_t* sizes = calloc(count, sizeof(uint64_t));
  TRITONSERVER_Error** errors = calloc(count, sizeof(TRITONSERVER_Error*));
  for (uint32_t i = 0; i < count && step; i++) {
    if (!request_ready(requests[i])) { /* padding: nobody waits for it */
      PyList_SET_ITEM(step, i, Py_BuildValue("(OO)", Py_None, Py_None));
      continue;
    }
    PyObject* key = PyLong_FromVoidPtr(requests[i]);
    PyObject* req = Py_NewRef(Py_None);
    PyObject* views[MAX_DIMS * 4];
    Py_ssize_t n_views = 0;
    uint32_t n_inputs = 0;
    api.TRITONBACKEND_RequestInputCount(requests[i], &n_inputs);
    PyObject* known = PyObject_CallMethod(ms->binding, "_knows", "O", key);
    if (known == Py_False && n_inputs <= MAX_DIMS * 4) { /* first iteration: hand over its inputs */
      Py_DECREF(req);
      req = build_request(requests[i], ms, views, &n_views, &sizes[i], &errors[i]);
      for (Py_ssize_t v = 0; v < n_views; v++) { /* kept across iterations: own copies */
        detach_view((PyArrayObject*)views[v]);
        Py_DECREF(views[v]);
      }
      if (req == NULL) req = Py_NewRef(Py_None);
    }
    Py_XDECREF(known);
    PyErr_Clear();
    PyList_SET_ITEM(step, i, Py_BuildValue("(NN)", key, req));
  }
  uint64_t compute_start = now_ns();
  /* result: per request (outputs dict | None | error str, done) */
  PyObject* result = step ? PyObject_CallOneArg(ms->iterate, step) : NULL;
  uint64_t compute_end = now_ns();
  if (result == NULL || !PyList_Check(result) || PyList_GET_SIZE(result) != (Py_ssize_t)count) {
    TRITONSERVER_Error* e = error_from_python("model binding failed");
    for (uint32_t i = 0; i < count; i++)
      if (errors[i] == NULL) errors[i] = copy_error(e);
    api.TRITONSERVER_ErrorDelete(e);
  }
  for (uint32_t i = 0; i < count; i++) {
    PyObject* out = Py_None;
    int done = 1;
    TRITONSERVER_Error* err = errors[i];
    if (step && PyTuple_GET_ITEM(PyList_GET_ITEM(step, i), 0) == Py_None) { /* padding */
      if (err) api.TRITONSERVER_ErrorDelete(err);
      api.TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
      continue;
    }
    if (err == NULL) {
      PyObject* item = PyList_GET_ITEM(result, i);
      out = PyTuple_GET_ITEM(item, 0);
      done = PyObject_IsTrue(PyTuple_GET_ITEM(item, 1)) == 1;
      if (PyUnicode_Check(out)) err = new_error(TRITONSERVER_ERROR_INTERNAL, "%s", PyUnicode_AsUTF8(out));
    }
    TRITONBACKEND_ResponseFactory* factory = NULL;
    if (api.TRITONBACKEND_ResponseFactoryNew(&factory, requests[i]) == NULL) {
      bool cancelled = false;
      if (!done && (take_closed(requests[i]) ||
                    (api.TRITONBACKEND_RequestIsCancelled(requests[i], &cancelled) == NULL && cancelled))) {
        PyObject* r = PyObject_CallMethod(ms->binding, "_forget", "N", PyLong_FromVoidPtr(requests[i]));
        Py_XDECREF(r);
        PyErr_Clear();
        done = 1;
      }
      if (err != NULL) {
        factory_finish(&factory, err);
      } else if (out != Py_None) {
        TRITONBACKEND_Response* response = NULL;
        err = api.TRITONBACKEND_ResponseNewFromFactory(&response, factory);
        if (err == NULL) err = fill_response(ms, requests[i], response, out, sizes[i] ? sizes[i] : 1, i);
        if (err != NULL) {
          if (response) send_final(response, err);
          PyObject* r = PyObject_CallMethod(ms->binding, "_forget", "N", PyLong_FromVoidPtr(requests[i]));
          Py_XDECREF(r);
          PyErr_Clear();
          done = 1;
        } else {
          TRITONSERVER_Error* send_err = api.TRITONBACKEND_ResponseSend(
              response, done ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0, NULL);
          if (send_err) api.TRITONSERVER_ErrorDelete(send_err), api.TRITONBACKEND_ResponseDelete(response);
        }
        api.TRITONBACKEND_ResponseFactoryDelete(factory);
        factory = NULL;
      } else if (done) {
        factory_finish(&factory, NULL);
      }
      if (factory != NULL) api.TRITONBACKEND_ResponseFactoryDelete(factory);
    }
    if (done) {
      api.TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[i], err == NULL, exec_start,
                                                      compute_start, compute_end, now_ns());
      api.TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
    } else {
      api.TRITONBACKEND_RequestRelease(requests[i], RELEASE_RESCHEDULE);
    }
    if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
  }
  api.TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, exec_start, compute_start,
                                                       compute_end, now_ns());
  Py_XDECREF(result);
  Py_XDECREF(step);
  free(sizes);
  free(errors);
  flush_deferred();
  gil_leave(entered);
}

static TRITONSERVER_Error* execute_batch(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                                         TRITONBACKEND_Request** requests, const uint32_t count,
                                         uint64_t exec_start);

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests,
    const uint32_t count)
{
  TRITONBACKEND_Model* model;
  void* state = NULL;
  TRITONSERVER_Error* err = api.TRITONBACKEND_ModelInstanceModel(instance, &model);
  if (err == NULL) err = api.TRITONBACKEND_ModelState(model, &state);
  if (err != NULL) return err;
  ModelState* ms = (ModelState*)state;
  uint64_t exec_start = now_ns();
  if (ms->iterate != NULL) {
    t_in_execute = 1;
    run_iterative(ms, instance, requests, count, exec_start);
    t_in_execute = 0;
    flush_wakes();
    return NULL;
  }

  /* Requests whose caller went away while they waited (a gRPC client that
   * disconnected, a Ctrl-C) are answered CANCELLED without running the callable.
   * (Sequence requests always run: the callable keeps each sequence's state.) */
  TRITONBACKEND_Request* live_inline[64];
  TRITONBACKEND_Request** live = count <= 64 ? live_inline : malloc(count * sizeof(*live));
  if (live == NULL) return new_error(TRITONSERVER_ERROR_UNAVAILABLE, "out of memory");
  uint32_t n_live = 0;
  for (uint32_t i = 0; i < count; i++) {
    bool cancelled = false;
    TRITONSERVER_Error* e = ms->sequence ? NULL : api.TRITONBACKEND_RequestIsCancelled(requests[i], &cancelled);
    if (e != NULL) api.TRITONSERVER_ErrorDelete(e), cancelled = false;
    if (!cancelled) {
      live[n_live++] = requests[i];
      continue;
    }
    TRITONBACKEND_Response* response = NULL;
    TRITONSERVER_Error* why = new_error(TRITONSERVER_ERROR_CANCELLED,
                                        "the request was cancelled before model '%s' ran it", ms->name);
    if (api.TRITONBACKEND_ResponseNew(&response, requests[i]) == NULL) send_final(response, why);
    api.TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[i], false, exec_start, exec_start,
                                                    exec_start, now_ns());
    api.TRITONSERVER_ErrorDelete(why);
    api.TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  if (n_live == 0) {
    if (live != live_inline) free(live);
    flush_wakes();
    return NULL;
  }
  TRITONSERVER_Error* status = execute_batch(ms, instance, live, n_live, exec_start);
  if (live != live_inline) free(live);
  return status;
}

/* Run one batch of live requests through the callable and answer each. */
static TRITONSERVER_Error* execute_batch(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                                         TRITONBACKEND_Request** requests, const uint32_t count,
                                         uint64_t exec_start)
{
  TRITONSERVER_Error** errors = calloc(count, sizeof(TRITONSERVER_Error*));
  uint64_t* sizes = calloc(count, sizeof(uint64_t));
  PyObject** views = NULL;
  Py_ssize_t n_views = 0;
  uint64_t batch_size = 0, compute_start = 0, compute_end = 0;

  if (t_wake_cap < count) {
    atomic_int** grown = realloc(t_wake, count * sizeof(atomic_int*));
    if (grown != NULL) t_wake = grown, t_wake_cap = count;
  }
  t_in_execute = 1;
  int entered = gil_enter();
  PyObject* list = PyList_New(count);
  if (list == NULL) {
    PyErr_Clear();
    gil_leave(entered);
    t_in_execute = 0;
    free(errors);
    free(sizes);
    return new_error(TRITONSERVER_ERROR_UNAVAILABLE, "out of memory");
  }
  size_t view_cap = 0;
  for (uint32_t i = 0; i < count; i++) {
    uint32_t n_inputs = 0;
    api.TRITONBACKEND_RequestInputCount(requests[i], &n_inputs);
    view_cap += n_inputs;
  }
  views = calloc(view_cap + 1, sizeof(PyObject*));
  TRITONSERVER_Error* batch_err = NULL;
  for (uint32_t i = 0; i < count && batch_err == NULL; i++) {
    PyObject* req = build_request(requests[i], ms, views, &n_views, &sizes[i], &batch_err);
    if (req != NULL) PyList_SET_ITEM(list, i, req);
    batch_size += sizes[i];
  }
  PyObject* result = NULL;
  if (batch_err == NULL) {
    compute_start = now_ns();
    result = PyObject_CallOneArg(ms->execute, list);
    compute_end = now_ns();
    if (result == NULL)
      batch_err = error_from_python("model binding failed");
    else if (PyUnicode_Check(result)) /* the callable raised: its message */
      batch_err = new_error(TRITONSERVER_ERROR_INTERNAL, "%s", PyUnicode_AsUTF8(result));
    else if (ms->decoupled) {
      run_decoupled(ms, requests, count, result, sizes, errors);
      compute_end = now_ns();
    } else if (!PyList_Check(result) || PyList_GET_SIZE(result) != (Py_ssize_t)count)
      batch_err = new_error(TRITONSERVER_ERROR_INTERNAL,
                            "model '%s' must return a list with one dict per request (%u)",
                            ms->name, count);
  }
  if (compute_start == 0) compute_start = compute_end = now_ns();
  /* Build every response (outputs copied into Triton's buffers) ... */
  TRITONBACKEND_Response** responses = calloc(count, sizeof(TRITONBACKEND_Response*));
  for (uint32_t i = 0; i < count; i++) {
    if (batch_err != NULL) {
      if (api.TRITONBACKEND_ResponseNew(&responses[i], requests[i]) != NULL) responses[i] = NULL;
      errors[i] = api.TRITONSERVER_ErrorNew(api.TRITONSERVER_ErrorCode(batch_err),
                                            api.TRITONSERVER_ErrorMessage(batch_err));
    } else if (!ms->decoupled) { /* decoupled: all sent already */
      responses[i] = respond(ms, requests[i], PyList_GET_ITEM(result, i), sizes[i], i, &errors[i]);
    }
  }
  Py_XDECREF(result);
  Py_DECREF(list);
  /* ... detach the input views the callable kept (they still point at the
   * callers' memory) ... */
  for (Py_ssize_t v = 0; v < n_views; v++) {
    detach_view((PyArrayObject*)views[v]);
    Py_DECREF(views[v]);
  }
  free(views);
  if (batch_err != NULL) api.TRITONSERVER_ErrorDelete(batch_err);
  /* ... and only then send: a response lets its caller go on and reuse its
   * inputs. Still holding the GIL: async completions are collected and handed
   * to their event loops in one go, sync callers woken once the GIL is free. */
  t_deferred = PyDict_New();
  /* With a batch rule, Triton's batcher thread takes the GIL while it holds its
   * queue lock: never wait on Triton holding the GIL then. */
  PyThreadState* saved = NULL;
  if (ms->include != NULL) {
    saved = PyEval_SaveThread();
    t_depth = 0;
  }
  for (uint32_t i = 0; i < count; i++)
    if (responses[i] != NULL) send_final(responses[i], errors[i]);
  free(responses);

  uint64_t exec_end = now_ns();
  for (uint32_t i = 0; i < count; i++) {
    api.TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[i], errors[i] == NULL,
                                                    exec_start, compute_start, compute_end,
                                                    exec_end);
    if (errors[i] != NULL) api.TRITONSERVER_ErrorDelete(errors[i]);
    api.TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  if (batch_size == 0) batch_size = count;
  api.TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, batch_size, exec_start,
                                                       compute_start, compute_end, exec_end);
  if (saved != NULL) {
    PyEval_RestoreThread(saved);
    t_depth = 1;
  }
  flush_deferred();
  gil_leave(entered);
  t_in_execute = 0;
  flush_wakes();
  free(errors);
  free(sizes);
  return NULL;
}

/* ---- shared-memory mappings, guarded against SIGBUS ----------------------
 * A client's shared-memory region is mapped here and handed to Triton and the
 * model as it is (no copy). The client owns the file and may shrink it: a
 * read or write past its new end raises SIGBUS, which would kill the process.
 * Our SIGBUS handler recognises faults inside a registered mapping, puts
 * private zero pages over the rest of that mapping (so the access completes)
 * and marks it truncated; the frontend then fails the requests that used it.
 * Faults anywhere else go to the previous handler (faulthandler, default). */
#define MAX_MAPPINGS 1024
typedef struct {
  _Atomic(uintptr_t) start, end; /* [start, end) of a live mapping; start 0: free slot */
  atomic_int truncated;
} FaultSlot;
static FaultSlot fault_slots[MAX_MAPPINGS];
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER; /* slot writers only */
static struct sigaction previous_sigbus;
static uintptr_t page_size = 4096;

static void on_sigbus(int sig, siginfo_t* info, void* context)
{
  uintptr_t at = (uintptr_t)info->si_addr;
  if (info->si_code > 0) { /* raised by the kernel for a faulting access */
    for (int i = 0; i < MAX_MAPPINGS; i++) {
      uintptr_t start = atomic_load(&fault_slots[i].start);
      uintptr_t end = atomic_load(&fault_slots[i].end);
      if (start == 0 || at < start || at >= end) continue;
      uintptr_t page = at & ~(page_size - 1);
      if (mmap((void*)page, end - page, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
        atomic_store(&fault_slots[i].truncated, 1);
        return; /* the access is retried on the zero pages */
      }
    }
  }
  if ((previous_sigbus.sa_flags & SA_SIGINFO) && previous_sigbus.sa_sigaction != NULL) {
    previous_sigbus.sa_sigaction(sig, info, context);
  } else if (!(previous_sigbus.sa_flags & SA_SIGINFO) && previous_sigbus.sa_handler != SIG_DFL &&
             previous_sigbus.sa_handler != SIG_IGN) {
    previous_sigbus.sa_handler(sig);
  } else { /* the default: the access faults again and the process ends as it would have */
    signal(SIGBUS, SIG_DFL);
    if (info->si_code <= 0) raise(SIGBUS);
  }
}

/* Put our handler first (again, if someone replaced it since). */
static int install_sigbus(void)
{
  struct sigaction current;
  if (sigaction(SIGBUS, NULL, &current) != 0) return -1;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus) return 0;
  struct sigaction ours;
  memset(&ours, 0, sizeof ours);
  ours.sa_sigaction = on_sigbus;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&ours.sa_mask);
  previous_sigbus = current;
  return sigaction(SIGBUS, &ours, NULL);
}

typedef struct {
  PyObject_HEAD
  char* base;
  size_t length;
  int slot;
  int closed;
  Py_ssize_t exports;
} MappingObject;

static void mapping_unmap(MappingObject* m)
{
  if (m->base == NULL) return;
  pthread_mutex_lock(&fault_lock);
  atomic_store(&fault_slots[m->slot].start, 0); /* before munmap: the range may be reused */
  atomic_store(&fault_slots[m->slot].end, 0);
  pthread_mutex_unlock(&fault_lock);
  munmap(m->base, m->length);
  m->base = NULL;
}

static int mapping_getbuffer(MappingObject* m, Py_buffer* view, int flags)
{
  if (m->closed || m->base == NULL) {
    PyErr_SetString(PyExc_BufferError, "the shared-memory mapping is closed");
    return -1;
  }
  if (PyBuffer_FillInfo(view, (PyObject*)m, m->base, (Py_ssize_t)m->length, 0, flags) < 0) return -1;
  m->exports++;
  return 0;
}

static void mapping_releasebuffer(MappingObject* m, Py_buffer* view)
{
  (void)view;
  if (--m->exports == 0 && m->closed) mapping_unmap(m);
}

static PyObject* mapping_close(MappingObject* m, PyObject* unused)
{
  (void)unused;
  m->closed = 1;
  if (m->exports == 0) mapping_unmap(m); /* else when the last view goes */
  Py_RETURN_NONE;
}

static PyObject* mapping_truncated(MappingObject* m, void* closure)
{
  (void)closure;
  return PyBool_FromLong(m->base != NULL && atomic_load(&fault_slots[m->slot].truncated));
}

static PyObject* mapping_size(MappingObject* m, void* closure)
{
  (void)closure;
  return PyLong_FromSize_t(m->length);
}

static void mapping_dealloc(MappingObject* m)
{
  mapping_unmap(m);
  Py_TYPE(m)->tp_free((PyObject*)m);
}

static PyBufferProcs mapping_as_buffer = {(getbufferproc)mapping_getbuffer,
                                          (releasebufferproc)mapping_releasebuffer};
static PyMethodDef mapping_methods[] = {
    {"close", (PyCFunction)mapping_close, METH_NOARGS,
     "Unmap (now, or when the last view of it is released)."},
    {NULL, NULL, 0, NULL}};
static PyGetSetDef mapping_getset[] = {
    {"truncated", (getter)mapping_truncated, NULL,
     "whether an access found the file shrunk under the mapping (its data is lost)", NULL},
    {"size", (getter)mapping_size, NULL, "mapped bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL}};
static PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "embedtriton._native.Mapping",
    .tp_basicsize = sizeof(MappingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A shared-memory file mapped read-write, guarded against SIGBUS (see map_shared).",
    .tp_dealloc = (destructor)mapping_dealloc,
    .tp_as_buffer = &mapping_as_buffer,
    .tp_methods = mapping_methods,
    .tp_getset = mapping_getset,
};

/* map_shared(fd, length) -> Mapping: the first length bytes of the file. */
static PyObject* py_map_shared(PyObject* self, PyObject* args)
{
  (void)self;
  int fd;
  Py_ssize_t length;
  if (!PyArg_ParseTuple(args, "in:map_shared", &fd, &length)) return NULL;
  if (length <= 0) return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "a mapping needs a positive size");
  if (install_sigbus() != 0) return PyErr_SetFromErrno(PyExc_OSError);
  void* base = mmap(NULL, (size_t)length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
  size_t mapped = ((size_t)length + page_size - 1) & ~(page_size - 1);
  int slot = -1;
  pthread_mutex_lock(&fault_lock);
  for (int i = 0; i < MAX_MAPPINGS && slot < 0; i++)
    if (atomic_load(&fault_slots[i].start) == 0) {
      slot = i;
      atomic_store(&fault_slots[i].truncated, 0);
      atomic_store(&fault_slots[i].end, (uintptr_t)base + mapped);
      atomic_store(&fault_slots[i].start, (uintptr_t)base);
    }
  pthread_mutex_unlock(&fault_lock);
  if (slot < 0) {
    munmap(base, (size_t)length);
    char msg[160];
    snprintf(msg, sizeof msg, "too many shared-memory regions are mapped (%d); unregister some first",
             MAX_MAPPINGS);
    return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE, msg);
  }
  MappingObject* m = PyObject_New(MappingObject, &MappingType);
  if (m == NULL) {
    MappingObject tmp = {.base = base, .length = (size_t)length, .slot = slot};
    mapping_unmap(&tmp);
    return NULL;
  }
  m->base = base;
  m->length = (size_t)length;
  m->slot = slot;
  m->closed = 0;
  m->exports = 0;
  return (PyObject*)m;
}

/* ---- module ------------------------------------------------------------ */

/* load(handle): resolve the Triton functions from the runtime Python loaded. */
static PyObject* py_load(PyObject* self, PyObject* arg)
{
  (void)self;
  void* handle = PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return NULL;
  if (api_loaded) Py_RETURN_NONE;
  et_api_t loaded;
#define ET_RESOLVE(ret, name, params)                                         \
  *(void**)&loaded.name = dlsym(handle, #name);                               \
  if (loaded.name == NULL)                                                     \
    return PyErr_Format(PyExc_RuntimeError,                                    \
                        "the Triton runtime lacks %s: it is older than 2.51", #name);
  ET_TRITON_FUNCTIONS(ET_RESOLVE)
#undef ET_RESOLVE
  api = loaded;
  TRITONSERVER_Error* err =
      api.TRITONSERVER_ResponseAllocatorNew(&allocator, alloc_fn, release_fn, NULL);
  if (err != NULL) return raise_from(err, 1);
  api_loaded = 1;
  Py_RETURN_NONE;
}

static PyObject* py_set_hooks(PyObject* self, PyObject* args)
{
  (void)self;
  PyObject *bindings, *request_type, *make_error, *decode, *encode, *request_done;
  if (!PyArg_ParseTuple(args, "O!OOOOO", &PyDict_Type, &bindings, &request_type, &make_error,
                        &decode, &encode, &request_done))
    return NULL;
  Py_XSETREF(g_request_done, Py_NewRef(request_done));
  Py_XSETREF(g_bindings, Py_NewRef(bindings));
  Py_XSETREF(g_request_type, Py_NewRef(request_type));
  Py_XSETREF(g_make_error, Py_NewRef(make_error));
  Py_XSETREF(g_decode_bytes, Py_NewRef(decode));
  Py_XSETREF(g_encode_bytes, Py_NewRef(encode));
  Py_RETURN_NONE;
}

/* open_server(handle) / close_server(handle): whether submit() accepts
 * requests for it. close_server waits for submissions under way. */
static PyObject* py_open_server(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = (TRITONSERVER_Server*)PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return NULL;
  int placed = 0;
  pthread_rwlock_wrlock(&servers_lock);
  for (int i = 0; i < MAX_SERVERS && !placed; i++)
    if (servers[i] == NULL) servers[i] = server, placed = 1;
  pthread_rwlock_unlock(&servers_lock);
  if (!placed) return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE, "too many servers running at once");
  Py_RETURN_NONE;
}

static PyObject* py_close_server(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = (TRITONSERVER_Server*)PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return NULL;
  Py_BEGIN_ALLOW_THREADS
  pthread_rwlock_wrlock(&servers_lock);
  for (int i = 0; i < MAX_SERVERS; i++)
    if (servers[i] == server) servers[i] = NULL;
  pthread_rwlock_unlock(&servers_lock);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject* py_drain(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  long n;
  Py_BEGIN_ALLOW_THREADS
  pthread_rwlock_rdlock(&servers_lock);
  n = drain_graveyard();
  pthread_rwlock_unlock(&servers_lock);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(n);
}

static PyMethodDef methods[] = {
    {"load", py_load, METH_O, "Resolve the Triton C API from a dlopen handle."},
    {"set_hooks", py_set_hooks, METH_VARARGS, "Install the Python hooks."},
    {"submit", (PyCFunction)(void (*)(void))py_submit, METH_FASTCALL,
     "Submit one inference request."},
    {"stream_next", (PyCFunction)(void (*)(void))py_stream_next, METH_FASTCALL,
     "Next response of a stream."},
    {"stream_close", py_stream_close, METH_O, "Close a stream (cancels it if unfinished)."},
    {"cancel", py_cancel, METH_O, "Cancel a request by the handle submit() gave (cancellable=True)."},
    {"_complete", py_complete, METH_O, "Finish an asyncio call (event loop side)."},
    {"pending", py_pending, METH_O, "(calls not completed, requests Triton holds) of a server."},
    {"cancel_all", py_cancel_all, METH_O, "Cancel every request Triton holds for a server."},
    {"fail_pending", py_fail_pending, METH_O,
     "Fail every call of a server that Triton has not completed (stop's deadline)."},
    {"abort_pending", py_abort_pending, METH_O,
     "Fail every call of a deleted server that Triton never completed."},
    {"open_server", py_open_server, METH_O, "Accept requests for a server."},
    {"close_server", py_close_server, METH_O, "Stop accepting requests for a server."},
    {"drain", py_drain, METH_NOARGS, "Delete the requests Triton released since the last drain."},
    {"map_shared", py_map_shared, METH_VARARGS,
     "map_shared(fd, length) -> Mapping: map a shared-memory file, guarded against SIGBUS."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

#define INTERN(var, text) \
  if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;

PyMODINIT_FUNC PyInit__native(void)
{
  import_array();
  const char* spin = getenv("EMBEDTRITON_SPIN_US");
  if (spin != NULL) spin_ns = strtoull(spin, NULL, 10) * 1000;
  long page = sysconf(_SC_PAGESIZE);
  if (page > 0) page_size = (uintptr_t)page;
  if (PyType_Ready(&MappingType) < 0) return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  INTERN(s_call_soon_threadsafe, "call_soon_threadsafe");
  INTERN(s_parameters, "parameters");
  INTERN(s_execute, "execute");
  INTERN(s_max_batch_size, "max_batch_size");
  INTERN(s_output_specs, "output_specs");
  INTERN(s_name, "name");
  INTERN(s_done, "done");
  INTERN(s_set_result, "set_result");
  INTERN(s_set_exception, "set_exception");
  g_complete = PyObject_GetAttrString(m, "_complete");
  if (g_complete == NULL) return NULL;
  PyObject* threading = PyImport_ImportModule("threading");
  PyObject* main = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
  PyObject* ident = main ? PyObject_GetAttrString(main, "ident") : NULL;
  main_thread_ident = ident ? PyLong_AsUnsignedLong(ident) : 0;
  Py_XDECREF(ident), Py_XDECREF(main), Py_XDECREF(threading);
  if (PyErr_Occurred()) return NULL;
  return m;
}
