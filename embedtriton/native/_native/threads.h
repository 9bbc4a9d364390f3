/* threads.c: the GIL on Triton's threads, waiting, batched wake-ups, and the one hand-over of
 * requests to Triton. */
#ifndef EMBEDTRITON_THREADS_H
#define EMBEDTRITON_THREADS_H

#include "common.h"

/* A waiting caller's state (Call.done). */
enum { WAIT_PENDING = 0, WAIT_DONE = 1, WAIT_SLEEPING = 2 };
/* A main thread waiting for Triton wakes this often to run signal handlers. */
#define SIGNAL_CHECK_NS 50000000ull

extern __thread int t_gil_depth; /* > 0 while gil_enter() holds the GIL on this thread */
extern uint64_t spin_ns;         /* EMBEDTRITON_SPIN_US overrides */
extern atomic_int in_flight;     /* calls handed to Triton, not yet complete */
extern uint64_t linger_ns;       /* EMBEDTRITON_LINGER_US overrides */
extern unsigned long main_thread_ident;
/* Inside one execute: the sync callers to wake once it lets go of the GIL. */
extern __thread atomic_int** t_wake;
extern __thread size_t t_wake_len, t_wake_cap;
extern __thread const char* t_model_name; /* the model whose sync callable this thread runs */
TRITONSERVER_Error* hand_over(TRITONSERVER_Server* server, TRITONSERVER_InferenceRequest* req,
                              TRITONSERVER_InferenceTrace* trace);

int gil_enter(void);
void gil_leave(int entered);
void wait_signal(atomic_int* state);
int wait_for(atomic_int* state, int spin, uint64_t timeout_ns);
int on_main_thread(void);
int wait_interruptible(atomic_int* state);
int wait_released(atomic_int* state, PyThreadState* ts);
void flush_wakes(void);
void linger(int with_batcher);
PyObject* py_linger_stats(PyObject* self, PyObject* unused);

#endif
