/* streams.c: a stream's hooks (stream_ops): responses queued for their consumer. */
#ifndef EMBEDTRITON_STREAMS_H
#define EMBEDTRITON_STREAMS_H

#include "calls.h"

typedef struct Queued {
  struct Queued* next;
  TRITONSERVER_InferenceResponse* response;
} Queued;

/* A stream's call (CALL_STREAM): the Call, then the responses queued for the consumer that pops
 * them (stream_next), under mu. */
typedef struct StreamCall {
  Call c; /* first: the Call is freed as a whole (calls.c) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  Queued* head;
  Queued* tail;
  int finished; /* the final flag arrived, or stop() ended it */
  int closed;   /* the consumer let go */
} StreamCall;

extern const CallOps stream_ops;
void stream_init(Call* c);
PyObject* py_stream_next(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
int take_stream_closed(void* request);
PyObject* py_stream_close(PyObject* self, PyObject* capsule);

#endif
