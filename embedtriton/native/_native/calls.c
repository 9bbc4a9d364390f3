/* The Call: its references, its one-shot completion claim and its end. What
 * happens to a call at each stage lives elsewhere (see common.h): this file
 * only runs the stage hooks its kind registered (CallOps, complete.c). */
#include "calls.h"

#include "graveyard.h"
#include "threads.h"

/* Any thread: c's kept outputs (collected or not), with the output buffers they still own. */
void kept_free(Call* c, Kept* k)
{
  for (uint32_t i = 0; i < k->count; i++) free(k->out[i].owned);
  if (k != (Kept*)c->kept_inline) free(k);
}

/* Let go of what the call's response left: the response itself (buried, see bury()) or its
 * kept outputs. */
static void drop_outcome(Call* c)
{
  TRITONSERVER_InferenceResponse* response = atomic_exchange(&c->response, NULL);
  if (response != NULL) bury(NULL, response);
  struct Kept* kept = atomic_exchange(&c->kept, NULL);
  if (kept != NULL) kept_free(c, kept);
}

/* A call is freed when all three let go of it: the caller (after reading the
 * response and resolving its future), Triton's release of the request (when
 * Triton stops reading the input buffers) and Triton's final response. */
/* With the GIL. */
static void call_destroy(Call* c)
{
  drop_outcome(c); /* (one that arrived after its caller was let go) */
  if (c->ops != NULL && c->ops->destroy != NULL) c->ops->destroy(c);
  Py_CLEAR(c->loop);
  Py_CLEAR(c->to.any);
  if (c->gate_error != NULL) api.TRITONSERVER_ErrorDelete(c->gate_error);
  if (c->deferred.error != NULL) api.TRITONSERVER_ErrorDelete(c->deferred.error);
  if (c->keep != c->keep_inline) free(c->keep);
  if (c->deferred.inputs != c->deferred.inputs_inline) free(c->deferred.inputs);
  for (Py_ssize_t i = 0; i < c->n_presets; i++) {
    PyBuffer_Release(&c->presets[i].view);
    Py_DECREF(c->presets[i].target);
    Py_DECREF(c->presets[i].owner);
  }
  free(c->presets);
  free(c);
}

/* Calls of a free_later kind whose last reference went, for call_free_later. */
static _Atomic(Call*) later = NULL;

/* With the GIL: free the calls of free_later kinds that are done. */
void call_free_later(void)
{
  Call* c =
      atomic_load_explicit(&later, memory_order_relaxed) ? atomic_exchange(&later, NULL) : NULL;
  while (c != NULL) {
    Call* next = c->later_next;
    call_destroy(c);
    c = next;
  }
}

/* Drop one reference; the last one frees the call (taking the GIL if needed), or leaves it
 * to call_free_later for a free_later kind (its completion takes no GIL). */
void call_unref(Call* c)
{
  if (atomic_fetch_sub(&c->refs, 1) == 1) {
    if (c->ops != NULL && c->ops->free_later) {
      TRITONSERVER_InferenceResponse* response = atomic_exchange(&c->response, NULL);
      if (response != NULL) bury(NULL, response); /* not held back until call_free_later */
      c->later_next = atomic_load(&later);
      while (!atomic_compare_exchange_weak(&later, &c->later_next, c)) {
      }
      return;
    }
    int entered = gil_enter();
    call_destroy(c);
    gil_leave(entered);
  }
}

/* The caller's buffer for output `name`, or NULL. */
const Preset* call_preset(struct Call* c, const char* name)
{
  for (Py_ssize_t i = 0; i < c->n_presets; i++)
    if (strcmp(c->presets[i].name, name) == 0) return &c->presets[i];
  return NULL;
}

/* With the GIL: drop the input references Triton was reading from. */
void call_drop_inputs(Call* c)
{
  for (Py_ssize_t i = 0; i < c->n_keep; i++) Py_CLEAR(c->keep[i]);
  c->n_keep = 0;
}

/* With the GIL: the caller's side is done with the call. */
void call_free(Call* c)
{
  drop_outcome(c);
  Py_CLEAR(c->loop);
  Py_CLEAR(c->to.any);
  call_unref(c);
}

/* Claim the call's completion (once: Triton's final response, stop() or the
 * caller giving up race for it). Returns whether this caller won. */
int call_claim(Call* c)
{
  if (atomic_exchange(&c->completed, 1)) return 0;
  atomic_fetch_sub(&in_flight, 1);
  return 1;
}

/* With the GIL: tell the caller of a call completed here, not by Triton (claimed by the
 * caller of this: stop(), a queue policy's gate): its stream ends, its future is resolved,
 * its target called or its thread woken, as its kind registered (CallOps.wake). */
void call_wake_caller(Call* c)
{
  c->ops->wake(c);
}
