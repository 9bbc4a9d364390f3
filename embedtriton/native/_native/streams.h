/* streams.c: a stream's hooks (stream_ops): responses queued for their consumer. */
#ifndef EMBEDTRITON_STREAMS_H
#define EMBEDTRITON_STREAMS_H

#include "calls.h"

typedef struct Queued {
  struct Queued* next;
  TRITONSERVER_InferenceResponse* response;
  uint64_t bytes; /* its outputs' */
} Queued;

/* A stream's call (CALL_STREAM): the Call, then the responses queued for the consumer that pops
 * them (stream_next), under mu. */
typedef struct StreamCall {
  Call c; /* first: the Call is freed as a whole (calls.c) */
  pthread_mutex_t mu;
  pthread_cond_t cv;   /* a response arrived, or the stream ended */
  pthread_cond_t room; /* the consumer took responses, let go, or the stream ended */
  Queued* head;
  Queued* tail;
  size_t queued;  /* responses in the queue */
  uint64_t bytes; /* their outputs' bytes */
  int held;       /* a producer waits for room */
  int finished;   /* the final flag arrived, or stop() ended it */
  int closed;     /* the consumer let go */
} StreamCall;

/* A stream's queue is held to these (whichever comes first) on the threads that set
 * t_hold_back (a decoupled model's generators, modes.c): the response over the limit waits
 * there, the GIL let go, until the consumer has taken the queue down to half. Elsewhere (an
 * iterative model's shared iteration, Triton's own backends) responses queue as they come. */
#define STREAM_HOLD_RESPONSES 1024
#define STREAM_HOLD_BYTES ((uint64_t)16 << 20)
extern __thread int t_hold_back;

extern const CallOps stream_ops;
void stream_init(Call* c);
PyObject* py_stream_next(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
int take_stream_closed(void* request);
PyObject* py_stream_close(PyObject* self, PyObject* capsule);

#endif
