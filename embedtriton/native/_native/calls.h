/* calls.c: the Call (what a call holds, from its submit to its end), its references, the
 * completion claim and its end (which runs its kind's CallOps). */
#ifndef EMBEDTRITON_CALLS_H
#define EMBEDTRITON_CALLS_H

#include "common.h"
#include "request.h"

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

/* A finished call's outputs, kept where its response was sent (outputs.c's keep_outputs): the
 * response itself is deleted then. */
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

#define KEPT_INLINE 256 /* bytes in a Call for its kept outputs (two small outputs fit) */

#define DEFERRED_INLINE 4 /* a deferred call's inputs without a malloc */

/* One call, from its submit to its end: what every kind has. A kind with fields of its own
 * allocates a larger struct that starts with its Call (StreamCall, streams.h; KsCall, kserve.h);
 * the fields of one stage are grouped by name: the gate's (gate_*, queues.c), submit_many's
 * (deferred, many.c), what completes the caller (to, by kind). */
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
  TRITONSERVER_InferenceRequest* request; /* for cancellation, while not released */
  int aborted;                            /* completed by stop(), not by Triton */
  int released;                           /* Triton released the request (under held_lock) */
  atomic_int done;                        /* sync calls: WAIT_* */
  struct Group* group;                    /* a call of submit_many() (many.c) */
  Py_ssize_t group_index;
  _Atomic(TRITONSERVER_InferenceResponse*) response;
  _Atomic(struct Kept*) kept; /* or its outputs, read from it where it was sent (outputs.c) */
  _Alignas(16) char kept_inline[KEPT_INLINE]; /* kept's block when it fits (no malloc) */
  PyObject* loop;     /* CALL_LOOP: its event loop (a stream's consumer's, if any) */
  union {             /* what completes the caller, by kind (call_set_kind); a reference */
    PyObject* future; /* CALL_LOOP: the asyncio future resolved with the outcome */
    PyObject* target; /* CALL_TARGET: called with (outputs, error) */
    PyObject* wake;   /* CALL_STREAM read on a loop: wakes its consumer (else NULL) */
    PyObject* any;    /* (whichever it is: let go of with the call) */
  } to;
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
  /* A call submit_locked built for submit_many, which hands it to Triton itself, without the GIL
   * (many.c's hand_over_window). */
  struct {
    int waiting; /* built, not handed over yet */
    int n_inputs;
    InputDesc* inputs; /* its numpy inputs (pending_input), added at the hand-over */
    InputDesc inputs_inline[DEFERRED_INLINE];
    TRITONSERVER_InferenceTrace* trace; /* its trace, until the hand-over */
    TRITONSERVER_Error* error;          /* the hand-over's error (owned), until read with the GIL */
  } deferred;
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

#endif
