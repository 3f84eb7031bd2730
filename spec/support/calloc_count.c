/* calloc_count.c: counts calloc calls; preloaded (LD_PRELOAD) into one luajit
 * child by spec/moe_batch_spec.lua, read there with the FFI (shim_ncalloc).
 * A test tool: its counter is the process's, not a context's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>
static long ncalloc;
static char boot[4096];
static size_t bootn;
static void *(*real)(size_t, size_t);
long shim_ncalloc(void) { return ncalloc; }
void *calloc(size_t n, size_t s) {
    if (!real) {
        static int in;
        if (in) { /* dlsym's own calloc */
            void *p = boot + bootn;
            bootn += (n * s + 15) & ~(size_t)15;
            memset(p, 0, n * s);
            return p;
        }
        in = 1;
        real = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
        in = 0;
    }
    ncalloc++;
    return real(n, s);
}
