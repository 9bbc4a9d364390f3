/* outputs.c: a finished call's outputs as arrays, or kept where its response was sent. */
#ifndef EMBEDTRITON_OUTPUTS_H
#define EMBEDTRITON_OUTPUTS_H

#include "calls.h"

PyObject* call_collect(Call* c);
PyObject* collect_response(TRITONSERVER_InferenceResponse* resp, Call* c);
Kept* keep_outputs(TRITONSERVER_InferenceResponse* resp, Call* c);

/* Set while our backend sends a response (send_final): its request or response factory, which
 * hold the model too, are still held (see keep_outputs). An ensemble's response that its last
 * step's send completes arrives then too: its own request is released only after it is sent
 * (EnsembleContext::FinishEnsemble), and an ensemble has no instance thread. */
extern __thread int t_sending;

#endif
