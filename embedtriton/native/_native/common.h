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
 * One file per stage of a call, in layers (a file calls only files below it;
 * tests/unit/test_native_layers.py checks that the calls between files form no
 * cycle):
 *
 *   module.c     the module: load(), set_hooks(), the function table
 *   submit.c     submit(), cancel(): a call is set up and handed to Triton
 *   request_spec.c  one request as Python gives it, read (RequestSpec)
 *   kserve_grpc.c  a unary gRPC ModelInfer decoded, submitted and answered in C
 *   kserve_http.c  an HTTP/REST inference decoded, submitted and answered in C
 *   kserve.c     what the two share: the call, its hand-over, the models' table
 *   kserve_pb.c  the KServe-v2 protobuf subset kserve_grpc.c reads and writes
 *   kserve_json.c the KServe-v2 JSON subset (and binary tensors) kserve_http.c reads
 *   kserve_json_write.c  ... and writes
 *   numtext.cc   numbers as JSON text (C++: std::from_chars, std::to_chars)
 *   many.c       submit_many(): a window of calls at a time
 *   backend.c    the backend: models, execute
 *   modes.c      batch rules, decoupled models, iterative sequences
 *   fast_batch.c a plain @batch function called straight from Triton's buffers
 *   batch_io.c   a batch's inputs to Python, its outputs to Triton
 *   inputs.c     inputs (numpy, DLPack) and parameters of a request, read from Python
 *   complete.c   how a call's end reaches its caller: Triton's callbacks; the call's
 *                kind (call_set_kind, the one place that tells kinds apart, registers
 *                the kind's CallOps); a sync caller woken, an asyncio future resolved
 *                (event loops' mailboxes), a target called with (outputs, error)
 *   streams.c    a stream's hooks (stream_ops): responses queued for their consumer
 *   cancel.c     a caller's cancel; stop()'s cancel_all, fail_pending, abort_pending
 *   queues.c     queue policies and priorities in front of Triton's dynamic batcher
 *   gates.c      a model's gate: made, closed, looked up (the registry), its statistics
 *   servers.c    open servers, the calls Triton holds (held list), Triton's cancel flag
 *   outputs.c    a finished call's outputs as arrays
 *   memory.c     response allocator, shared-memory mappings (SIGBUS guard)
 *   calls.c      the Call: references, the completion claim, its end (runs its CallOps)
 *   trace.c      Triton's timestamps for one request
 *   threads.c    the GIL on Triton's threads, waiting, batched wake-ups, the hand-over
 *   graveyard.c  deleting requests and responses late
 *   device_array.c  DeviceArray, GPU inputs' holds, GPU arrays a callable returned
 *   cuda.c       the CUDA runtime: copies, device allocations, CUDA IPC
 *   request.c    a request's inputs added to Triton from C descriptors (InputDesc): the one
 *                place every builder (inputs.c, many.c, kserve.c) ends
 *   convert.c    dtype mapping, errors
 *   api.c        the Triton API table, the response allocator and Python's hooks (filled by
 *                module.c)
 *
 * Who calls whom (-> : calls or refers to; convert.c and api.c, at the bottom, are used by
 * most; module.c, at the top, refers to every py_*):
 *
 *   many.c    -> submit.c, request_spec.c, request.c, cancel.c, outputs.c, calls.c, trace.c,
 *                threads.c, graveyard.c
 *   backend.c -> fast_batch.c, modes.c, batch_io.c, complete.c, queues.c, gates.c,
 *                device_array.c, threads.c
 *   fast_batch.c -> batch_io.c
 *   modes.c   -> batch_io.c, complete.c, streams.c, threads.c
 *   batch_io.c -> memory.c, device_array.c, threads.c, cuda.c
 *   kserve_grpc.c -> kserve.c, kserve_pb.c, complete.c, calls.c, graveyard.c
 *   kserve_http.c -> kserve.c, kserve_json.c, kserve_json_write.c, kserve_pb.c, complete.c,
 *                cancel.c, calls.c, graveyard.c
 *   kserve.c  -> kserve_pb.c, complete.c, gates.c, servers.c, calls.c, threads.c, graveyard.c,
 *                request.c
 *   kserve_json.c -> kserve_pb.c, numtext.cc
 *   kserve_json_write.c -> kserve_pb.c, cuda.c, numtext.cc
 *   kserve_pb.c -> cuda.c
 *   submit.c  -> request_spec.c, inputs.c, complete.c, streams.c, cancel.c, queues.c, gates.c,
 *                servers.c, outputs.c, device_array.c, calls.c, trace.c, threads.c, graveyard.c
 *   inputs.c  -> device_array.c, request.c
 *   complete.c -> queues.c, servers.c, outputs.c, calls.c, trace.c, threads.c, graveyard.c
 *   streams.c -> cancel.c, outputs.c, calls.c, threads.c, graveyard.c
 *   cancel.c  -> queues.c, servers.c, calls.c
 *   queues.c  -> gates.c, servers.c, calls.c, trace.c, threads.c, graveyard.c
 *   servers.c -> calls.c
 *   outputs.c -> memory.c, device_array.c, calls.c, cuda.c
 *   memory.c  -> calls.c, cuda.c
 *   device_array.c -> cuda.c
 *   calls.c   -> threads.c, graveyard.c
 *   trace.c   -> threads.c
 *   threads.c -> graveyard.c
 *
 * A lower file reaches a higher one only through the hooks a call carries
 * (Call.ops: e.g. calls.c's call_wake_caller runs the kind's wake, which
 * complete.c or streams.c registered).
 *
 * Headers: one per concept, private to the files beside it, each declaring what its owning
 * file(s) define for the others (everything else in them is static). A file includes the
 * headers it uses, only of files at or below it (test_native_layers.py checks both), its own
 * first; each header includes the ones its declarations need, common.h first of all (Python.h
 * must come before the system headers; numtext.h, plain C declarations, needs none):
 *
 *   common.h     (api.c, convert.c) Python, numpy, Triton's API table and Python's hooks;
 *                dtypes and errors
 *   graveyard.h  (graveyard.c)      late deletes
 *   threads.h    (threads.c)        the GIL, waiting, wake-ups, hand_over
 *   trace.h      (trace.c)          timestamps
 *   cuda.h       (cuda.c)           the CUDA runtime, CUDA IPC
 *   device_array.h (device_array.c) DeviceArray, holds, GPU values
 *   request.h    (request.c)        InputDesc, a request's inputs from C descriptors
 *   calls.h      (calls.c)          the Call (and what it holds), its references and end
 *   memory.h     (memory.c)         the response allocator, shared-memory mappings
 *   outputs.h    (outputs.c)        a finished call's outputs
 *   servers.h    (servers.c)        open servers, the held list
 *   queues.h     (queues.c)         queue policies and priorities: admission, letting through
 *   gates.h      (gates.c)          a model's gate and the registry of them
 *   cancel.h     (cancel.c)         cancelling and failing calls
 *   streams.h    (streams.c)        StreamCall (a stream's queue), stream_ops
 *   complete.h   (complete.c)       Triton's callbacks, the kinds, completion delivery
 *   inputs.h     (inputs.c)         a request's inputs and parameters; what the options take
 *   submit.h     (submit.c)         submit_locked and what it takes (Submission)
 *   request_spec.h (request_spec.c) RequestSpec: a request's target and options, read
 *   many.h       (many.c)           submit_many
 *   kserve_pb.h  (kserve_pb.c)      the KServe-v2 protobuf subset
 *   kserve_json.h (kserve_json.c, kserve_json_write.c) the KServe-v2 JSON subset
 *   numtext.h    (numtext.cc)       numbers as JSON text (C++: std::from_chars, std::to_chars)
 *   kserve.h     (kserve.c)         the C paths' call (KsCall), hand-over and models' table
 *   kserve_grpc.h (kserve_grpc.c)   gRPC ModelInfer in C
 *   kserve_http.h (kserve_http.c)   HTTP/REST inference in C
 *   batch_io.h   (batch_io.c)       a model's state; a batch's inputs and outputs
 *   fast_batch.h (fast_batch.c)     a plain @batch function from Triton's buffers
 *   modes.h      (modes.c)          decoupled models, iterative sequences
 *   backend.h    (backend.c)        the backend's Python functions
 */
#ifndef EMBEDTRITON_COMMON_H
#define EMBEDTRITON_COMMON_H

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

/* ---- api.c: the Triton API, Triton's response allocator, Python's hooks ---- */

/* Filled by module.c (load(), set_hooks(), the module's init) before any call. */
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

/* This thread: inside our backend's execute (backend.c sets it), an instance thread of a model
 * (mark_model_thread, module.c). */
extern __thread int t_in_execute;
extern __thread int t_model_thread;

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

#endif
