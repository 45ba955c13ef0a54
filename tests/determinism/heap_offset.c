// An LD_PRELOAD shim that moves every heap block off its usual alignment, to show whether a
// program's results depend on where the heap puts a buffer. CAVIAR_HEAP_OFFSET=B (bytes, 0..63)
// makes each malloc/calloc/realloc return an address that is B bytes past a 64-byte boundary
// (glibc returns 16-byte aligned blocks whose position within a cache line varies from run to
// run; this fixes it to one chosen value). Requests for a stronger alignment (posix_memalign,
// aligned_alloc, memalign) keep it: their offset is B rounded down to a multiple of the
// alignment. B = 8 breaks malloc's 16-byte promise on purpose: code that needs 16-byte alignment
// from plain malloc would crash under it, which is worth knowing too.
//
// Every block carries a 32-byte header just below the returned address (magic, the address glibc
// gave, the requested size), so free/realloc can find the original block. Pointers without the
// magic (from before the shim was loaded) go to glibc untouched.
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern void* __libc_malloc(size_t);
extern void* __libc_memalign(size_t, size_t);
extern void __libc_free(void*);

enum { kHeader = 32, kLine = 64 };
static const uint64_t kMagic = 0x63617669617248ULL;  // "caviarH"

struct header {
  uint64_t magic;
  void* base;
  size_t size;
  uint64_t check;  // magic ^ size: a stray match of the magic alone is not enough
};

// Configuration, read once: a fixed offset, or "random:SEED" for an offset in {0, 16, 32, 48}
// drawn per allocation from (SEED, allocation count). CAVIAR_HEAP_RANGE=A:B (diagnosis) applies
// the offset only to allocations A..B-1, in order of allocation, and 0 to the rest.
static int configured = 0;
static long fixed_offset = 0;
static uint64_t random_seed = 0;
static int random_mode = 0;
static uint64_t range_begin = 0, range_end = UINT64_MAX;
static uint64_t count = 0;

static void configure(void) {
  configured = 1;
  const char* s = getenv("CAVIAR_HEAP_OFFSET");
  if (s && strncmp(s, "random:", 7) == 0) {
    random_mode = 1;
    random_seed = strtoull(s + 7, NULL, 10);
  } else if (s) {
    fixed_offset = strtol(s, NULL, 10) % kLine;
  }
  const char* r = getenv("CAVIAR_HEAP_RANGE");
  if (r) {
    char* end = NULL;
    range_begin = strtoull(r, &end, 10);
    if (end && *end == ':') range_end = strtoull(end + 1, NULL, 10);
  }
}

static uint64_t mix(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static size_t offset_for(size_t align) {
  if (!configured) configure();
  const uint64_t i = __atomic_fetch_add(&count, 1, __ATOMIC_RELAXED);
  if (align >= kLine || i < range_begin || i >= range_end) return 0;
  const size_t want = random_mode ? (size_t)(mix(random_seed * 0x9e3779b97f4a7c15ULL + i) % 4) * 16
                                  : (size_t)fixed_offset;
  return (want / align) * align;
}

static void* place(size_t size, size_t align) {
  const size_t offset = offset_for(align);
  if (align < kLine) align = kLine;
  // Room for the header below the payload, and for the offset.
  const size_t pad = align + kHeader + kLine;
  if (size > SIZE_MAX - pad) return NULL;
  char* base = __libc_memalign(align, size + pad);
  if (!base) return NULL;
  char* user = base + ((kHeader + align - 1) / align) * align + offset;
  struct header* h = (struct header*)(user - kHeader);
  h->magic = kMagic;
  h->base = base;
  h->size = size;
  h->check = kMagic ^ size;
  return user;
}

static struct header* ours(void* p) {
  if (!p) return NULL;
  struct header* h = (struct header*)((char*)p - kHeader);
  return (h->magic == kMagic && h->check == (kMagic ^ h->size)) ? h : NULL;
}

void* malloc(size_t size) {
  return place(size, 16);
}

void free(void* p) {
  struct header* h = ours(p);
  if (!h) {
    if (p) __libc_free(p);
    return;
  }
  h->magic = 0;
  __libc_free(h->base);
}

void* calloc(size_t n, size_t size) {
  if (size && n > SIZE_MAX / size) return NULL;
  void* p = place(n * size, 16);
  if (p) memset(p, 0, n * size);
  return p;
}

void* realloc(void* p, size_t size) {
  if (!p) return malloc(size);
  if (size == 0) {
    free(p);
    return NULL;
  }
  struct header* h = ours(p);
  // A block glibc gave before the shim was loaded: its size is unknown, so it cannot be moved.
  if (!h) return NULL;
  void* q = malloc(size);
  if (!q) return NULL;
  memcpy(q, p, h->size < size ? h->size : size);
  free(p);
  return q;
}

int posix_memalign(void** out, size_t align, size_t size) {
  void* p = place(size, align);
  if (!p) return 12;  // ENOMEM
  *out = p;
  return 0;
}

void* aligned_alloc(size_t align, size_t size) {
  return place(size, align);
}
void* memalign(size_t align, size_t size) {
  return place(size, align);
}

void* valloc(size_t size) {
  return place(size, 4096);
}

size_t malloc_usable_size(void* p) {
  struct header* h = ours(p);
  return h ? h->size : 0;
}
