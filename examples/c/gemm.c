/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * gemm: C = A * B on the rbln NPU through librbln_umd's C API.
 *
 * A (64x48) and B (48x80) are random floats. They are staged in a host
 * buffer, DMA'd into device DRAM, multiplied there by a GEMM compute
 * descriptor, and C is DMA'd back and checked against a CPU reference.
 * Device timestamps around each step and the wall-clock submit->fence time
 * are printed. Exit status 0 when the result is right.
 *
 * usage: gemm [user|kernel] [device-index]
 *   user   (default) user-mode submission: ring + doorbell, no syscall
 *   kernel submission through the RBLN_IOCTL_SUBMIT ioctl
 *
 * Build: examples/c/build.sh (pkg-config --cflags --libs rbln_umd).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rbln_umd.h>

enum { M = 64, K = 48, N = 80, REPEATS = 20 };

/* Fail with the library's message: what went wrong and what to do. */
#define CHECK(call)                                                              \
    do {                                                                         \
        rbln_status st_ = (call);                                                \
        if (st_ != RBLN_OK) {                                                    \
            fprintf(stderr, "gemm: %s failed: %s\n  [%s]\n", #call,             \
                    rbln_last_error(), rbln_strerror(st_));                      \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* The step of the monotonic clock (coarse when the guest kernel fell back
 * to a jiffies clocksource). */
static double clock_step_us(void)
{
    double a = now_us(), b;
    while ((b = now_us()) == a)
        ;
    return b - a;
}

/* Deterministic floats in [-1, 1). */
static float rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((*s >> 40) / (double)(1 << 24) * 2.0 - 1.0);
}

static uint64_t page_round(uint64_t v)
{
    return (v + 4095) & ~(uint64_t)4095;
}

int main(int argc, char **argv)
{
    const char *mode_name = argc > 1 ? argv[1] : "user";
    uint32_t index = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 0;
    rbln_queue_mode mode;
    if (strcmp(mode_name, "user") == 0) {
        mode = RBLN_QUEUE_USER;
    } else if (strcmp(mode_name, "kernel") == 0) {
        mode = RBLN_QUEUE_KERNEL;
    } else {
        fprintf(stderr, "usage: %s [user|kernel] [device-index]\n", argv[0]);
        return 2;
    }
    if (rbln_umd_abi_version() != RBLN_UMD_ABI_VERSION) {
        fprintf(stderr, "gemm: librbln_umd ABI %u, header %u: rebuild\n", rbln_umd_abi_version(),
                RBLN_UMD_ABI_VERSION);
        return 1;
    }

    rbln_device *dev;
    CHECK(rbln_device_open(index, &dev));
    rbln_device_info info;
    CHECK(rbln_device_get_info(dev, &info));
    printf("rbln%u: hardware %u.%u, driver %u.%u.%u, %u queues, %u compute cores, %llu MiB DRAM\n",
           info.index, info.hw_version >> 16, info.hw_version & 0xffff, info.driver_version >> 16,
           (info.driver_version >> 8) & 0xff, info.driver_version & 0xff, info.num_queues,
           info.num_cores, (unsigned long long)(info.dram_size >> 20));

    /* Layout (same offsets in the host staging buffer and in DRAM). */
    const uint64_t size_a = (uint64_t)M * K * sizeof(float);
    const uint64_t size_b = (uint64_t)K * N * sizeof(float);
    const uint64_t size_c = (uint64_t)M * N * sizeof(float);
    const uint64_t off_a = 0, off_b = page_round(size_a), off_c = off_b + page_round(size_b);
    const uint64_t off_ts = off_c + page_round(size_c); /* host only: 4 timestamps */
    const uint64_t dram_size = off_ts;

    rbln_buffer *host, *dram;
    CHECK(rbln_buffer_alloc(dev, off_ts + 4096, RBLN_PLACEMENT_HOST, &host));
    CHECK(rbln_buffer_alloc(dev, dram_size, RBLN_PLACEMENT_DRAM, &dram));
    uint64_t host_va, dram_va;
    CHECK(rbln_buffer_map(host, RBLN_PERM_RW, &host_va));
    CHECK(rbln_buffer_map(dram, RBLN_PERM_RW, &dram_va));

    float *a = malloc(size_a), *b = malloc(size_b), *c = malloc(size_c);
    if (!a || !b || !c) {
        fprintf(stderr, "gemm: out of memory\n");
        return 1;
    }
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < M * K; i++)
        a[i] = rnd(&seed);
    for (int i = 0; i < K * N; i++)
        b[i] = rnd(&seed);
    CHECK(rbln_buffer_write(host, off_a, a, size_a));
    CHECK(rbln_buffer_write(host, off_b, b, size_b));

    /* upload A, B -> GEMM in DRAM -> download C, with timestamps between. */
    rbln_cmdbuf *cb;
    CHECK(rbln_cmdbuf_create(dev, &cb));
    CHECK(rbln_cmdbuf_timestamp(cb, host, off_ts + 0));
    CHECK(rbln_cmdbuf_copy(cb, host, off_a, dram, off_a, size_a));
    CHECK(rbln_cmdbuf_copy(cb, host, off_b, dram, off_b, size_b));
    CHECK(rbln_cmdbuf_timestamp(cb, host, off_ts + 8));
    CHECK(rbln_cmdbuf_gemm(cb, M, N, K, dram, off_a, dram, off_b, dram, off_c));
    CHECK(rbln_cmdbuf_timestamp(cb, host, off_ts + 16));
    CHECK(rbln_cmdbuf_copy(cb, dram, off_c, host, off_c, size_c));
    CHECK(rbln_cmdbuf_timestamp(cb, host, off_ts + 24));

    rbln_queue *q;
    CHECK(rbln_queue_create(dev, 0, mode, &q));

    const uint64_t timeout_ns = 10ull * 1000 * 1000 * 1000;
    double t0 = now_us();
    rbln_fence fence;
    CHECK(rbln_queue_submit(q, cb, &fence));
    CHECK(rbln_fence_wait(q, fence, timeout_ns));
    double first_us = now_us() - t0;

    CHECK(rbln_buffer_read(host, off_c, c, size_c));
    uint64_t ts[4];
    CHECK(rbln_buffer_read(host, off_ts, ts, sizeof(ts)));

    /* CPU reference. */
    double max_err = 0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double want = 0;
            for (int l = 0; l < K; l++)
                want += (double)a[i * K + l] * b[l * N + j];
            double err = fabs(c[i * N + j] - want);
            if (!(err <= max_err)) /* also catches NaN */
                max_err = err;
        }
    }

    /* Resubmit the same command buffer (no re-upload) for a steadier time. */
    double total = 0, best = 1e30;
    for (int r = 0; r < REPEATS; r++) {
        double s = now_us();
        CHECK(rbln_queue_submit(q, cb, &fence));
        CHECK(rbln_fence_wait(q, fence, timeout_ns));
        double d = now_us() - s;
        total += d;
        if (d < best)
            best = d;
    }

    printf("gemm %dx%d * %dx%d on the NPU (%s queue %u, fence %llu)\n", M, K, K, N, mode_name,
           rbln_queue_id(q), (unsigned long long)fence.value);
    printf("  device: upload %.1f us, GEMM %.1f us, download %.1f us\n", (ts[1] - ts[0]) / 1e3,
           (ts[2] - ts[1]) / 1e3, (ts[3] - ts[2]) / 1e3);
    printf("  submit->fence: first %.1f us, then mean %.1f us, best %.1f us over %d runs\n", first_us,
           total / REPEATS, best, REPEATS);
    double step = clock_step_us();
    if (step > 1000)
        printf("  (the guest's clock advances in %.0f us steps: wall times are that coarse)\n", step);
    printf("  max abs error vs CPU reference: %.3g\n", max_err);

    rbln_queue_destroy(q);
    rbln_cmdbuf_destroy(cb);
    rbln_buffer_free(dram);
    rbln_buffer_free(host);
    rbln_device_close(dev);
    free(a);
    free(b);
    free(c);

    if (!(max_err <= 1e-3)) {
        printf("FAIL: max abs error %.3g > 1e-3\n", max_err);
        return 1;
    }
    if (!(ts[0] <= ts[1] && ts[1] <= ts[2] && ts[2] <= ts[3])) {
        printf("FAIL: device timestamps out of order\n");
        return 1;
    }
    printf("PASS\n");
    return 0;
}
