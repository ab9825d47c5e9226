/* A CUDA injection library (CUDA_INJECTION64_PATH): GPU time per kernel from CUPTI's activity
 * records, with no change to the program. The driver loads it at cuInit and calls
 * InitializeInjection(); it asks CUPTI for concurrent-kernel records and writes one line per
 * kernel to $OTELBPF_CUPTI_OUT: start_ns, end_ns, duration_ns, stream, correlation id, name.
 * The correlation id is the one CUPTI's runtime/driver API records carry for the launch call,
 * which is what a join to the launching stack would use. Built and run by check.sh. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef KERNEL_RECORD
#define KERNEL_RECORD CUpti_ActivityKernel9 /* CUDA 12.x; pass -DKERNEL_RECORD=... for another CUPTI */
#endif
#define BUFFER_BYTES (8u << 20)

static FILE *out;
static unsigned long long records, dropped;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer, size_t size, size_t valid)
{
    (void)ctx; (void)stream_id; (void)size;
    CUpti_Activity *record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
            continue;
        KERNEL_RECORD *k = (KERNEL_RECORD *)record;
        records++;
        fprintf(out, "%llu\t%llu\t%llu\t%u\t%u\t%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                (unsigned long long)(k->end - k->start), k->streamId, k->correlationId, k->name ? k->name : "?");
    }
    size_t lost = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &lost) == CUPTI_SUCCESS)
        dropped += lost;
    free(buffer);
}

static void finish(void)
{
    cuptiActivityFlushAll(1);
    fprintf(stderr, "cupti_inject: %llu kernel records, %llu dropped\n", records, dropped);
    fclose(out);
}

int InitializeInjection(void)
{
    const char *path = getenv("OTELBPF_CUPTI_OUT");
    out = fopen(path && *path ? path : "cupti_kernels.tsv", "w");
    if (!out)
        return 0;
    CUptiResult status = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (status == CUPTI_SUCCESS)
        status = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (status != CUPTI_SUCCESS) {
        const char *text = "?";
        cuptiGetResultString(status, &text);
        fprintf(stderr, "cupti_inject: CUPTI refused: %s\n", text);
        return 0;
    }
    atexit(finish);
    fprintf(stderr, "cupti_inject: kernel activity records on\n");
    return 1;
}
