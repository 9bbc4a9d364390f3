/* What the fuzz targets beside this file share: an invariant check that stops the run (libFuzzer
 * keeps the input that broke it), an exactly sized heap copy of the input (one byte read past the
 * end is an ASan report, where a Python bytes object or the fuzzer's own buffer would hide it), a
 * small generator that cuts an input into pieces at points the input itself chooses, and a socket
 * drain for the targets that talk through one. */
#ifndef EMBEDTRITON_FUZZ_H
#define EMBEDTRITON_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                           \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "%s:%d: invariant broken: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                \
      fputc('\n', stderr);                                                         \
      abort();                                                                     \
    }                                                                              \
  } while (0)

/* A malloc'd copy of exactly n bytes (at least one allocated byte is never readable: n == 0 gives
 * a 1-byte block whose pointer is used with length 0). */
static inline uint8_t* exact_copy(const uint8_t* data, size_t n)
{
  uint8_t* p = malloc(n ? n : 1);
  if (!p) abort();
  if (n) memcpy(p, data, n);
  return p;
}

/* Cut points: a xorshift generator seeded by the input's last 4 bytes (which the fuzzer mutates
 * like the others), giving piece lengths from 1 to max. */
typedef struct {
  uint32_t s;
} Cuts;

static inline Cuts cuts_from(const uint8_t* data, size_t n)
{
  uint32_t s = 0x9e3779b9u;
  for (size_t i = n >= 4 ? n - 4 : 0; i < n; i++) s = s * 31 + data[i];
  return (Cuts){s ? s : 1};
}

static inline size_t cut_next(Cuts* c, size_t max)
{
  c->s ^= c->s << 13;
  c->s ^= c->s >> 17;
  c->s ^= c->s << 5;
  /* mostly small pieces (the edge cases), now and then a large one */
  size_t n = (c->s & 3) == 0 ? (c->s >> 2) % max : (c->s >> 2) % 16;
  return n ? n : 1;
}

/* Read and drop what a socket has for now (the client's side of the server's answers). */
static inline void drain(int fd)
{
  uint8_t sink[65536];
  while (read(fd, sink, sizeof sink) > 0) {
  }
}

#endif
