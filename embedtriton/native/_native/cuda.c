/* The CUDA runtime Triton ships (libcudart.so.12, dlopened by the path Python gives
 * cuda_init(), so nothing links against CUDA and a machine without a GPU never loads it):
 * copies, device allocations (stream-ordered where the runtime has it), and CUDA IPC handles
 * (CUDA shared memory). What Python sees of device memory is device_array.c's. */
#include "cuda.h"

#include <dlfcn.h>
#include <stdio.h>

#include "dlpack.h"

/* ---- the CUDA runtime -------------------------------------------------- */

typedef int cudaError_t;
typedef struct {
  char reserved[64];
} IpcHandle; /* cudaIpcMemHandle_t */
enum { MEMCPY_DEFAULT = 4, IPC_LAZY_ENABLE_PEER_ACCESS = 1 };

static struct {
  cudaError_t (*Malloc)(void**, size_t);
  cudaError_t (*Free)(void*);
  cudaError_t (*MemcpyAsync)(void*, const void*, size_t, int, void*);
  cudaError_t (*StreamSynchronize)(void*);
  cudaError_t (*SetDevice)(int);
  cudaError_t (*GetDevice)(int*);
  cudaError_t (*GetDeviceCount)(int*);
  const char* (*GetErrorString)(cudaError_t);
  cudaError_t (*IpcOpenMemHandle)(void**, IpcHandle, unsigned int);
  cudaError_t (*IpcCloseMemHandle)(void*);
  /* stream-ordered allocation (CUDA 11.2+): NULL where the runtime lacks it */
  cudaError_t (*MallocAsync)(void**, size_t, void*);
  cudaError_t (*FreeAsync)(void*, void*);
  cudaError_t (*DeviceGetDefaultMemPool)(void**, int);
  cudaError_t (*MemPoolSetAttribute)(void*, int, void*);
} cuda;
enum { MEMPOOL_ATTR_RELEASE_THRESHOLD = 4 }; /* cudaMemPoolAttrReleaseThreshold */
static atomic_ullong pooled_devices;         /* bit d: device d's pool keeps freed blocks */
static atomic_int cuda_loaded;
static int cuda_count;

int cuda_ready(void)
{
  return atomic_load(&cuda_loaded);
}

static const char* cuda_why(cudaError_t e)
{
  const char* s = cuda.GetErrorString ? cuda.GetErrorString(e) : NULL;
  return s ? s : "unknown CUDA error";
}

#define NO_CUDA "the CUDA runtime is not loaded (this process sees no GPU)"

/* Copy n bytes between any two of host and device memory (unified addressing decides the
 * direction) on the legacy default stream, which orders it after the work that cupy and
 * torch queue on theirs by default, and wait for it. NULL, or CUDA's reason. */
const char* cuda_copy(void* dst, const void* src, size_t n)
{
  if (n == 0) return NULL;
  if (!cuda_ready()) return NO_CUDA;
  cudaError_t e;
  if (n >= (1u << 20) && PyGILState_Check()) { /* a long copy lets other threads run */
    Py_BEGIN_ALLOW_THREADS
    e = cuda.MemcpyAsync(dst, src, n, MEMCPY_DEFAULT, NULL);
    if (e == 0) e = cuda.StreamSynchronize(NULL);
    Py_END_ALLOW_THREADS
  } else {
    e = cuda.MemcpyAsync(dst, src, n, MEMCPY_DEFAULT, NULL);
    if (e == 0) e = cuda.StreamSynchronize(NULL);
  }
  return e ? cuda_why(e) : NULL;
}

/* Device memory on `device` (the calling thread's current device is left as it was).
 * Blocks come from the device's stream-ordered pool (cudaMallocAsync on the legacy stream):
 * the pool keeps freed blocks for the next output (a plain cudaMalloc/cudaFree pair costs
 * ~50 to ~300 us, growing with the size, and cudaFree waits for the whole device), and the
 * legacy stream orders each reuse after the work queued on blocking streams. A runtime
 * without it gets cudaMalloc. */
const char* cuda_alloc(void** ptr, size_t n, int device)
{
  if (!cuda_ready()) return NO_CUDA;
  int current = 0;
  cudaError_t e = cuda.GetDevice(&current);
  if (e == 0 && current != device) e = cuda.SetDevice(device);
  unsigned long long bit = device >= 0 && device < 64 ? 1ull << device : 0;
  if (e == 0 && cuda.MallocAsync != NULL && bit && !(atomic_load(&pooled_devices) & bit)) {
    void* pool = NULL;
    uint64_t keep = UINT64_MAX; /* keep what was freed: outputs of the same sizes come again */
    if (cuda.DeviceGetDefaultMemPool(&pool, device) == 0 &&
        cuda.MemPoolSetAttribute(pool, MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep) == 0)
      atomic_fetch_or(&pooled_devices, bit);
    else cuda.MallocAsync = NULL, cuda.FreeAsync = NULL; /* (no pools here: plain allocations) */
  }
  if (e == 0 && cuda.MallocAsync != NULL && bit) {
    e = cuda.MallocAsync(ptr, n ? n : 1, NULL);
    /* the block is ready for any stream (Triton's, another backend's) once this returns */
    if (e == 0) e = cuda.StreamSynchronize(NULL);
  } else if (e == 0) {
    e = cuda.Malloc(ptr, n ? n : 1);
  }
  if (current != device) cuda.SetDevice(current);
  return e ? cuda_why(e) : NULL;
}

void cuda_free(void* ptr)
{
  if (ptr == NULL || !cuda_ready()) return;
  if (cuda.FreeAsync == NULL || cuda.FreeAsync(ptr, NULL) != 0) cuda.Free(ptr);
}

/* cuda_init(path) -> number of devices: load the CUDA runtime at path (once). */
PyObject* py_cuda_init(PyObject* self, PyObject* arg)
{
  (void)self;
  if (cuda_ready()) return PyLong_FromLong(cuda_count);
  const char* path = PyUnicode_AsUTF8(arg);
  if (path == NULL) return NULL;
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return PyErr_Format(PyExc_OSError, "cannot load %s: %s", path, dlerror());
#define RESOLVE(field, symbol)                            \
  if ((*(void**)& cuda.field = dlsym(h, symbol)) == NULL) \
    return PyErr_Format(PyExc_OSError, "%s lacks %s: not a CUDA runtime", path, symbol);
  RESOLVE(Malloc, "cudaMalloc")
  RESOLVE(Free, "cudaFree")
  RESOLVE(MemcpyAsync, "cudaMemcpyAsync")
  RESOLVE(StreamSynchronize, "cudaStreamSynchronize")
  RESOLVE(SetDevice, "cudaSetDevice")
  RESOLVE(GetDevice, "cudaGetDevice")
  RESOLVE(GetDeviceCount, "cudaGetDeviceCount")
  RESOLVE(GetErrorString, "cudaGetErrorString")
  RESOLVE(IpcOpenMemHandle, "cudaIpcOpenMemHandle")
  RESOLVE(IpcCloseMemHandle, "cudaIpcCloseMemHandle")
#undef RESOLVE
  *(void**)&cuda.MallocAsync = dlsym(h, "cudaMallocAsync");
  *(void**)&cuda.FreeAsync = dlsym(h, "cudaFreeAsync");
  *(void**)&cuda.DeviceGetDefaultMemPool = dlsym(h, "cudaDeviceGetDefaultMemPool");
  *(void**)&cuda.MemPoolSetAttribute = dlsym(h, "cudaMemPoolSetAttribute");
  if (!cuda.MallocAsync || !cuda.FreeAsync || !cuda.DeviceGetDefaultMemPool ||
      !cuda.MemPoolSetAttribute)
    cuda.MallocAsync = NULL, cuda.FreeAsync = NULL;
  int n = 0;
  if (cuda.GetDeviceCount(&n) != 0) n = 0;
  cuda_count = n;
  atomic_store(&cuda_loaded, n > 0);
  return PyLong_FromLong(n);
}

/* ---- CUDA IPC (CUDA shared memory) ------------------------------------- */

/* cuda_ipc_open(handle, device) -> int: a client's cudaIpcMemHandle_t opened on device. */
PyObject* py_cuda_ipc_open(PyObject* self, PyObject* args)
{
  (void)self;
  Py_buffer handle;
  int device;
  if (!PyArg_ParseTuple(args, "y*i:cuda_ipc_open", &handle, &device)) return NULL;
  if (handle.len != (Py_ssize_t)sizeof(IpcHandle)) {
    PyBuffer_Release(&handle);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                        "a CUDA IPC memory handle is 64 bytes (cudaIpcMemHandle_t)");
  }
  if (!cuda_ready()) {
    PyBuffer_Release(&handle);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, NO_CUDA);
  }
  IpcHandle h;
  memcpy(&h, handle.buf, sizeof h);
  PyBuffer_Release(&handle);
  void* ptr = NULL;
  int current = 0;
  cudaError_t e;
  Py_BEGIN_ALLOW_THREADS
  e = cuda.GetDevice(&current);
  if (e == 0 && current != device) e = cuda.SetDevice(device);
  if (e == 0) e = cuda.IpcOpenMemHandle(&ptr, h, IPC_LAZY_ENABLE_PEER_ACCESS);
  if (current != device) cuda.SetDevice(current);
  Py_END_ALLOW_THREADS
  if (e != 0) {
    char msg[256];
    snprintf(msg, sizeof msg, "cannot open the CUDA IPC handle on GPU %d: %s", device, cuda_why(e));
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  return PyLong_FromVoidPtr(ptr);
}

/* cuda_ipc_close(ptr, device): close what cuda_ipc_open opened (on its device). */
PyObject* py_cuda_ipc_close(PyObject* self, PyObject* args)
{
  (void)self;
  PyObject* ptr_obj;
  int device = 0;
  if (!PyArg_ParseTuple(args, "O|i:cuda_ipc_close", &ptr_obj, &device)) return NULL;
  void* ptr = PyLong_AsVoidPtr(ptr_obj);
  if (PyErr_Occurred()) return NULL;
  if (ptr != NULL && cuda_ready()) {
    int current = 0;
    Py_BEGIN_ALLOW_THREADS
    if (cuda.GetDevice(&current) == 0 && (current == device || cuda.SetDevice(device) == 0)) {
      cuda.IpcCloseMemHandle(ptr);
      if (current != device) cuda.SetDevice(current);
    }
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

/* cuda_allocation_size(ptr, device) -> int: the size of the allocation ptr starts, asked of the
 * driver (cuMemGetAddressRange, as Triton checks a CUDA shared-memory registration). */
PyObject* py_cuda_allocation_size(PyObject* self, PyObject* args)
{
  (void)self;
  PyObject* ptr_obj;
  int device;
  if (!PyArg_ParseTuple(args, "Oi:cuda_allocation_size", &ptr_obj, &device)) return NULL;
  uintptr_t ptr = (uintptr_t)PyLong_AsVoidPtr(ptr_obj);
  if (PyErr_Occurred()) return NULL;
  if (!cuda_ready()) return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, NO_CUDA);
  static int (*range)(unsigned long long*, size_t*, unsigned long long) = NULL;
  if (range == NULL) {
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver == NULL) driver = dlopen("libcuda.so.1", RTLD_NOW);
    if (driver != NULL) *(void**)&range = dlsym(driver, "cuMemGetAddressRange_v2");
    if (range == NULL)
      return raise_triton(TRITONSERVER_ERROR_INTERNAL,
                          "the CUDA driver lacks cuMemGetAddressRange_v2");
  }
  unsigned long long base = 0;
  size_t size = 0;
  int current = 0, rc = -1;
  Py_BEGIN_ALLOW_THREADS
  if (cuda.GetDevice(&current) == 0 && (current == device || cuda.SetDevice(device) == 0)) {
    void* probe = NULL; /* makes the device's primary context current on this thread */
    if (cuda.Malloc(&probe, 1) == 0) cuda.Free(probe);
    rc = range(&base, &size, (unsigned long long)ptr);
    if (current != device) cuda.SetDevice(current);
  }
  Py_END_ALLOW_THREADS
  if (rc != 0) {
    char msg[160];
    snprintf(msg, sizeof msg, "the CUDA driver does not know the address (CUresult %d)", rc);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  return PyLong_FromSize_t(size - (size_t)(ptr - (uintptr_t)base));
}
