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
 * (embedtriton/triton/). Triton functions are resolved with dlsym() from the
 * runtime that Python loaded (load(), module.c), so nothing links against Triton.
 * Python's side of the contract (hooks, what is read of a binding) is
 * embedtriton/backend/library.py.
 *
 * This header is private to the files beside it: the types they share, their
 * shared globals (each defined in the file named in its section) and the
 * functions one file calls in another. Everything else in them is static.
 * Each file includes it first: Python.h must come before the system headers.
 *
 * One file per stage of a call, in layers (a file calls only files below it;
 * tests/unit/test_native_layers.py checks that the calls between files form no
 * cycle):
 *
 *   module.c     the module: load(), set_hooks(), the function table
 *   submit.c     submit(), cancel(): a call is set up and handed to Triton
 *   kserve.c     a unary gRPC ModelInfer or HTTP/REST inference decoded, submitted and
 *                answered in C
 *   kserve_pb.c  the KServe-v2 protobuf subset kserve.c reads and writes
 *   kserve_json.c the KServe-v2 JSON subset (and binary tensors) kserve.c reads
 *   kserve_json_write.c  ... and writes
 *   numtext.cc   numbers as JSON text (C++: std::from_chars, std::to_chars)
 *   many.c       submit_many(): a window of calls at a time
 *   backend.c    the backend: models, execute
 *   modes.c      batch rules, decoupled models, iterative sequences
 *   fast_batch.c a plain @batch function called straight from Triton's buffers
 *   batch_io.c   a batch's inputs to Python, its outputs to Triton
 *   inputs.c     inputs (numpy, DLPack) and parameters of a request
 *   complete.c   how a call's end reaches its caller: Triton's callbacks; the call's
 *                kind (call_set_kind, the one place that tells kinds apart, registers
 *                the kind's CallOps); a sync caller woken, an asyncio future resolved
 *                (event loops' mailboxes), a target called with (outputs, error)
 *   streams.c    a stream's hooks (stream_ops): responses queued for their consumer
 *   cancel.c     a caller's cancel; stop()'s cancel_all, fail_pending, abort_pending
 *   queues.c     queue policies and priorities in front of Triton's dynamic batcher
 *   servers.c    open servers, the calls Triton holds (held list), Triton's cancel flag
 *   outputs.c    a finished call's outputs as arrays
 *   memory.c     response allocator, shared-memory mappings (SIGBUS guard)
 *   calls.c      the Call: references, the completion claim, its end (runs its CallOps)
 *   trace.c      Triton's timestamps for one request
 *   threads.c    the GIL on Triton's threads, waiting, batched wake-ups
 *   graveyard.c  deleting requests and responses late
 *   cuda.c       the CUDA runtime, DeviceArray, GPU inputs' holds, CUDA IPC
 *   convert.c    dtype mapping, errors
 *
 * Who calls whom among the files of a call's life (-> : calls or refers to; convert.c,
 * at the bottom, is used by most; module.c, at the top, refers to every py_*):
 *
 *   many.c    -> submit.c, cancel.c, outputs.c, calls.c, threads.c, graveyard.c
 *   backend.c -> modes.c, complete.c, queues.c, fast_batch.c, batch_io.c, threads.c, cuda.c
 *   fast_batch.c -> batch_io.c
 *   modes.c   -> complete.c, streams.c, batch_io.c, threads.c
 *   kserve.c  -> kserve_pb.c, kserve_json.c, kserve_json_write.c, complete.c, queues.c, servers.c,
 *                calls.c, cuda.c, graveyard.c
 *   kserve_json.c -> kserve_pb.c, numtext.cc
 *   kserve_json_write.c -> kserve_pb.c, numtext.cc, cuda.c
 *   submit.c  -> complete.c, cancel.c, queues.c, servers.c, outputs.c, calls.c, trace.c,
 *                threads.c, graveyard.c, inputs.c
 *   complete.c -> streams.c, queues.c, servers.c, outputs.c, calls.c, trace.c, threads.c,
 *                graveyard.c
 *   streams.c -> cancel.c, outputs.c, calls.c, threads.c, graveyard.c
 *   cancel.c  -> queues.c, servers.c, calls.c
 *   queues.c  -> servers.c, calls.c, trace.c, threads.c, graveyard.c
 *   servers.c -> calls.c
 *   outputs.c -> memory.c, calls.c, cuda.c
 *   memory.c  -> calls.c, cuda.c
 *   calls.c   -> threads.c, graveyard.c
 *   trace.c   -> threads.c
 *   threads.c -> graveyard.c
 *
 * A lower file reaches a higher one only through the hooks a call carries
 * (Call.ops: e.g. calls.c's call_wake_caller runs the kind's wake, which
 * complete.c or streams.c registered). */
#ifndef EMBEDTRITON_NATIVE_H
#define EMBEDTRITON_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define NPY_TARGET_VERSION NPY_1_22_API_VERSION
/* One numpy API table for all the files, filled by module.c's import_array(). */
#define PY_ARRAY_UNIQUE_SYMBOL embedtriton_native_ARRAY_API
#ifndef NATIVE_IMPORTS_ARRAY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dlpack.h"
#include "triton_api.h"

/* The TRITONBACKEND_* entry points Triton looks up (listed in exports.map too). */
#define EXPORT __attribute__((visibility("default")))
#define MAX_DIMS 32
#define CONTROL_PREFIX "_embedtriton_"
#define RELEASE_RESCHEDULE 2 /* TRITONSERVER_REQUEST_RELEASE_RESCHEDULE */

/* ---- module.c: the Triton API and the Python hooks ---------------------- */

extern et_api_t api;
extern int api_loaded;
extern TRITONSERVER_ResponseAllocator* allocator;

/* Hooks installed from Python by set_hooks(). */
extern PyObject* g_bindings;     /* dict: model directory -> Binding */
extern PyObject* g_request_type; /* embedtriton.backend.request.Request */
extern PyObject* g_make_error;   /* (code, message) -> TritonError */
extern PyObject* g_decode_bytes; /* (bytes, shape) -> object array */
extern PyObject* g_encode_bytes; /* array -> bytes (Triton BYTES) */
extern PyObject* g_complete;     /* our own _complete, for asyncio */
extern PyObject* g_request_done; /* (request key) -> None: close its generator */
/* Interned attribute and method names. */
extern PyObject *s_call_soon_threadsafe, *s_parameters, *s_execute, *s_max_batch_size,
    *s_output_specs, *s_name, *s_done, *s_set_result, *s_set_exception;

static inline uint64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A spin-wait's pause: x86's PAUSE, Arm's YIELD (Grace machines are aarch64), nothing elsewhere. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}

/* ---- threads.c: the GIL, waiting, batched wake-ups ---------------------- */

/* A waiting caller's state (Call.done). */
enum { WAIT_PENDING = 0, WAIT_DONE = 1, WAIT_SLEEPING = 2 };
/* A main thread waiting for Triton wakes this often to run signal handlers. */
#define SIGNAL_CHECK_NS 50000000ull

extern __thread int t_gil_depth; /* > 0 while gil_enter() holds the GIL on this thread */
extern uint64_t spin_ns;         /* EMBEDTRITON_SPIN_US overrides */
extern atomic_int in_flight;     /* calls handed to Triton, not yet complete */
extern uint64_t linger_ns;       /* EMBEDTRITON_LINGER_US overrides */
extern unsigned long main_thread_ident;
/* Inside one execute: the sync callers to wake once it lets go of the GIL. */
extern __thread atomic_int** t_wake;
extern __thread size_t t_wake_len, t_wake_cap;
extern __thread int t_in_execute;
extern __thread int t_model_thread;
extern __thread const char* t_model_name; /* the model whose sync callable this thread runs */
TRITONSERVER_Error* hand_over(TRITONSERVER_Server* server, TRITONSERVER_InferenceRequest* req,
                              TRITONSERVER_InferenceTrace* trace);
PyObject* py_finish_batch(PyObject* self, PyObject* args); /* (backend.c) */

int gil_enter(void);
void gil_leave(int entered);
void wait_signal(atomic_int* state);
int wait_for(atomic_int* state, int spin, uint64_t timeout_ns);
int on_main_thread(void);
int wait_interruptible(atomic_int* state);
int wait_released(atomic_int* state, PyThreadState* ts);
void flush_wakes(void);
void linger(int with_batcher);
PyObject* py_linger_stats(PyObject* self, PyObject* unused);
PyObject* py_response_stats(PyObject* self, PyObject* unused);

/* ---- convert.c: dtypes and errors --------------------------------------- */

const char* dtype_name(int t);
const char* numpy_dtype_name(int t);
TRITONSERVER_DataType triton_dtype_of(PyArrayObject* a);
int numpy_typenum_of(TRITONSERVER_DataType t);
PyObject* name_str(const char* name);
int dict_set_name(PyObject* d, const char* name, PyObject* value);
uintptr_t dtype_size(TRITONSERVER_DataType t);
PyObject* raise_triton(int code, const char* message);
PyObject* raise_from(TRITONSERVER_Error* err, int owned);
PyObject* shown(PyObject* value);
PyObject* refuse(const char* option, const char* takes, PyObject* value, const char* hint);
const char* text_of(PyObject* value);
TRITONSERVER_Error* new_error(int code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
TRITONSERVER_Error* error_from_python(const char* context);

/* ---- memory.c: output buffers, shared-memory mappings ------------------- */

/* An output buffer's ticket (its buffer_userp), see the response allocator. */
typedef struct {
  void* block;
  int taken;
  int gpu; /* block is device memory (cudaFree), for a call with an output device */
} Ticket;

/* An output the caller asked to receive in its own writable buffer (e.g. a
 * client's shared-memory region): Triton's output buffer is that memory. */
typedef struct Preset {
  const char* name; /* the UTF-8 of a key of the caller's dict (kept alive by owner) */
  PyObject* owner;  /* the caller's outputs dict */
  PyObject* target; /* the buffer object */
  Py_buffer view;   /* host memory; or, for a DeviceArray target, view.buf and view.len are
                       its device memory (no buffer was taken) */
  int gpu;          /* the target is device memory (a DeviceArray), on device */
  int device;
} Preset;

extern uintptr_t page_size;
extern PyTypeObject MappingType;

TRITONSERVER_Error* response_alloc_fn(TRITONSERVER_ResponseAllocator* a, const char* tensor_name,
                                      size_t byte_size, TRITONSERVER_MemoryType memory_type,
                                      int64_t memory_type_id, void* userp, void** buffer,
                                      void** buffer_userp,
                                      TRITONSERVER_MemoryType* actual_memory_type,
                                      int64_t* actual_memory_type_id);
TRITONSERVER_Error* response_release_fn(TRITONSERVER_ResponseAllocator* a, void* buffer,
                                        void* buffer_userp, size_t byte_size,
                                        TRITONSERVER_MemoryType memory_type,
                                        int64_t memory_type_id);
void free_block_capsule(PyObject* capsule);
PyObject* py_map_shared(PyObject* self, PyObject* args);

/* ---- cuda.c: GPU memory ------------------------------------------------ */

extern PyTypeObject DeviceArrayType, HoldType;

/* An array in GPU memory that a callable returned, read through DLPack. */
typedef struct {
  PyObject* holder;         /* a DeviceArray, or NULL */
  DLManagedTensor* managed; /* or the consumed DLPack tensor */
  const void* data;
  size_t nbytes;
  int ndim;
  int64_t shape[MAX_DIMS];
  TRITONSERVER_DataType dtype;
  int device;
} GpuValue;

int cuda_ready(void);
const char* cuda_copy(void* dst, const void* src, size_t n);
const char* cuda_alloc(void** ptr, size_t n, int device);
void cuda_free(void* ptr);
TRITONSERVER_DataType dl_dtype(DLDataType t);
int is_device_array(PyObject* o);
PyObject* device_array_new(void* ptr, size_t nbytes, int ndim, const int64_t* shape,
                           TRITONSERVER_DataType dtype, int device, int owns, PyObject* owner);
PyObject* device_array_alloc(size_t nbytes, int ndim, const int64_t* shape,
                             TRITONSERVER_DataType dtype, int device);
void* device_array_ptr(PyObject* o);
size_t device_array_nbytes(PyObject* o);
int device_array_device(PyObject* o);
PyObject* hold_new(TRITONBACKEND_Request* request);
int is_hold(PyObject* o);
TRITONBACKEND_Request* hold_drop(PyObject* o);
int gpu_value(PyObject* value, GpuValue* g, const char* name, TRITONSERVER_Error** err);
void gpu_value_done(GpuValue* g);
PyObject* py_cuda_init(PyObject* self, PyObject* arg);
PyObject* py_device_array(PyObject* self, PyObject* args);
PyObject* py_cuda_ipc_open(PyObject* self, PyObject* args);
PyObject* py_cuda_ipc_close(PyObject* self, PyObject* args);
PyObject* py_cuda_allocation_size(PyObject* self, PyObject* args);

/* ---- calls.c: the Call, its references and its end ---------------------- */

typedef struct Queued {
  struct Queued* next;
  TRITONSERVER_InferenceResponse* response;
} Queued;

struct Call;
/* How a call was submitted (call_set_kind, complete.c: the only place that tells them apart). */
typedef enum { CALL_WAIT, CALL_LOOP, CALL_TARGET, CALL_STREAM, CALL_NATIVE } CallKind;

/* A kind's stage hooks, registered by call_set_kind (NULL: nothing to do at that stage). */
typedef struct CallOps {
  /* Triton's response callback (any thread, without the GIL or inside an execute) */
  void (*response)(struct Call* c, TRITONSERVER_InferenceResponse* response, uint32_t flags);
  /* Triton's final response completed the call (claimed): tell its caller */
  void (*finish)(struct Call* c);
  /* With the GIL: the call was completed here, not by Triton (claimed): tell its caller */
  void (*wake)(struct Call* c);
  /* With the GIL: Triton released the request */
  void (*released)(struct Call* c, TRITONSERVER_InferenceRequest* request);
  /* Under held_lock: the request is flagged cancelled */
  void (*cancelled)(struct Call* c);
  /* With the GIL: the call is freed */
  void (*destroy)(struct Call* c);
  /* Its completion needs no Python (kserve.c): Triton's release and the last reference take no
   * GIL; the call is freed (destroy) by the next call_free_later, with the GIL. */
  int free_later;
} CallOps;

#define KEPT_INLINE 256 /* bytes in a Call for its kept outputs (two small outputs fit) */

/* An input read under the GIL and added to its request without it (submit_many's hand-over,
 * many.c): a C-contiguous numpy array, held by its call with its name. */
typedef struct PendingInput {
  const char* name;
  TRITONSERVER_DataType dtype;
  uint32_t ndim;
  const int64_t* shape; /* the array's own dims */
  const void* data;
  size_t nbytes;
} PendingInput;
#define PENDING_INLINE 4

typedef struct Call {
  struct Call *prev, *next; /* the held list (Triton holds the request), for stop() */
  TRITONSERVER_Server* server;
  /* The caller's side, Triton's release of the request and Triton's final
   * response each hold one: a caller that was let go early (stop's deadline,
   * Ctrl-C) leaves the call to Triton's late callbacks. */
  atomic_int refs;
  atomic_int completed; /* one-shot: the caller was completed (by Triton or by stop) */
  int finalized;        /* Triton delivered the final response */
  CallKind kind;
  const CallOps* ops; /* its kind's hooks */
  int is_async;       /* (submit.c) the caller does not wait: CALL_LOOP or CALL_TARGET */
  /* streams (several responses): a queue the consumer pops, under mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct Queued* head;
  struct Queued* tail;
  int finished;                           /* the final flag arrived */
  int closed;                             /* the consumer let go */
  TRITONSERVER_InferenceRequest* request; /* for cancellation, while not released */
  int aborted;                            /* completed by stop(), not by Triton */
  int released;                           /* Triton released the request (under held_lock) */
  atomic_int done;                        /* sync calls: WAIT_* */
  struct Group* group;                    /* a call of submit_many() (many.c) */
  Py_ssize_t group_index;
  _Atomic(TRITONSERVER_InferenceResponse*) response;
  _Atomic(struct Kept*) kept; /* or its outputs, read from it where it was sent (outputs.c) */
  _Alignas(16) char kept_inline[KEPT_INLINE]; /* kept's block when it fits (no malloc) */
  PyObject* loop;   /* CALL_LOOP: its event loop (a stream's consumer's, if any) */
  PyObject* future; /* CALL_LOOP: its future; CALL_TARGET: its target; a stream: its wake-up */
  Py_ssize_t n_keep;
  PyObject** keep; /* input arrays (and BYTES buffers) Triton reads from */
  PyObject* keep_inline[8];
  Py_ssize_t n_presets;
  struct Preset* presets;    /* outputs to write into the caller's buffers */
  struct TraceRecord* trace; /* when traced: Triton's timestamps for this request */
  int out_device;            /* outputs in this GPU's memory; -1: host memory */
  /* queues.c: a call to a model with queue policies or priorities */
  _Atomic(struct Gate*) gate; /* while the gate holds it, or let it through unstarted */
  int gate_state;             /* under the gate's lock */
  int gate_level;             /* its priority level's index */
  uint64_t gate_since;        /* when the gate took it (CLOCK_MONOTONIC ns) */
  uint64_t gate_deadline;     /* its queue timeout (CLOCK_MONOTONIC ns); 0: none */
  struct Call* gate_next;     /* in the gate's queue */
  TRITONSERVER_InferenceTrace* gate_trace; /* held: its trace, not handed to Triton yet */
  TRITONSERVER_Error* gate_error;          /* the error the gate completed it with (owned) */
  struct Call* later_next;                 /* (free_later kinds) waiting for call_free_later */
  int deferred; /* built by submit_locked for submit_many, which hands it to Triton (many.c) */
  int n_pending;
  PendingInput* pending; /* a deferred call's inputs, added by that hand-over */
  PendingInput pending_inline[PENDING_INLINE];
} Call;

/* The calls of one submit_many(): their caller waits for several at once. */
typedef struct Group {
  atomic_int left;    /* calls handed to Triton and not completed */
  atomic_int wake_at; /* wake the caller once left is at most this */
  atomic_int state;   /* WAIT_* */
  atomic_int busy;    /* completions touching the group: it lives on its caller's stack */
} Group;

void call_unref(Call* c);
const Preset* call_preset(struct Call* c, const char* name);
void call_drop_inputs(Call* c);
void call_free(Call* c);
int call_claim(Call* c);
void call_wake_caller(Call* c);
void kept_free(Call* c, struct Kept* k);
void call_free_later(void);

/* ---- outputs.c: a finished call's outputs ------------------------------- */

PyObject* call_collect(Call* c);
PyObject* collect_response(TRITONSERVER_InferenceResponse* resp, Call* c);
typedef struct {
  const char* name;
  const int64_t* shape;
  const void* data; /* in the block (copied), or the output's own buffer (owned) */
  void* owned;      /* an output buffer taken over: freed with the block unless handed on */
  size_t size;
  TRITONSERVER_DataType dtype;
  uint32_t ndim;
} KeptOutput;

typedef struct Kept {
  uint32_t count;
  KeptOutput out[]; /* then the shapes, the names and the copied outputs */
} Kept;

Kept* keep_outputs(TRITONSERVER_InferenceResponse* resp, Call* c);

/* Set while our backend sends a response (send_final): its request or response factory, which
 * hold the model too, are still held (see keep_outputs). An ensemble's response that its last
 * step's send completes arrives then too: its own request is released only after it is sent
 * (EnsembleContext::FinishEnsemble), and an ensemble has no instance thread. */
extern __thread int t_sending;

/* ---- servers.c: open servers and the calls Triton holds ----------------- */

extern pthread_rwlock_t servers_lock;

int server_is_open(TRITONSERVER_Server* s);
void end_drain(TRITONSERVER_Server* server);
void held_add(Call* c);
void held_release(Call* c);
int held_cancel(Call* c, int (*take)(Call*));
long held_cancel_server(TRITONSERVER_Server* server, int (*take)(Call*), Call*** out,
                        size_t* n_out);
size_t held_claim_waiting(TRITONSERVER_Server* server, Call** out, size_t cap);
Call* held_find(TRITONSERVER_Server* server);
PyObject* py_pending(PyObject* self, PyObject* arg);
PyObject* py_open_server(PyObject* self, PyObject* arg);
PyObject* py_close_server(PyObject* self, PyObject* arg);

/* ---- cancel.c: cancelling and failing calls ----------------------------- */

void call_cancel(Call* c);
PyObject* py_cancel_all(PyObject* self, PyObject* arg);
PyObject* py_fail_pending(PyObject* self, PyObject* arg);
PyObject* py_abort_pending(PyObject* self, PyObject* arg);

/* ---- streams.c: several responses per call ------------------------------ */

extern const CallOps stream_ops;
PyObject* py_stream_next(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
int take_stream_closed(void* request);
PyObject* py_stream_close(PyObject* self, PyObject* capsule);

/* ---- complete.c: Triton's callbacks, the kinds, completion delivery ----- */

/* Inside one execute: completions per event loop (loop -> list of calls; None -> calls
 * with a target), handed on by flush_deferred once it is done. */
extern __thread PyObject* t_deferred;
void call_set_kind(Call* c, int stream, PyObject* loop, PyObject* target);
void call_set_ops(Call* c, const CallOps* ops);
void call_one_response(Call* c, TRITONSERVER_InferenceResponse* response, uint32_t flags);
void response_cb(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp);
void release_cb(TRITONSERVER_InferenceRequest* request, const uint32_t flags, void* userp);
void flush_deferred(void);
PyObject* py_complete(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

/* ---- submit.c, many.c: requests from Python ---------------------------- */

#define NOT_RUNNING "the server is not running; call start() or use 'with server:'"

/* What each request option takes, in the words of embedtriton/core/request.py (TAKES): a wrong
 * one is refused as "<option> must be <takes>, not <what it got>" (refuse). */
#define TAKES_PRIORITY "an int from 0 to 2**64-1 (1 is the highest level, 0 the model's default)"
#define TAKES_TIMEOUT_US "an int of microseconds from 0 to 2**64-1 (0: no timeout)"
#define TAKES_REQUEST_ID "a str"
#define TAKES_OUTPUTS "a list of output names (str)"
#define TAKES_OUTPUT "an output name (str)"
#define TAKES_OUTPUT_BUFFER "None or a writable, contiguous buffer"
#define TAKES_PARAMETERS \
  "a mapping of str names to str, int, float or bool values, such as {'k': 1}"
#define TAKES_PARAMETER "a str, a float, a bool or an int from -2**63 to 2**63-1"
#define TAKES_PARAMETER_NAME "a str"
#define TAKES_CORRELATION_ID "an int from 1 to 2**64-1 or a non-empty str"
/* (after a str that text_of refuses) */
#define NOT_TEXT ": a str must be UTF-8 text without NUL characters"
#define TEXT_HINT(value) (PyUnicode_Check(value) ? NOT_TEXT : "")

/* One request as submit() and submit_many() read it: where it goes (target_args) and the
 * fields of its InferRequest (embedtriton/core/request.py), read once by request_spec_read.
 * The common case costs nothing; other mappings and sequences are converted. Item checks
 * (input arrays, output names and buffers, parameter values, the correlation id) are made
 * as submit_locked hands them to Triton. */
typedef struct RequestSpec {
  TRITONSERVER_Server* server;
  const char* model; /* (the caller's str, borrowed) */
  long long version;
  PyObject* inputs;     /* a dict name -> array */
  PyObject* outputs;    /* None, a tuple of names or a dict name -> buffer */
  PyObject* request_id; /* None or a str that text_of takes */
  unsigned long long priority, timeout_us;
  PyObject* parameters; /* None or a dict */
  PyObject* sequence;   /* None or (correlation id, TRITONSERVER_RequestFlag bits) */
  PyObject* trace_sink; /* None or the callable that takes the request's timestamps */
  int out_device;       /* the GPU that outputs go to; -1: host memory */
} RequestSpec;

/* (server, model, version) from args[0..2]: -1 with UnavailableError when the server is
 * not running (a bad model or version leaves a Python error for the caller). */
int target_args(PyObject* const* args, RequestSpec* s);
/* The request's fields into s (references, which request_spec_clear drops; the target is
 * left as it is). -1 with an InvalidArgumentError "<option> must be <takes>, not ...",
 * and nothing held. */
int request_spec_read(PyObject* request, RequestSpec* s);
void request_spec_clear(RequestSpec* s);
int lock_open_server(TRITONSERVER_Server* server);

/* With servers_lock held (read), which it lets go of: one request to Triton. A call of a
 * group (submit_many) without a gate or batch rule is built, not handed over: *out, whose
 * gate_trace holds its trace until submit_many hands it over. */
PyObject* submit_locked(const RequestSpec* s, PyObject* loop, PyObject* future, int stream,
                        int release_gil, int cancellable, Group* group, Call** out);
/* With the GIL: Triton did not take c's request (err, deleted here): raises err, frees c. NULL. */
PyObject* submit_refused(Call* c, TRITONSERVER_Error* err, int handle_ref);
PyObject* py_submit_many(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

/* ---- kserve_pb.c: the KServe-v2 protobuf subset ------------------------- */

#define KS_MAX_TENSORS 64

/* A field of the received message (a slice of it, not a copy). */
typedef struct {
  const uint8_t* p;
  size_t n;
} Slice;

typedef struct {
  Slice name, datatype;
  int ndim;
  int64_t shape[MAX_DIMS];
} KsInput;

typedef struct {
  Slice model, version, id;
  int n_inputs, n_outputs, n_raw;
  KsInput inputs[KS_MAX_TENSORS];
  Slice outputs[KS_MAX_TENSORS];
  Slice raw[KS_MAX_TENSORS]; /* (those past the inputs are not used, as in the Python path) */
} KsRequest;

/* The error of an encoding that failed (code, text), as the Python path reports it. */
typedef struct {
  int code;
  const char* text;
} KsError;

/* One output of a Triton response, as TRITONSERVER_InferenceResponseOutput gives it. */
typedef struct {
  const char* name;
  TRITONSERVER_DataType dtype;
  const int64_t* shape;
  uint64_t ndim;
  const void* base;
  size_t size;
  TRITONSERVER_MemoryType mtype;
} KsTensor;

/* Output i of resp into t: 0, or -1 (Triton's error dropped). */
int ks_output(TRITONSERVER_InferenceResponse* resp, uint32_t i, KsTensor* t);

struct H2Reply;
/* Decode a ModelInferRequest into r: 0 for a plain request, -1 for anything else. */
int ks_decode(const uint8_t* data, size_t len, KsRequest* r);
/* The Python path's checks that r passes as it is: 0, or -1 where it would refuse or read it
 * another way. */
int ks_plain(const KsRequest* r);
int slice_eq(Slice a, Slice b);
/* A numeric datatype's Triton type, or INVALID (BYTES, BF16 and unknown names). */
TRITONSERVER_DataType numeric_type(Slice name);
/* The ModelInferResponse of resp, as a message of the _h2 reply interface (NULL, *e set). */
void* ks_encode(const struct H2Reply* h2, Slice model, Slice version, Slice id,
                TRITONSERVER_InferenceResponse* resp, KsError* e);
PyObject* py_kserve_decode(PyObject* self, PyObject* arg);

/* ---- kserve_json.c, kserve_json_write.c: the KServe-v2 JSON subset (HTTP/REST) ---- */

/* An inference request body decoded: r (its model and version are the URL's, set by the
 * caller), each requested output's binary_data, and the JSON inputs' values (converted into
 * `values`, which r's raw slices point into; the binary ones point into the body). */
typedef struct {
  KsRequest r;
  int8_t out_flag[KS_MAX_TENSORS];
  int binary_default;
  void* values;
} KjRequest;

/* What an answer needs of its request. */
typedef struct {
  Slice model, version, id;
  int binary_default, n_outputs;
  const Slice* outputs; /* the names asked for (n_outputs), bit k of out_bits: binary_data */
  uint64_t out_bits;
} KjAnswer;

/* Decode a body (header_len >= 0: the binary tensor data extension's JSON length): 0 for a plain
 * request (kj_clear() frees its values), -1 for anything else (nothing left allocated). */
int kj_decode(const uint8_t* body, size_t len, int64_t header_len, KjRequest* q);
void kj_clear(KjRequest* q);
/* The answer of resp (malloc'd, *len bytes; *header_len: the JSON's length when binary outputs
 * follow it, else 0), or NULL with *e set. */
char* kj_encode(const KjAnswer* a, TRITONSERVER_InferenceResponse* resp, size_t* len,
                size_t* header_len, KsError* e);
/* A double as Python's repr writes it (json.dumps' NaN, Infinity), at most 25 bytes at p: the
 * end. */
char* kj_double_text(char* p, double v);
/* {"error": message} (malloc'd), NULL when out of memory. */
char* kj_error(const char* message, size_t* len);
PyObject* py_kserve_json_decode(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* py_kserve_json_double(PyObject* self, PyObject* arg);

/* ---- kserve.c: unary gRPC ModelInfer in C ----------------------------- */

PyObject* py_grpc_model_infer(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* py_grpc_stats(PyObject* self, PyObject* unused);
PyObject* py_http_stats(PyObject* self, PyObject* unused);
PyObject* http_fast_capsule(void);
PyObject* py_grpc_release(PyObject* self, PyObject* unused);

/* ---- graveyard.c: late deletes ------------------------------------------ */

void bury(TRITONSERVER_InferenceRequest* request, TRITONSERVER_InferenceResponse* response);
void delete_sent(TRITONSERVER_InferenceResponse* response);
/* Graves deleted per call (a call buries two): by a sync caller as it waits
 * (without the GIL), by an async one as it submits (with the GIL, but deleting
 * a few dozen at once costs less per grave than four at a time). */
#define GRAVE_STEP_WAITING 4
#define GRAVE_STEP_ASYNC 32
long delete_buried(long limit);
PyObject* py_delete_released(PyObject* self, PyObject* unused);

/* ---- trace.c: timestamps ------------------------------------------------ */

struct TraceRecord;
void trace_deliver(struct TraceRecord* r);
void trace_abandon(TRITONSERVER_InferenceTrace* trace, struct TraceRecord* r);
TRITONSERVER_InferenceTrace* trace_new(PyObject* sink, struct TraceRecord** record);

/* ---- inputs.c, submit.c: requests from Python --------------------------- */

PyObject* add_input(TRITONSERVER_InferenceRequest* req, PyObject* key, PyObject* value);
int pending_input(PyObject* key, PyObject* value, PendingInput* out);
TRITONSERVER_Error* add_pending(TRITONSERVER_InferenceRequest* req, const PendingInput* in, int n);
TRITONSERVER_Error* set_parameter(TRITONSERVER_InferenceRequest* req, PyObject* key,
                                  PyObject* value);
PyObject* py_cancel(PyObject* self, PyObject* capsule);
PyObject* py_submit(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

/* ---- backend.c, batch_io.c, modes.c: the model side --------------------- */

typedef struct {
  char* name;
  PyObject* name_obj;
  TRITONSERVER_DataType dtype;
  int ndims;
  int64_t dims[MAX_DIMS];
  int gpu; /* Tensor(device="gpu"): ask Triton for GPU memory even for a host array */
} OutputSpec;

typedef struct {
  PyObject* binding;
  PyObject* execute;
  char* name;
  int64_t max_batch_size;
  int decoupled;
  int sequence;      /* sequence batcher: control inputs become Request attributes */
  int with_batcher;  /* Triton's dynamic or sequence batcher hands requests to the instances */
  PyObject* include; /* custom batching: binding._include(batch, candidate), or NULL */
  PyObject* iterate; /* iterative sequences: binding._iterate(step), or NULL */
  Py_ssize_t n_outputs;
  OutputSpec* outputs;
  PyObject* gpu_wrap; /* GPU inputs for the callable: DeviceArray -> cupy/torch; NULL: as is */
  char** gpu_inputs;  /* inputs declared Tensor(device="gpu") */
  Py_ssize_t n_gpu_inputs;
  /* Warm-up: the executions left before the model serves (binding.warmup_runs), and whether one
   * failed. Triton 2.51 crashes when a warm-up request fails, so a warm-up failure is recorded
   * (binding.warmup_error) and answered as a success; the server then fails the load itself. */
  atomic_int warmup_left;
  atomic_int warmup_failed;
  struct Gate* gate; /* queue policies and priorities (binding.queue_gate), or NULL */
  /* A plain @batch function that fast_batch.c calls itself (binding.fast_batch), or NULL: the
   * function, whether it takes parameters, runner.failed, split_outputs, and the parameters
   * that send a request's batch the general way (a span key, a deadline). */
  PyObject* fast_func;
  int fast_parameters;
  PyObject *fast_failed, *fast_split;
  char* fast_declines[2];
} ModelState;

/* The model whose warm-up this thread is running, or NULL (send_final records its errors). */
extern __thread ModelState* t_warmup;

PyObject* read_parameters(TRITONBACKEND_Request* request, TRITONSERVER_Error** err);
int input_wants_gpu(ModelState* ms, const char* name);
TRITONSERVER_Error* gather_input(TRITONBACKEND_Input* input, const char* name, uint32_t n_buffers,
                                 char* dst, uint64_t byte_size, int dst_gpu);
PyObject* host_view(const void* data, TRITONSERVER_DataType dtype, int typenum, int ndim,
                    npy_intp* dims);
PyObject* host_copy(TRITONBACKEND_Input* input, const char* name, uint32_t n_buffers, int typenum,
                    int ndim, npy_intp* dims, TRITONSERVER_Error** err);

/* fast_batch.c */
int fast_batch_init(ModelState* ms, PyObject* binding);
void fast_batch_free(ModelState* ms);
PyObject* fast_batch_run(ModelState* ms, TRITONBACKEND_Request** requests, uint32_t count,
                         PyObject** views, Py_ssize_t* n_views, uint64_t* sizes,
                         uint64_t* compute_start, TRITONSERVER_Error** err, int* declined);
PyObject* build_request(TRITONBACKEND_Request* request, ModelState* ms, int device,
                        PyObject** views, Py_ssize_t* n_views, uint64_t* batch_size,
                        TRITONSERVER_Error** err);
TRITONSERVER_Error* fill_response(ModelState* ms, TRITONBACKEND_Request* request,
                                  TRITONBACKEND_Response* response, PyObject* out,
                                  uint64_t batch_size, size_t index);
TRITONBACKEND_Response* respond(ModelState* ms, TRITONBACKEND_Request* request, PyObject* out,
                                uint64_t batch_size, size_t index, TRITONSERVER_Error** error);
void send_final(TRITONBACKEND_Response* response, TRITONSERVER_Error* err);
void detach_view(PyArrayObject* arr);
void run_decoupled(ModelState* ms, TRITONBACKEND_Request** requests, uint32_t count,
                   PyObject* steps, uint64_t* sizes, TRITONSERVER_Error** errors);
void run_iterative(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                   TRITONBACKEND_Request** requests, uint32_t count, uint64_t exec_start);

/* ---- queues.c: queue policies and priorities ---------------------------- */

typedef struct Gate Gate;
/* gate_admit(): pass the call to Triton now / the gate holds it / (-1) refused */
enum { GATE_GO = 1, GATE_WAITS = 2 };
Gate* gate_new(PyObject* spec, TRITONSERVER_Server* server, const char* model, long long version,
               int release_gil);
void gate_close(Gate* g);
void gate_instances(Gate* g, int delta);
void gate_begin(Gate* g, TRITONBACKEND_Request** requests, uint32_t count);
void gate_end(void);
Gate* gate_current(void);
Gate* gate_find(TRITONSERVER_Server* server, const char* model, long long version);
void gate_release_ref(Gate* g);
int gate_admit(Gate* g, Call* c, TRITONSERVER_InferenceTrace* trace, uint64_t priority,
               uint64_t timeout_us, const char* request_id, TRITONSERVER_Error** err);
void gate_forget(Call* c);
int gate_take(Call* c);
void gate_fail_cancelled(Call* c);
void gate_drop(Call* c);
PyObject* py_gate_stats(PyObject* self, PyObject* arg);

#endif
