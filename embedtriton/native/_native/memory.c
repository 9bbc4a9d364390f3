/* Memory: the response allocator that gives each output its own block (taken
 * over by the caller's numpy array, or the caller's own buffer), and clients'
 * shared-memory files mapped here, guarded against SIGBUS. */
#include "memory.h"

#include "calls.h"
#include "cuda.h"

#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>

/* ---- response allocator (caller side) ----------------------------------
 * Each output buffer comes with a ticket (its buffer_userp). When the caller
 * turns an output into a numpy array, the array takes the buffer over
 * (ticket->taken) and frees it when the array dies: no copy out. The ticket
 * itself always belongs to Triton's release of the buffer, which may come
 * after the array is gone (responses are deleted late, see bury()). */
TRITONSERVER_Error* response_alloc_fn(TRITONSERVER_ResponseAllocator* a, const char* tensor_name,
                                      size_t byte_size, TRITONSERVER_MemoryType memory_type,
                                      int64_t memory_type_id, void* userp, void** buffer,
                                      void** buffer_userp,
                                      TRITONSERVER_MemoryType* actual_memory_type,
                                      int64_t* actual_memory_type_id)
{
  (void)a, (void)memory_type, (void)memory_type_id;
  Call* c = (Call*)userp;
  const Preset* preset = c ? call_preset(c, tensor_name) : NULL;
  if (preset != NULL) { /* no ticket: the memory is the caller's */
    if ((size_t)preset->view.len < byte_size)
      return new_error(TRITONSERVER_ERROR_INVALID_ARG,
                       "output '%s' needs %zu bytes but its buffer holds %zd", tensor_name,
                       byte_size, preset->view.len);
    *buffer = preset->view.buf;
    *buffer_userp = NULL;
    *actual_memory_type = preset->gpu ? TRITONSERVER_MEMORY_GPU : TRITONSERVER_MEMORY_CPU;
    *actual_memory_type_id = preset->gpu ? preset->device : 0;
    return NULL;
  }
  Ticket* ticket = malloc(sizeof(Ticket));
  if (ticket == NULL)
    return new_error(TRITONSERVER_ERROR_UNAVAILABLE,
                     "out of memory allocating %zu bytes for output '%s'", byte_size, tensor_name);
  /* A host block is 64-byte aligned; one of 16 bytes or less is malloc's (16-byte aligned,
   * enough for any dtype and never across a cache line) at a tenth of posix_memalign's cost. */
  void* block = NULL;
  int gpu = c != NULL && c->out_device >= 0;
  if (gpu) { /* output_device="gpu": the caller gets device arrays */
    const char* why = cuda_alloc(&block, byte_size, c->out_device);
    if (why != NULL) {
      free(ticket);
      return new_error(TRITONSERVER_ERROR_UNAVAILABLE,
                       "cannot allocate %zu bytes on GPU %d for output '%s': %s", byte_size,
                       c->out_device, tensor_name, why);
    }
  } else if (byte_size <= 16 ? (block = malloc(byte_size ? byte_size : 1)) == NULL
                             : posix_memalign(&block, 64, byte_size) != 0) {
    free(ticket);
    return new_error(TRITONSERVER_ERROR_UNAVAILABLE,
                     "out of memory allocating %zu bytes for output '%s'", byte_size, tensor_name);
  }
  ticket->block = block;
  ticket->taken = 0;
  ticket->gpu = gpu;
  *buffer = block;
  *buffer_userp = ticket;
  *actual_memory_type = gpu ? TRITONSERVER_MEMORY_GPU : TRITONSERVER_MEMORY_CPU;
  *actual_memory_type_id = gpu ? c->out_device : 0;
  return NULL;
}

TRITONSERVER_Error* response_release_fn(TRITONSERVER_ResponseAllocator* a, void* buffer,
                                        void* buffer_userp, size_t byte_size,
                                        TRITONSERVER_MemoryType memory_type, int64_t memory_type_id)
{
  (void)a, (void)buffer, (void)byte_size, (void)memory_type, (void)memory_type_id;
  Ticket* ticket = (Ticket*)buffer_userp;
  if (ticket != NULL) {
    if (!ticket->taken) {
      if (ticket->gpu) cuda_free(ticket->block);
      else free(ticket->block);
    }
    free(ticket);
  }
  return NULL;
}

void free_block_capsule(PyObject* capsule)
{
  free(PyCapsule_GetPointer(capsule, "embedtriton.block"));
}

/* ---- shared-memory mappings, guarded against SIGBUS ----------------------
 * A client's shared-memory region is mapped here and handed to Triton and the
 * model as it is (no copy). The client owns the file and may shrink it: a
 * read or write past its new end raises SIGBUS, which would kill the process.
 * Our SIGBUS handler recognises faults inside a registered mapping, puts
 * private zero pages over the rest of that mapping (so the access completes)
 * and marks it truncated; the frontend then fails the requests that used it.
 * Faults anywhere else go to the previous handler (faulthandler, default). */
#define MAX_MAPPINGS 1024
typedef struct {
  _Atomic(uintptr_t) start, end; /* [start, end) of a live mapping; start 0: free slot */
  atomic_int truncated;
} FaultSlot;
static FaultSlot fault_slots[MAX_MAPPINGS];
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER; /* slot writers only */
static struct sigaction previous_sigbus;
uintptr_t page_size = 4096;

static void on_sigbus(int sig, siginfo_t* info, void* context)
{
  uintptr_t at = (uintptr_t)info->si_addr;
  if (info->si_code > 0) { /* raised by the kernel for a faulting access */
    for (int i = 0; i < MAX_MAPPINGS; i++) {
      uintptr_t start = atomic_load(&fault_slots[i].start);
      uintptr_t end = atomic_load(&fault_slots[i].end);
      if (start == 0 || at < start || at >= end) continue;
      uintptr_t page = at & ~(page_size - 1);
      if (mmap((void*)page, end - page, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
        atomic_store(&fault_slots[i].truncated, 1);
        return; /* the access is retried on the zero pages */
      }
    }
  }
  if ((previous_sigbus.sa_flags & SA_SIGINFO) && previous_sigbus.sa_sigaction != NULL) {
    previous_sigbus.sa_sigaction(sig, info, context);
  } else if (!(previous_sigbus.sa_flags & SA_SIGINFO) && previous_sigbus.sa_handler != SIG_DFL &&
             previous_sigbus.sa_handler != SIG_IGN) {
    previous_sigbus.sa_handler(sig);
  } else { /* the default: the access faults again and the process ends as it would have */
    signal(SIGBUS, SIG_DFL);
    if (info->si_code <= 0) raise(SIGBUS);
  }
}

/* Put our handler first (again, if someone replaced it since). */
static int install_sigbus(void)
{
  struct sigaction current;
  if (sigaction(SIGBUS, NULL, &current) != 0) return -1;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus) return 0;
  struct sigaction ours;
  memset(&ours, 0, sizeof ours);
  ours.sa_sigaction = on_sigbus;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
  sigemptyset(&ours.sa_mask);
  previous_sigbus = current;
  return sigaction(SIGBUS, &ours, NULL);
}

typedef struct {
  PyObject_HEAD
  char* base;
  size_t length;
  int slot;
  int closed;
  Py_ssize_t exports;
} MappingObject;

static void mapping_unmap(MappingObject* m)
{
  if (m->base == NULL) return;
  pthread_mutex_lock(&fault_lock);
  atomic_store(&fault_slots[m->slot].start, 0); /* before munmap: the range may be reused */
  atomic_store(&fault_slots[m->slot].end, 0);
  pthread_mutex_unlock(&fault_lock);
  munmap(m->base, m->length);
  m->base = NULL;
}

static int mapping_getbuffer(MappingObject* m, Py_buffer* view, int flags)
{
  if (m->closed || m->base == NULL) {
    PyErr_SetString(PyExc_BufferError, "the shared-memory mapping is closed");
    return -1;
  }
  if (PyBuffer_FillInfo(view, (PyObject*)m, m->base, (Py_ssize_t)m->length, 0, flags) < 0)
    return -1;
  m->exports++;
  return 0;
}

static void mapping_releasebuffer(MappingObject* m, Py_buffer* view)
{
  (void)view;
  if (--m->exports == 0 && m->closed) mapping_unmap(m);
}

static PyObject* mapping_close(MappingObject* m, PyObject* unused)
{
  (void)unused;
  m->closed = 1;
  if (m->exports == 0) mapping_unmap(m); /* else when the last view goes */
  Py_RETURN_NONE;
}

static PyObject* mapping_truncated(MappingObject* m, void* closure)
{
  (void)closure;
  return PyBool_FromLong(m->base != NULL && atomic_load(&fault_slots[m->slot].truncated));
}

static PyObject* mapping_size(MappingObject* m, void* closure)
{
  (void)closure;
  return PyLong_FromSize_t(m->length);
}

static void mapping_dealloc(MappingObject* m)
{
  mapping_unmap(m);
  Py_TYPE(m)->tp_free((PyObject*)m);
}

static PyBufferProcs mapping_as_buffer = {(getbufferproc)mapping_getbuffer,
                                          (releasebufferproc)mapping_releasebuffer};
static PyMethodDef mapping_methods[] = {{"close", (PyCFunction)mapping_close, METH_NOARGS,
                                         "Unmap (now, or when the last view of it is released)."},
                                        {NULL, NULL, 0, NULL}};
static PyGetSetDef mapping_getset[] = {
    {"truncated", (getter)mapping_truncated, NULL,
     "whether an access found the file shrunk under the mapping (its data is lost)", NULL},
    {"size", (getter)mapping_size, NULL, "mapped bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL}};
PyTypeObject MappingType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "embedtriton._native.Mapping",
    .tp_basicsize = sizeof(MappingObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A shared-memory file mapped read-write, guarded against SIGBUS (see map_shared).",
    .tp_dealloc = (destructor)mapping_dealloc,
    .tp_as_buffer = &mapping_as_buffer,
    .tp_methods = mapping_methods,
    .tp_getset = mapping_getset,
};

/* map_shared(fd, length) -> Mapping: the first length bytes of the file. */
PyObject* py_map_shared(PyObject* self, PyObject* args)
{
  (void)self;
  int fd;
  Py_ssize_t length;
  if (!PyArg_ParseTuple(args, "in:map_shared", &fd, &length)) return NULL;
  if (length <= 0)
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "a mapping needs a positive size");
  if (install_sigbus() != 0) return PyErr_SetFromErrno(PyExc_OSError);
  void* base = mmap(NULL, (size_t)length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
  size_t mapped = ((size_t)length + page_size - 1) & ~(page_size - 1);
  int slot = -1;
  pthread_mutex_lock(&fault_lock);
  for (int i = 0; i < MAX_MAPPINGS && slot < 0; i++)
    if (atomic_load(&fault_slots[i].start) == 0) {
      slot = i;
      atomic_store(&fault_slots[i].truncated, 0);
      atomic_store(&fault_slots[i].end, (uintptr_t)base + mapped);
      atomic_store(&fault_slots[i].start, (uintptr_t)base);
    }
  pthread_mutex_unlock(&fault_lock);
  if (slot < 0) {
    munmap(base, (size_t)length);
    char msg[160];
    snprintf(msg, sizeof msg,
             "too many shared-memory regions are mapped (%d); unregister some first", MAX_MAPPINGS);
    return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE, msg);
  }
  MappingObject* m = PyObject_New(MappingObject, &MappingType);
  if (m == NULL) {
    MappingObject tmp = {.base = base, .length = (size_t)length, .slot = slot};
    mapping_unmap(&tmp);
    return NULL;
  }
  m->base = base;
  m->length = (size_t)length;
  m->slot = slot;
  m->closed = 0;
  m->exports = 0;
  return (PyObject*)m;
}
