/* The floor's client: drives a running libtritonserver through its C API, with no Python on
 * the request path (bench_floor.py calls in through ctypes, then waits in C with the GIL
 * released). Three loads, as embedtriton is measured:
 *   floor_sequential: one request at a time, each latency recorded;
 *   floor_threads:    N threads, each one request at a time;
 *   floor_inflight:   one thread keeping N requests in flight (a completion queue).
 * Requests carry FP32 "a" and "b" of shape [1, 1] (batching on) or [1] (off). Built by the
 * benchmark, never shipped. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONSERVER_Server TRITONSERVER_Server;
typedef struct TRITONSERVER_InferenceRequest TRITONSERVER_InferenceRequest;
typedef struct TRITONSERVER_InferenceResponse TRITONSERVER_InferenceResponse;
typedef struct TRITONSERVER_ResponseAllocator TRITONSERVER_ResponseAllocator;
typedef int TRITONSERVER_MemoryType;
enum { FP32 = 11, CPU = 0, FINAL = 1 };

typedef TRITONSERVER_Error* (*AllocFn)(TRITONSERVER_ResponseAllocator*, const char*, size_t,
                                       TRITONSERVER_MemoryType, int64_t, void*, void**, void**,
                                       TRITONSERVER_MemoryType*, int64_t*);
typedef TRITONSERVER_Error* (*FreeFn)(TRITONSERVER_ResponseAllocator*, void*, void*, size_t,
                                      TRITONSERVER_MemoryType, int64_t);
typedef void (*ReleaseFn)(TRITONSERVER_InferenceRequest*, const uint32_t, void*);
typedef void (*CompleteFn)(TRITONSERVER_InferenceResponse*, const uint32_t, void*);

extern TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorNew(TRITONSERVER_ResponseAllocator**,
                                                             AllocFn, FreeFn, void*);
extern TRITONSERVER_Error* TRITONSERVER_InferenceRequestNew(TRITONSERVER_InferenceRequest**,
                                                            TRITONSERVER_Server*, const char*,
                                                            int64_t);
extern TRITONSERVER_Error* TRITONSERVER_InferenceRequestDelete(TRITONSERVER_InferenceRequest*);
extern TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddInput(TRITONSERVER_InferenceRequest*,
                                                                 const char*, int, const int64_t*,
                                                                 uint64_t);
extern TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputData(
    TRITONSERVER_InferenceRequest*, const char*, const void*, size_t, TRITONSERVER_MemoryType,
    int64_t);
extern TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetReleaseCallback(
    TRITONSERVER_InferenceRequest*, ReleaseFn, void*);
extern TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetResponseCallback(
    TRITONSERVER_InferenceRequest*, TRITONSERVER_ResponseAllocator*, void*, CompleteFn, void*);
extern TRITONSERVER_Error* TRITONSERVER_ServerInferAsync(TRITONSERVER_Server*,
                                                         TRITONSERVER_InferenceRequest*, void*);
extern TRITONSERVER_Error* TRITONSERVER_InferenceResponseError(TRITONSERVER_InferenceResponse*);
extern TRITONSERVER_Error* TRITONSERVER_InferenceResponseDelete(TRITONSERVER_InferenceResponse*);
extern void TRITONSERVER_ErrorDelete(TRITONSERVER_Error*);

static TRITONSERVER_Server* server;
static TRITONSERVER_ResponseAllocator* allocator;
static const float A[1] = {1.0f}, B[1] = {2.0f};

static TRITONSERVER_Error* alloc(TRITONSERVER_ResponseAllocator* a, const char* name, size_t size,
                                 TRITONSERVER_MemoryType type, int64_t id, void* userp,
                                 void** buffer, void** buffer_userp,
                                 TRITONSERVER_MemoryType* actual, int64_t* actual_id)
{
  (void)a, (void)name, (void)type, (void)id, (void)userp;
  *buffer = size ? malloc(size) : NULL;
  *buffer_userp = NULL;
  *actual = CPU;
  *actual_id = 0;
  return NULL;
}

static TRITONSERVER_Error* release_buffer(TRITONSERVER_ResponseAllocator* a, void* buffer,
                                          void* userp, size_t size, TRITONSERVER_MemoryType type,
                                          int64_t id)
{
  (void)a, (void)userp, (void)size, (void)type, (void)id;
  free(buffer);
  return NULL;
}

static void release_request(TRITONSERVER_InferenceRequest* request, const uint32_t flags,
                            void* userp)
{
  (void)flags, (void)userp;
  TRITONSERVER_InferenceRequestDelete(request);
}

/* Where a completion is reported: a counter under a mutex, with a condition to wait on. */
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t changed;
  long completed, failed;
} Done;

static void complete(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp)
{
  Done* done = userp;
  int failed = 0;
  if (response != NULL) {
    TRITONSERVER_Error* err = TRITONSERVER_InferenceResponseError(response);
    if (err) failed = 1, TRITONSERVER_ErrorDelete(err);
    TRITONSERVER_InferenceResponseDelete(response);
  }
  if (flags & FINAL) {
    pthread_mutex_lock(&done->lock);
    __atomic_store_n(&done->completed, done->completed + 1, __ATOMIC_RELEASE);
    done->failed += failed;
    pthread_cond_signal(&done->changed);
    pthread_mutex_unlock(&done->lock);
  }
}

int floor_setup(void* triton_server)
{
  server = triton_server;
  TRITONSERVER_Error* err =
      TRITONSERVER_ResponseAllocatorNew(&allocator, alloc, release_buffer, NULL);
  if (err) return TRITONSERVER_ErrorDelete(err), -1;
  return 0;
}

static int submit(const char* model, int batched, Done* done)
{
  static const int64_t batched_shape[2] = {1, 1}, plain_shape[1] = {1};
  TRITONSERVER_InferenceRequest* request;
  TRITONSERVER_Error* err = TRITONSERVER_InferenceRequestNew(&request, server, model, -1);
  if (err) return TRITONSERVER_ErrorDelete(err), -1;
  const int64_t* shape = batched ? batched_shape : plain_shape;
  uint64_t dims = batched ? 2 : 1;
  if (!err) err = TRITONSERVER_InferenceRequestAddInput(request, "a", FP32, shape, dims);
  if (!err) err = TRITONSERVER_InferenceRequestAppendInputData(request, "a", A, sizeof A, CPU, 0);
  if (!err) err = TRITONSERVER_InferenceRequestAddInput(request, "b", FP32, shape, dims);
  if (!err) err = TRITONSERVER_InferenceRequestAppendInputData(request, "b", B, sizeof B, CPU, 0);
  if (!err) err = TRITONSERVER_InferenceRequestSetReleaseCallback(request, release_request, NULL);
  if (!err)
    err =
        TRITONSERVER_InferenceRequestSetResponseCallback(request, allocator, NULL, complete, done);
  if (!err) err = TRITONSERVER_ServerInferAsync(server, request, NULL);
  if (err) {
    TRITONSERVER_ErrorDelete(err);
    TRITONSERVER_InferenceRequestDelete(request);
    return -1;
  }
  return 0;
}

static int64_t now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Wait until `done` has counted `target` completions: spinning first for up to `spin_ns` (a
 * thread that sleeps costs tens of µs to wake on these VMs; the floor is the best a caller can
 * do), then on the condition. */
static void wait_for(Done* done, long target, int64_t spin_ns)
{
  if (spin_ns > 0) {
    int64_t until = now_ns() + spin_ns;
    while (__atomic_load_n(&done->completed, __ATOMIC_ACQUIRE) < target && now_ns() < until) {
    }
  }
  pthread_mutex_lock(&done->lock);
  while (done->completed < target) pthread_cond_wait(&done->changed, &done->lock);
  pthread_mutex_unlock(&done->lock);
}

#define SPIN_NS 200000 /* one thread waiting: spin up to 200 µs */

static void done_init(Done* done)
{
  pthread_mutex_init(&done->lock, NULL);
  pthread_cond_init(&done->changed, NULL);
  done->completed = done->failed = 0;
}

/* n requests one after another; latencies_ns[i] for each. Returns the failures (-1: submit failed).
 */
long floor_sequential(const char* model, int batched, long n, int64_t* latencies_ns)
{
  Done done;
  done_init(&done);
  for (long i = 0; i < n; i++) {
    int64_t started = now_ns();
    if (submit(model, batched, &done) != 0) return -1;
    wait_for(&done, i + 1, SPIN_NS);
    latencies_ns[i] = now_ns() - started;
  }
  return done.failed;
}

typedef struct {
  const char* model;
  int batched;
  int64_t until;
  long count;
  int error;
} Worker;

static void* work(void* arg)
{
  Worker* w = arg;
  Done done;
  done_init(&done);
  while (now_ns() < w->until) {
    if (submit(w->model, w->batched, &done) != 0) {
      w->error = 1;
      break;
    }
    wait_for(&done, ++w->count, 0); /* 64 threads on 2 cores: no spinning */
  }
  if (done.failed) w->error = 1;
  return NULL;
}

/* `threads` threads, each one request at a time, for `seconds`. Returns requests per second (-1:
 * failures). */
double floor_threads(const char* model, int batched, int threads, double seconds)
{
  Worker* workers = calloc((size_t)threads, sizeof(Worker));
  pthread_t* ids = calloc((size_t)threads, sizeof(pthread_t));
  int64_t started = now_ns();
  for (int t = 0; t < threads; t++) {
    workers[t] = (Worker){model, batched, started + (int64_t)(seconds * 1e9), 0, 0};
    pthread_create(&ids[t], NULL, work, &workers[t]);
  }
  long total = 0;
  int error = 0;
  for (int t = 0; t < threads; t++) {
    pthread_join(ids[t], NULL);
    total += workers[t].count;
    error |= workers[t].error;
  }
  double elapsed = (now_ns() - started) / 1e9;
  free(workers), free(ids);
  return error ? -1.0 : total / elapsed;
}

/* One thread keeping `inflight` requests in flight for `seconds`. Returns requests per second. */
double floor_inflight(const char* model, int batched, int inflight, double seconds)
{
  Done done;
  done_init(&done);
  int64_t started = now_ns(), until = started + (int64_t)(seconds * 1e9);
  long sent = 0;
  for (; sent < inflight; sent++)
    if (submit(model, batched, &done) != 0) return -1.0;
  while (now_ns() < until) {
    pthread_mutex_lock(&done.lock);
    while (sent - done.completed >= inflight) pthread_cond_wait(&done.changed, &done.lock);
    long room = inflight - (sent - done.completed);
    pthread_mutex_unlock(&done.lock);
    for (long k = 0; k < room; k++, sent++)
      if (submit(model, batched, &done) != 0) return -1.0;
  }
  wait_for(&done, sent, SPIN_NS);
  double elapsed = (now_ns() - started) / 1e9;
  return done.failed ? -1.0 : sent / elapsed;
}
