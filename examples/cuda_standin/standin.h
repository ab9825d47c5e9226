/* Shared by the stand-in CUDA/NCCL libraries: configurable delays (env vars,
 * read at every call so a test can set them per process). */
#ifndef STANDIN_H
#define STANDIN_H
#include <stdlib.h>
#include <time.h>

/* Sleep for the number of microseconds in env var `name` (0 or unset: none). */
__attribute__((unused)) static void standin_delay(const char *name)
{
    const char *text = getenv(name);
    long us = text ? atol(text) : 0;
    if (us <= 0)
        return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0)
        ;
}
#endif
