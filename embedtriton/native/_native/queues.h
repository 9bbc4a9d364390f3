/* queues.c: queue policies and priorities in front of Triton's dynamic batcher (a model's gate). */
#ifndef EMBEDTRITON_QUEUES_H
#define EMBEDTRITON_QUEUES_H

#include "calls.h"
#include "gates.h"

/* gate_admit(): pass the call to Triton now / the gate holds it / (-1) refused */
enum { GATE_GO = 1, GATE_WAITS = 2 };
void gate_instances(Gate* g, int delta);
void gate_begin(Gate* g, TRITONBACKEND_Request** requests, uint32_t count);
void gate_end(void);
Gate* gate_current(void);
int gate_admit(Gate* g, Call* c, TRITONSERVER_InferenceTrace* trace, uint64_t priority,
               uint64_t timeout_us, const char* request_id, TRITONSERVER_Error** err);
void gate_forget(Call* c);
int gate_take(Call* c);
void gate_fail_cancelled(Call* c);
void gate_drop(Call* c);

#endif
