/* servers.c: open servers, the calls Triton holds (the held list), Triton's cancel flag. */
#ifndef EMBEDTRITON_SERVERS_H
#define EMBEDTRITON_SERVERS_H

#include "calls.h"

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

#endif
