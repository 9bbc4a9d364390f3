/* complete.c: how a call's end reaches its caller: Triton's callbacks, the call's kind
 * (call_set_kind), a sync caller woken, an asyncio future resolved, a target called. */
#ifndef EMBEDTRITON_COMPLETE_H
#define EMBEDTRITON_COMPLETE_H

#include "calls.h"

/* Inside one execute: completions per event loop (loop -> list of calls; None -> calls
 * with a target), handed on by flush_deferred once it is done. */
extern __thread PyObject* t_deferred;
void call_set_kind(Call* c, int stream, PyObject* loop, PyObject* target);
void call_set_ops(Call* c, const CallOps* ops);
void call_one_response(Call* c, TRITONSERVER_InferenceResponse* response, uint32_t flags);
TRITONSERVER_Error* call_bind_request(Call* c);
void flush_deferred(void);
PyObject* py_complete(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#endif
