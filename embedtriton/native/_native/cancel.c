/* Cancelling and failing calls: a caller's cancel (a closed stream, a client that
 * left, Ctrl-C), and stop()'s cancel_all, fail_pending and abort_pending. A call
 * still waiting in a queue policy's gate is taken out of it and failed there
 * (queues.c); one that Triton holds is flagged (servers.c); one completed here
 * reaches its caller as its kind registered (call_wake_caller). */
#include "cancel.h"

#include "calls.h"
#include "queues.h"
#include "servers.h"

void call_cancel(Call* c)
{
  if (held_cancel(c, gate_take)) gate_fail_cancelled(c);
}

/* With the GIL: complete a call that Triton did not complete (claimed by the
 * caller of this): its caller gets an UnavailableError. */
static void call_abort(Call* c)
{
  c->aborted = 1;
  call_wake_caller(c);
}

static TRITONSERVER_Server* server_arg(PyObject* arg)
{
  return (TRITONSERVER_Server*)PyLong_AsVoidPtr(arg);
}

/* cancel_all(server): mark every request Triton holds for the server
 * cancelled (queued ones are dropped by Triton's scheduler; a running
 * decoupled model stops at its next step). Returns the count. */
PyObject* py_cancel_all(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  Call** taken; /* calls waiting in a gate (queues.c): failed once the lock is let go */
  size_t n_taken;
  long n = held_cancel_server(server, gate_take, &taken, &n_taken);
  for (size_t i = 0; i < n_taken; i++) {
    gate_fail_cancelled(taken[i]);
    call_unref(taken[i]);
  }
  free(taken);
  return PyLong_FromLong(n);
}

/* fail_pending(server): stop()'s deadline passed: every call of the server
 * that Triton has not completed fails now (UnavailableError); what Triton
 * still runs finishes on its own and its late responses are dropped. A
 * claimed call stays alive: its caller's reference is only dropped once it
 * has been told. Returns the count. */
PyObject* py_fail_pending(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  Py_BEGIN_ALLOW_THREADS
  end_drain(server); /* no new model-to-model calls: they would not be failed here */
  Py_END_ALLOW_THREADS
  long n = 0;
  Call* batch[256];
  size_t got;
  while ((got = held_claim_waiting(server, batch, 256)) > 0) {
    for (size_t i = 0; i < got; i++) call_abort(batch[i]);
    n += (long)got;
  }
  return PyLong_FromLong(n);
}

/* abort_pending(server): after the server is deleted, no callback will come:
 * fail what is left and drop Triton's references. Returns the count. */
PyObject* py_abort_pending(PyObject* self, PyObject* arg)
{
  (void)self;
  TRITONSERVER_Server* server = server_arg(arg);
  if (PyErr_Occurred()) return NULL;
  long n = 0;
  Call* found;
  while ((found = held_find(server)) != NULL) {
    n++;
    gate_drop(found); /* (never handed to Triton: only its gate knew it) */
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
