/* Queue policies and priorities of a bound model, in front of Triton's dynamic batcher.
 *
 * Why: Triton 2.51's dynamic batcher prefetches (forms the next batch while every instance is
 * busy) only for a queue without a policy or priority levels (PriorityQueue's
 * support_prefetching_, scheduler_utils.cc of Triton core r24.10). Without prefetching, it
 * hands a batch only to an instance already waiting for one (RateLimiter::PayloadSlotAvailable
 * with force_non_blocking, rate_limiter.cc): DynamicBatchScheduler::Enqueue wakes the batcher
 * only when an instance waits, and an instance that starts waiting (RateLimiter::DequeuePayload)
 * wakes nobody. A request that arrives while the instances are busy (a closed-loop client's next
 * request, sent as its response goes out) is then left until the next request or the batcher's
 * 500 ms timeout (BatcherThread's default_wait_microseconds, dynamic_batch_scheduler.cc): 0.5 s
 * idle gaps, and spurious "Request timeout expired" rejections after them.
 *
 * So Triton gets the model's config without its queue policies and priority levels (it
 * prefetches then) and the gate here does what Triton's PriorityQueue would have done: a request
 * goes through to Triton at once while an instance is free for it, and waits here otherwise.
 * Waiting requests are let through, in Triton's order, as instances free up: priority levels
 * first (1 is highest), within a level in arrival order, then those delayed by a timeout
 * (TimeoutAction DELAY). A full level refuses a request as Triton does (UNAVAILABLE "Exceeds
 * maximum queue size"), a request whose timeout (the policy's default, shortened by its own
 * timeout_us when the policy allows it) expires is failed as Triton fails it (UNAVAILABLE
 * "Request timeout expired") or delayed. An instance counts as free from the end of its
 * callable, so that the next batch is in Triton's hands while this one's responses go out.
 *
 * A gate belongs to a loaded model (gates.c: the backend creates it at
 * TRITONBACKEND_ModelInitialize and counts the instances); submit() finds it by server, name and
 * version. Calls it holds keep their Triton request (never handed over yet) and Triton's two
 * references; a held call that fails (timeout, cancel, Triton refusing it when let through) is
 * completed here with its error. */
#include "queues.h"

#include "calls.h"
#include "gates.h"
#include "graveyard.h"
#include "servers.h"
#include "threads.h"
#include "trace.h"

#include <errno.h>

enum { STATE_NONE = 0, STATE_HELD, STATE_PENDING }; /* a call's gate_state */

static __thread Gate* t_gate = NULL; /* the gate of the execute this thread runs */

static void timer_arm(uint64_t deadline);

/* ---- the model side (backend.c) ----------------------------------------- */

static void let_through(Gate* g);
static int room(Gate* g);

void gate_instances(Gate* g, int delta)
{
  pthread_mutex_lock(&g->mu);
  g->instances += delta;
  pthread_mutex_unlock(&g->mu);
  if (delta > 0) let_through(g);
}

/* Under g->mu: c (let through) leaves the unstarted ones. Returns whether it was there. */
static int pend_remove(Gate* g, Call* c)
{
  for (uint64_t i = 0; i < g->pending; i++)
    if (g->pend[i] == c) {
      g->pend[i] = g->pend[--g->pending];
      c->gate_state = STATE_NONE;
      return 1;
    }
  return 0;
}

/* Under g->mu: room for one more call let through. Returns -1 when out of memory. */
static int pend_reserve(Gate* g)
{
  if (g->pending < g->pend_cap) return 0;
  uint64_t cap = g->pend_cap ? 2 * g->pend_cap : 16;
  Call** grown = realloc(g->pend, cap * sizeof(Call*));
  if (grown == NULL) return -1;
  g->pend = grown, g->pend_cap = cap;
  return 0;
}

/* Under g->mu, after pend_reserve. */
static void pend_add(Gate* g, Call* c)
{
  g->pend[g->pending++] = c;
  c->gate_state = STATE_PENDING;
}

/* An execute of the model starts (on this thread) with these requests: the ones let through
 * have started, and one more instance is busy. */
void gate_begin(Gate* g, TRITONBACKEND_Request** requests, uint32_t count)
{
  uint32_t started = 0;
  pthread_mutex_lock(&g->mu);
  g->busy++;
  for (uint32_t i = 0; i < count && g->pending > 0; i++)
    for (uint64_t k = 0; k < g->pending; k++)
      if ((void*)g->pend[k]->request == (void*)requests[i]) {
        Call* c = g->pend[k];
        g->pend[k] = g->pend[--g->pending];
        c->gate_state = STATE_NONE;
        atomic_store(&c->gate, NULL);
        started++;
        break;
      }
  int more = g->held > 0 && room(g); /* (a batch larger than the gate's limit) */
  pthread_mutex_unlock(&g->mu);
  for (uint32_t i = 0; i < started; i++) gate_unref(g); /* (the model's reference remains) */
  t_gate = g;
  if (more) let_through(g);
}

/* The callable of this thread's execute is done (its responses are about to go out, or it
 * returned a coroutine): its instance is free, the next calls go through. Once per begin. */
void gate_end(void)
{
  Gate* g = t_gate;
  if (g == NULL) return;
  t_gate = NULL;
  pthread_mutex_lock(&g->mu);
  g->busy--;
  pthread_mutex_unlock(&g->mu);
  let_through(g);
}

/* The gate of this thread's execute, if the callable is still running. */
Gate* gate_current(void)
{
  return t_gate;
}

/* ---- the caller side (submit.c, calls.c, servers.c) --------------------- */

/* Under g->mu: whether an instance is free for one more request. */
static int room(Gate* g)
{
  uint64_t instances = g->instances > 0 ? (uint64_t)g->instances : 1;
  uint64_t busy = g->busy > 0 ? (uint64_t)g->busy : 0;
  return busy * g->limit + g->pending < instances * g->limit;
}

static void level_push(GateLevel* l, Call* c, int delayed)
{
  c->gate_next = NULL;
  Call** head = delayed ? &l->dhead : &l->head;
  Call** tail = delayed ? &l->dtail : &l->tail;
  if (*tail) (*tail)->gate_next = c;
  else *head = c;
  *tail = c;
}

/* Admit a call (its request built, Triton's references taken): GATE_GO (pass it to Triton now:
 * it is counted as let through), GATE_WAITS (the gate holds it, and trace) or -1 (refused: *err,
 * Triton's wording). */
int gate_admit(Gate* g, Call* c, TRITONSERVER_InferenceTrace* trace, uint64_t priority,
               uint64_t timeout_us, const char* request_id, TRITONSERVER_Error** err)
{
  int level = g->default_level;
  if (g->n_levels > 1 && priority >= 1 && priority <= (uint64_t)g->n_levels)
    level = (int)priority - 1; /* Triton: 0 or above priority_levels -> the default level */
  GatePolicy* p = &g->policies[level];
  GateLevel* l = &g->levels[level];
  pthread_mutex_lock(&g->mu);
  if (p->max_size != 0 && l->size >= p->max_size) {
    pthread_mutex_unlock(&g->mu);
    *err = new_error(TRITONSERVER_ERROR_UNAVAILABLE, "[request id: %s] Exceeds maximum queue size",
                     request_id && *request_id ? request_id : "<id_unknown>");
    return -1;
  }
  atomic_fetch_add(&g->refs, 1); /* the call's */
  atomic_store(&c->gate, g);
  if (g->held == 0 && room(g) && pend_reserve(g) == 0) {
    pend_add(g, c);
    pthread_mutex_unlock(&g->mu);
    return GATE_GO;
  }
  uint64_t timeout = p->timeout_us;
  if (p->allow_override && timeout_us != 0 && timeout_us < timeout) timeout = timeout_us;
  c->gate_since = now_ns();
  c->gate_deadline = timeout ? c->gate_since + timeout * 1000ull : 0;
  c->gate_level = level;
  c->gate_trace = trace;
  c->gate_state = STATE_HELD;
  level_push(l, c, 0);
  l->size++;
  g->held++;
  int reject = c->gate_deadline != 0 && !p->delay;
  uint64_t deadline = c->gate_deadline;
  pthread_mutex_unlock(&g->mu);
  if (reject) timer_arm(deadline);
  return GATE_WAITS;
}

/* A call let through was not taken by Triton (its error goes to the caller), or Triton released
 * it without running it (a cache hit, cancelled in its queue): it no longer counts. */
void gate_forget(Call* c)
{
  Gate* g = atomic_exchange(&c->gate, NULL);
  if (g == NULL) return;
  pthread_mutex_lock(&g->mu);
  int removed = c->gate_state == STATE_PENDING && pend_remove(g, c);
  pthread_mutex_unlock(&g->mu);
  if (removed) let_through(g);
  gate_unref(g);
}

/* Under g->mu: take a held call out of its level. */
static void level_remove(Gate* g, Call* c)
{
  GateLevel* l = &g->levels[c->gate_level];
  for (int delayed = 0; delayed < 2; delayed++) {
    Call** head = delayed ? &l->dhead : &l->head;
    Call** tail = delayed ? &l->dtail : &l->tail;
    Call* prev = NULL;
    for (Call* it = *head; it != NULL; prev = it, it = it->gate_next)
      if (it == c) {
        if (prev) prev->gate_next = c->gate_next;
        else *head = c->gate_next;
        if (*tail == c) *tail = prev;
        c->gate_next = NULL;
        l->size--;
        g->held--;
        c->gate_state = STATE_NONE;
        return;
      }
  }
}

/* A cancel (the caller went away, stop()): take c out of the gate if it holds it. Returns 1 if
 * so: the caller of this then fails it (gate_fail) with CANCELLED, outside its locks. */
int gate_take(Call* c)
{
  Gate* g = atomic_load(&c->gate);
  if (g == NULL) return 0;
  pthread_mutex_lock(&g->mu);
  int held = c->gate_state == STATE_HELD;
  if (held) {
    level_remove(g, c);
    g->cancelled++;
    g->cancelled_ns += now_ns() - c->gate_since;
  }
  pthread_mutex_unlock(&g->mu);
  return held;
}

/* With or without the GIL: complete a call the gate held (taken out of it) with err (owned),
 * as Triton's release and final response would have: the caller gets err. trace: the call's
 * trace if Triton never took it. */
static void complete_failed(Call* c, TRITONSERVER_Error* err, TRITONSERVER_InferenceTrace* trace)
{
  Gate* g = atomic_exchange(&c->gate, NULL);
  c->gate_state = STATE_NONE;
  held_release(c);
  int entered = gil_enter();
  c->gate_error = err;
  if (c->trace != NULL) {
    if (trace != NULL) trace_abandon(trace, c->trace);
    else trace_deliver(c->trace);
    c->trace = NULL;
  }
  if (call_claim(c)) call_wake_caller(c);
  c->finalized = 1;
  call_drop_inputs(c);
  bury(c->request, NULL);
  gil_leave(entered);
  call_unref(c); /* Triton's release */
  call_unref(c); /* Triton's final response */
  if (g != NULL) gate_unref(g);
}

/* A cancelled call taken out of the gate (gate_take): its caller gets CANCELLED. */
void gate_fail_cancelled(Call* c)
{
  TRITONSERVER_InferenceTrace* trace = c->gate_trace;
  c->gate_trace = NULL;
  Gate* g = atomic_load(&c->gate);
  complete_failed(
      c,
      new_error(TRITONSERVER_ERROR_CANCELLED, "the request was cancelled before model '%s' ran it",
                g != NULL ? g->model : "?"),
      trace);
}

/* After the server is gone (abort_pending): forget the gate's side of a call it still holds
 * (the caller of this drops Triton's references itself). */
void gate_drop(Call* c)
{
  if (!gate_take(c)) return;
  Gate* g = atomic_exchange(&c->gate, NULL);
  if (c->gate_trace != NULL) {
    trace_abandon(c->gate_trace, NULL);
    c->gate_trace = NULL;
  }
  if (g != NULL) gate_unref(g);
}

/* Fail a list of held calls (linked by gate_next, taken out of the gate) with "Request timeout
 * expired", as Triton's batcher fails a request whose queue timeout expired. */
static void fail_expired(Call* list)
{
  while (list != NULL) {
    Call* c = list;
    list = c->gate_next;
    c->gate_next = NULL;
    TRITONSERVER_InferenceTrace* trace = c->gate_trace;
    c->gate_trace = NULL;
    complete_failed(c, new_error(TRITONSERVER_ERROR_UNAVAILABLE, "Request timeout expired"), trace);
  }
}

/* Under g->mu: the next call to let through, in Triton's order; expired REJECT calls met on the
 * way go to *expired, expired DELAY calls behind the rest of their level. NULL when none. */
static Call* pop_next(Gate* g, uint64_t now, Call** expired)
{
  for (int i = 0; i < g->n_levels; i++) {
    GateLevel* l = &g->levels[i];
    while (l->head != NULL) {
      Call* c = l->head;
      l->head = c->gate_next;
      if (l->head == NULL) l->tail = NULL;
      c->gate_next = NULL;
      if (c->gate_deadline != 0 && now > c->gate_deadline) {
        c->gate_deadline = 0;
        if (g->policies[i].delay) {
          level_push(l, c, 1);
          continue;
        }
        l->size--;
        g->held--;
        g->rejected++;
        g->rejected_ns += now - c->gate_since;
        c->gate_state = STATE_NONE;
        c->gate_next = *expired;
        *expired = c;
        continue;
      }
      l->size--;
      g->held--;
      g->waited_ns += now - c->gate_since;
      return c;
    }
    if (l->dhead != NULL) {
      Call* c = l->dhead;
      l->dhead = c->gate_next;
      if (l->dhead == NULL) l->dtail = NULL;
      c->gate_next = NULL;
      l->size--;
      g->held--;
      g->waited_ns += now - c->gate_since;
      return c;
    }
  }
  return NULL;
}

/* Hand a call the gate let through to Triton; 0, or -1 when Triton refused it (its caller has
 * the error). */
static int submit_through(Gate* g, Call* c, TRITONSERVER_InferenceTrace* trace)
{
  TRITONSERVER_Error* err;
  if (g->release_gil && PyGILState_Check()) { /* see submit_locked */
    int depth = t_gil_depth;
    t_gil_depth = 0;
    Py_BEGIN_ALLOW_THREADS
    err = hand_over(c->server, c->request, trace);
    Py_END_ALLOW_THREADS
    t_gil_depth = depth;
  } else {
    err = hand_over(c->server, c->request, trace);
  }
  if (err == NULL) return 0;
  /* not taken: as submit()'s failure path, but its caller is told here */
  pthread_mutex_lock(&g->mu);
  pend_remove(g, c);
  pthread_mutex_unlock(&g->mu);
  complete_failed(c, err, NULL);
  return -1;
}

/* Let held calls through while instances are free for them. */
static void let_through(Gate* g)
{
  for (;;) {
    Call* out[64];
    TRITONSERVER_InferenceTrace* traces[64];
    size_t n = 0;
    Call* expired = NULL;
    pthread_mutex_lock(&g->mu);
    uint64_t now = now_ns();
    while (n < 64 && g->held > 0 && room(g) && pend_reserve(g) == 0) {
      Call* c = pop_next(g, now, &expired);
      if (c == NULL) break;
      pend_add(g, c);
      traces[n] = c->gate_trace;
      c->gate_trace = NULL;
      out[n++] = c;
    }
    pthread_mutex_unlock(&g->mu);
    fail_expired(expired);
    int refused = 0;
    for (size_t i = 0; i < n; i++) refused += submit_through(g, out[i], traces[i]) < 0;
    if (n < 64 && refused == 0) return;
  }
}

/* ---- timeouts: REJECT while the instances stay busy ---------------------- */

/* One thread for the process, started with the first REJECT timeout: it wakes at the earliest
 * deadline and fails the expired calls of every gate (Triton's batcher does it every 500 ms
 * while it waits for a free instance; here it happens at the deadline). */
static pthread_mutex_t timer_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t timer_cv;
static int timer_started = 0;
static uint64_t timer_next = UINT64_MAX;

static void sweep(void)
{
  uint64_t now = now_ns(), next = UINT64_MAX;
  Call* expired = NULL;
  pthread_rwlock_rdlock(&gate_registry_lock);
  for (Gate* g = gate_registry; g != NULL; g = g->next) {
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_levels; i++) {
      if (g->policies[i].delay) continue;
      GateLevel* l = &g->levels[i];
      Call* prev = NULL;
      for (Call* c = l->head; c != NULL;) {
        Call* after = c->gate_next;
        if (c->gate_deadline != 0 && now > c->gate_deadline) {
          if (prev) prev->gate_next = after;
          else l->head = after;
          if (l->tail == c) l->tail = prev;
          l->size--;
          g->held--;
          g->rejected++;
          g->rejected_ns += now - c->gate_since;
          c->gate_state = STATE_NONE;
          c->gate_next = expired;
          expired = c;
        } else {
          if (c->gate_deadline != 0 && c->gate_deadline < next) next = c->gate_deadline;
          prev = c;
        }
        c = after;
      }
    }
    pthread_mutex_unlock(&g->mu);
  }
  pthread_rwlock_unlock(&gate_registry_lock);
  fail_expired(expired);
  if (next != UINT64_MAX) timer_arm(next);
}

static void* timer_thread(void* unused)
{
  (void)unused;
  pthread_mutex_lock(&timer_mu);
  for (;;) {
    while (timer_next == UINT64_MAX) pthread_cond_wait(&timer_cv, &timer_mu);
    uint64_t now = now_ns();
    if (now < timer_next) {
      struct timespec until = {(time_t)(timer_next / 1000000000ull),
                               (long)(timer_next % 1000000000ull)};
      pthread_cond_timedwait(&timer_cv, &timer_mu, &until);
      continue;
    }
    timer_next = UINT64_MAX;
    pthread_mutex_unlock(&timer_mu);
    sweep();
    pthread_mutex_lock(&timer_mu);
  }
  return NULL;
}

static void timer_arm(uint64_t deadline)
{
  pthread_mutex_lock(&timer_mu);
  if (!timer_started) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&timer_cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_t thread;
    pthread_attr_t tattr;
    pthread_attr_init(&tattr);
    pthread_attr_setdetachstate(&tattr, PTHREAD_CREATE_DETACHED);
    timer_started = pthread_create(&thread, &tattr, timer_thread, NULL) == 0;
    pthread_attr_destroy(&tattr);
  }
  if (deadline < timer_next) {
    timer_next = deadline;
    pthread_cond_signal(&timer_cv);
  }
  pthread_mutex_unlock(&timer_mu);
}
