/* The libraries _h2 dlopen()s: libnghttp2 (the better of the system's and the
 * one bundled with the Triton wheel, or the one EMBEDTRITON_NGHTTP2 names) and,
 * for TLS, OpenSSL 3; and library(), which says which libnghttp2 is in use. */
#include "h2.h"

#include <dlfcn.h>
#include <glob.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------ */
/* dynamically loaded libraries                                              */

NgFuncs ng;
static int ng_loaded;
/* optional: the rapid-reset (CVE-2023-44487) limit and the CONTINUATION-flood (CVE-2024-30255)
 * limit, in nghttp2
 * >= 1.57 / 1.61 and in distribution backports (Debian 12's 1.52.0, the Triton wheel's 1.43.0) */
static int (*ng_option_new)(nghttp2_option**);
static void (*ng_option_del)(nghttp2_option*);
static void (*ng_option_set_stream_reset_rate_limit)(nghttp2_option*, uint64_t burst,
                                                     uint64_t rate);
static void (*ng_option_set_max_continuations)(nghttp2_option*, size_t);
int (*ng_session_server_new2)(nghttp2_session**, const nghttp2_session_callbacks*, void*,
                              const nghttp2_option*);
nghttp2_option* ng_options;

/* What library() reports about the libnghttp2 in use. */
static struct {
  char path[4096];
  char version[32];
  int version_num, reset_rate_limit, max_continuations;
} ng_info;

/* Rapid reset (CVE-2023-44487): a token bucket per connection, one token per RST_STREAM the client
 * sends; when it is empty nghttp2 sends GOAWAY and the connection ends. nghttp2's default is a
 * burst of 1000 refilled at 33/s.
 *
 * Measured here (2 vCPUs, a trivial handler, IO thread CPU time per reset stream): ~1.7 us for a
 * request reset in the same read, which never reaches Python (dispatch drops it), ~3-4 us for one
 * reset after on_message and on_half_close ran (on_cancel follows). What a reset costs beyond that
 * is the application's work for a call that is then cancelled: ~160 us of CPU for an AddSub
 * inference through Triton (12,683 infer/s on 2 cores, README). The burst bounds that work per
 * connection, the rate its sustained share:
 *  - burst 1000, nghttp2's own: at most ~0.16 s of such work, once per connection (max_connections
 * bounds how many); the old 10,000 let one connection queue seconds of it ahead of every other
 * client;
 *  - rate 500/s instead of 33/s: a busy client cancelling a few hundred calls a second (deadlines,
 * hedged requests) keeps its connection, where 33/s dropped one cancelling 66/s after ~30 s; a
 * flooding connection is held to ~8 % of one core of cancelled inference work (500 x 160 us) and
 * ~0.2 % of the IO thread for the transport's part (tests/adversarial checks both: a flood gets
 * GOAWAY within the budget, 400 cancels/s do not).
 */
#define RESET_BURST 1000
#define RESET_RATE 500
/* nghttp2's own default (8 CONTINUATION frames per header block), set explicitly so that it holds
 * whatever the library's default is. */
#define MAX_CONTINUATIONS 8

static int load_symbols(void* h, const char* prefix, const char* const* names, void** slots,
                        size_t n, char* err, size_t errlen)
{
  for (size_t i = 0; i < n; i++) {
    char full[128];
    snprintf(full, sizeof full, "%s%s", prefix, names[i]);
    slots[i] = dlsym(h, full);
    if (!slots[i]) {
      snprintf(err, errlen, "symbol %s not found", full);
      return -1;
    }
  }
  return 0;
}

#define ET_NAME(ret, name, args) #name,
static const char* const ng_names[] = {ET_NGHTTP2_FUNCS(ET_NAME)};
static const char* const ssl_names[] = {ET_SSL_FUNCS(ET_NAME)};

/* One libnghttp2 that could be used: its handle, what it offers, and where it was found. */
typedef struct {
  void* h;
  NgFuncs f;
  int version_num, reset_rate_limit, max_continuations;
  char version[32], path[4096];
} NgCandidate;

static int ng_probe(const char* name, NgCandidate* c, char* err, size_t errlen)
{
  memset(c, 0, sizeof *c);
  c->h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!c->h) {
    snprintf(err, errlen, "dlopen(%s) failed: %s", name, dlerror());
    return -1;
  }
  char why[256];
  if (load_symbols(c->h, "nghttp2_", ng_names, (void**)&c->f, sizeof ng_names / sizeof *ng_names,
                   why, sizeof why) < 0) {
    snprintf(err, errlen, "%s is too old or not nghttp2: %s", name, why);
    dlclose(c->h);
    c->h = NULL;
    return -1;
  }
  nghttp2_info* info = c->f.version(0);
  c->version_num = info ? info->version_num : 0;
  snprintf(c->version, sizeof c->version, "%s",
           info && info->version_str ? info->version_str : "?");
  int opts = dlsym(c->h, "nghttp2_option_new") && dlsym(c->h, "nghttp2_option_del") &&
             dlsym(c->h, "nghttp2_session_server_new2");
  c->reset_rate_limit = opts && dlsym(c->h, "nghttp2_option_set_stream_reset_rate_limit");
  c->max_continuations = opts && dlsym(c->h, "nghttp2_option_set_max_continuations");
  Dl_info dl;
  char real[4096];
  if (dladdr((void*)c->f.version, &dl) && dl.dli_fname && realpath(dl.dli_fname, real))
    snprintf(c->path, sizeof c->path, "%s", real);
  else snprintf(c->path, sizeof c->path, "%s", name);
  return 0;
}

/* Which of two usable libraries to keep: the one with more of the two security options, then the
 * newer. */
static int ng_better(const NgCandidate* a, const NgCandidate* b)
{
  int sa = a->reset_rate_limit + a->max_continuations,
      sb = b->reset_rate_limit + b->max_continuations;
  if (sa != sb) return sa > sb;
  return a->version_num > b->version_num;
}

static void ng_use(NgCandidate* c)
{
  ng = c->f;
  ng_option_new = (int (*)(nghttp2_option**))dlsym(c->h, "nghttp2_option_new");
  ng_option_del = (void (*)(nghttp2_option*))dlsym(c->h, "nghttp2_option_del");
  ng_session_server_new2 =
      (int (*)(nghttp2_session**, const nghttp2_session_callbacks*, void*,
               const nghttp2_option*))dlsym(c->h, "nghttp2_session_server_new2");
  ng_option_set_stream_reset_rate_limit = (void (*)(nghttp2_option*, uint64_t, uint64_t))dlsym(
      c->h, "nghttp2_option_set_stream_reset_rate_limit");
  ng_option_set_max_continuations =
      (void (*)(nghttp2_option*, size_t))dlsym(c->h, "nghttp2_option_set_max_continuations");
  if ((c->reset_rate_limit || c->max_continuations) && ng_option_new(&ng_options) == 0) {
    if (c->reset_rate_limit)
      ng_option_set_stream_reset_rate_limit(ng_options, RESET_BURST, RESET_RATE);
    if (c->max_continuations) ng_option_set_max_continuations(ng_options, MAX_CONTINUATIONS);
  } else {
    ng_options = NULL;
  }
  snprintf(ng_info.path, sizeof ng_info.path, "%s", c->path);
  snprintf(ng_info.version, sizeof ng_info.version, "%s", c->version);
  ng_info.version_num = c->version_num;
  ng_info.reset_rate_limit = c->reset_rate_limit;
  ng_info.max_continuations = c->max_continuations;
  ng_loaded = 1;
}

/* EMBEDTRITON_NGHTTP2=/path/libnghttp2.so forces that library. Otherwise both the system's
 * libnghttp2.so.14 and the caller's libpath (the copy bundled with the Triton wheel) are tried, and
 * the better one (ng_better) is kept. */
int load_nghttp2(const char* libpath)
{
  if (ng_loaded) return 0;
  char err[1024] = "", err2[1024] = "";
  NgCandidate a, b;
  const char* forced = getenv("EMBEDTRITON_NGHTTP2");
  if (forced && forced[0]) {
    if (ng_probe(forced, &a, err, sizeof err) < 0) {
      PyErr_Format(PyExc_ImportError, "EMBEDTRITON_NGHTTP2=%s is unusable: %s", forced, err);
      return -1;
    }
    ng_use(&a);
    return 0;
  }
  int ok_a = ng_probe("libnghttp2.so.14", &a, err, sizeof err) == 0;
  int ok_b = libpath && ng_probe(libpath, &b, err2, sizeof err2) == 0;
  if (!ok_a && !ok_b) {
    PyErr_Format(PyExc_ImportError,
                 "embedtriton._h2 needs libnghttp2: %s%s%s; install libnghttp2-14 or the "
                 "nvidia-pytriton wheel, which "
                 "bundles it (or set EMBEDTRITON_NGHTTP2 to a libnghttp2.so)",
                 err, libpath ? "; " : ", and no fallback path was given", libpath ? err2 : "");
    return -1;
  }
  NgCandidate *keep = ok_a && (!ok_b || !ng_better(&b, &a)) ? &a : &b, *drop = keep == &a ? &b : &a;
  int drop_ok = keep == &a ? ok_b : ok_a;
  ng_use(keep);
  if (drop_ok) dlclose(drop->h); /* the same file opened twice is one handle with two references */
  return 0;
}

SslFuncs ossl;
static int ossl_loaded;

int load_openssl(const char* libpath)
{
  if (ossl_loaded) return 0;
  void* h = dlopen("libssl.so.3", RTLD_NOW | RTLD_LOCAL);
  char err[512] = "";
  if (!h) snprintf(err, sizeof err, "%s", dlerror());
  if (!h && libpath) { /* the nvidia-pytriton wheel bundles libssl-<hash>.so.3 beside libnghttp2 */
    char dir[4096], pattern[4200];
    snprintf(dir, sizeof dir, "%s", libpath);
    snprintf(pattern, sizeof pattern, "%s/libssl*.so.3", dirname(dir));
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc && !h; i++)
        h = dlopen(g.gl_pathv[i], RTLD_NOW | RTLD_LOCAL);
      globfree(&g);
    }
  }
  if (!h) {
    PyErr_Format(PyExc_ImportError, "TLS needs OpenSSL 3: dlopen(libssl.so.3) failed (%s)", err);
    return -1;
  }
  if (load_symbols(h, "", ssl_names, (void**)&ossl, sizeof ssl_names / sizeof *ssl_names, err,
                   sizeof err) < 0) {
    PyErr_Format(PyExc_ImportError, "libssl.so.3 is unusable: %s", err);
    dlclose(h);
    return -1;
  }
  ossl_loaded = 1;
  return 0;
}

PyObject* library_info(PyObject* mod, PyObject* args, PyObject* kw)
{
  (void)mod;
  static char* kwlist[] = {"libpath", NULL};
  const char* libpath = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|z:library", kwlist, &libpath)) return NULL;
  if (load_nghttp2(libpath) < 0) return NULL;
  return Py_BuildValue("{s:s,s:s,s:O,s:O}", "path", ng_info.path, "version", ng_info.version,
                       "reset_rate_limit", ng_info.reset_rate_limit ? Py_True : Py_False,
                       "max_continuations", ng_info.max_continuations ? Py_True : Py_False);
}
