/* submit.c: submit() and cancel(): one request from Python, set up and handed to Triton. */
#ifndef EMBEDTRITON_SUBMIT_H
#define EMBEDTRITON_SUBMIT_H

#include "calls.h"
#include "request_spec.h"

int lock_open_server(TRITONSERVER_Server* server);

/* How a request is submitted: its caller's side of the call. */
typedef struct Submission {
  PyObject* loop;   /* an asyncio caller's event loop, or None */
  PyObject* future; /* its future, a target, or a stream's wake-up; or None */
  int stream;       /* several responses, for a consumer */
  int release_gil;  /* a batch rule: the GIL is let go of for the hand-over */
  int cancellable;  /* an asynchronous caller gets a cancel handle */
  Group* group;     /* a call of submit_many, or NULL */
} Submission;

/* With servers_lock held (read), which it lets go of: one request to Triton. A call of a
 * group (submit_many) without a gate or batch rule is built, not handed over: *out, whose
 * gate_trace holds its trace until submit_many hands it over. */
PyObject* submit_locked(const RequestSpec* s, const Submission* how, Call** out);
/* With the GIL: Triton did not take c's request (err, deleted here): raises err, frees c. NULL. */
PyObject* submit_refused(Call* c, TRITONSERVER_Error* err, int handle_ref);
PyObject* py_cancel(PyObject* self, PyObject* capsule);
PyObject* py_submit(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#endif
