/*
 * tbprof: a QEMU TCG plugin that counts the guest instructions executed
 * per translation block, to see where the emulated CPU's time goes (a
 * guest under TCG has no working perf). Built and used as README.md,
 * "Debugging", says (scripts/guest-profile/build.sh, VM_QEMU_EXTRA).
 *
 * Control: the plugin polls /run/rbln/tbprof.cmd (the VM's run directory,
 * which the guest sees at the same path) every 50 ms; write the command
 * into another file there and rename it to tbprof.cmd, so that it is
 * never read half written:
 *   "reset"       zero every count;
 *   "dump PATH"   write "VADDR INSNS_EXECUTED INSNS_PER_BLOCK" lines for
 *                 every block that ran since the last reset (PATH as QEMU
 *                 sees it: the repo is /rbln);
 * and answers by writing the command to /run/rbln/tbprof.ack.
 *
 * Debian ships no qemu-plugin.h, so the few entry points used are declared
 * here, for QEMU 11.1's plugin API (version 7, the sysroot's QEMU): its
 * translation callback is (block, userdata), its execution callback
 * (vcpu_index, userdata). Counts are instructions, not time: helpers,
 * MMIO and TLB refills cost more per instruction.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef uint64_t qemu_plugin_id_t;
typedef struct {
    const char *target_name;
    struct { int min, cur; } version;
    bool system_emulation;
    union { struct { int smp_vcpus, max_vcpus; } system; };
} qemu_info_t;
struct qemu_plugin_tb;
typedef void (*tb_trans_cb_t)(struct qemu_plugin_tb *tb, void *userdata);
typedef void (*vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, tb_trans_cb_t cb, void *userdata);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb *tb, vcpu_udata_cb_t cb, int flags, void *userdata);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);

EXPORT int qemu_plugin_version = 7;

/* One entry per (start address, length): a block retranslated with the
 * same shape keeps its count. Entries are never freed. */
struct block {
    uint64_t vaddr, insns, runs;
    struct block *next;
};
#define BUCKETS (1u << 20)
static struct block *table[BUCKETS];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *CMD = "/run/rbln/tbprof.cmd", *ACK = "/run/rbln/tbprof.ack";

static void on_exec(unsigned int vcpu, void *userdata) {
    struct block *b = userdata;
    __atomic_fetch_add(&b->runs, 1, __ATOMIC_RELAXED);
}

static void on_translate(struct qemu_plugin_tb *tb, void *userdata) {
    uint64_t va = qemu_plugin_tb_vaddr(tb), n = qemu_plugin_tb_n_insns(tb);
    unsigned h = (unsigned)(((va * 0x9E3779B97F4A7C15ull) ^ n) >> 44) & (BUCKETS - 1);
    pthread_mutex_lock(&table_lock);
    struct block *b = table[h];
    while (b && !(b->vaddr == va && b->insns == n))
        b = b->next;
    if (!b && (b = calloc(1, sizeof *b))) {
        b->vaddr = va;
        b->insns = n;
        b->next = table[h];
        table[h] = b;
    }
    pthread_mutex_unlock(&table_lock);
    if (b)
        qemu_plugin_register_vcpu_tb_exec_cb(tb, on_exec, 0, b);
}

static void reset(void) {
    for (unsigned i = 0; i < BUCKETS; i++)
        for (struct block *b = table[i]; b; b = b->next)
            __atomic_store_n(&b->runs, 0, __ATOMIC_RELAXED);
}

static void dump(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "tbprof: cannot write %s\n", path);
        return;
    }
    for (unsigned i = 0; i < BUCKETS; i++)
        for (struct block *b = table[i]; b; b = b->next) {
            uint64_t runs = __atomic_load_n(&b->runs, __ATOMIC_RELAXED);
            if (runs)
                fprintf(f, "%llx %llu %llu\n", (unsigned long long)b->vaddr,
                        (unsigned long long)(runs * b->insns), (unsigned long long)b->insns);
        }
    fclose(f);
}

static void *control(void *arg) {
    char cmd[512];
    for (;;) {
        usleep(50000);
        FILE *f = fopen(CMD, "r");
        if (!f)
            continue;
        size_t n = fread(cmd, 1, sizeof cmd - 1, f);
        fclose(f);
        if (n == 0)
            continue; /* created but not written yet: write it elsewhere and rename it */
        unlink(CMD);
        cmd[n] = 0;
        cmd[strcspn(cmd, "\n")] = 0;
        pthread_mutex_lock(&table_lock);
        if (!strcmp(cmd, "reset"))
            reset();
        else if (!strncmp(cmd, "dump ", 5))
            dump(cmd + 5);
        else
            fprintf(stderr, "tbprof: unknown command '%s'\n", cmd);
        pthread_mutex_unlock(&table_lock);
        FILE *a = fopen(ACK, "w");
        if (a) {
            fputs(cmd, a);
            fclose(a);
        }
    }
    return NULL;
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    if (info->version.min > qemu_plugin_version || info->version.cur < qemu_plugin_version) {
        fprintf(stderr, "tbprof: written for plugin API 7, QEMU offers %d..%d\n", info->version.min, info->version.cur);
        return -1;
    }
    pthread_t t;
    if (pthread_create(&t, NULL, control, NULL))
        return -1;
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate, NULL);
    return 0;
}
