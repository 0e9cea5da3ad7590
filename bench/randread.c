/* Random 4 KiB reads of one file by T threads for S seconds, for bench/hotpath.py; prints one JSON line:
 * {"threads":T,"ops":N,"seconds":S,"per_s":R,"errors":E}.
 *
 *     randread FILE THREADS SECONDS [--direct]
 *
 * With --direct the file is opened O_DIRECT: on a FUSE mount every read then reaches the daemon (the
 * kernel's page cache is out of the way); on a local file system it reads the disk. Each thread stops at
 * the deadline or after 50,000,000 reads. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 4096
#define MAX_OPS 50000000L

static int fd;
static off_t blocks;
static double deadline;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct result {
    long ops, errors;
    uint64_t seed;
};

static void *worker(void *arg) {
    struct result *r = arg;
    void *buf;
    if (posix_memalign(&buf, BLOCK, BLOCK) != 0) return NULL;
    uint64_t x = r->seed;
    while (r->ops < MAX_OPS) {
        for (int i = 0; i < 64; i++) {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            off_t b = (off_t)((x * 0x2545F4914F6CDD1DULL) % (uint64_t)blocks);
            if (pread(fd, buf, BLOCK, b * BLOCK) != BLOCK) r->errors++;
            r->ops++;
        }
        if (now() >= deadline) break;
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s FILE THREADS SECONDS [--direct]\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[2]);
    double seconds = atof(argv[3]);
    if (threads < 1 || threads > 256 || seconds <= 0 || seconds > 600) {
        fprintf(stderr, "threads 1-256, seconds 0-600\n");
        return 2;
    }
    int flags = O_RDONLY;
    if (argc > 4 && strcmp(argv[4], "--direct") == 0) flags |= O_DIRECT;
    fd = open(argv[1], flags);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < BLOCK) {
        fprintf(stderr, "%s: too small\n", argv[1]);
        return 1;
    }
    blocks = st.st_size / BLOCK;
    pthread_t *tid = calloc(threads, sizeof *tid);
    struct result *res = calloc(threads, sizeof *res);
    double t0 = now();
    deadline = t0 + seconds;
    for (int t = 0; t < threads; t++) {
        res[t].seed = 0x9E3779B97F4A7C15ULL ^ (uint64_t)(t + 1);
        pthread_create(&tid[t], NULL, worker, &res[t]);
    }
    long ops = 0, errors = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        ops += res[t].ops;
        errors += res[t].errors;
    }
    double dt = now() - t0;
    printf("{\"threads\":%d,\"ops\":%ld,\"seconds\":%.6f,\"per_s\":%.1f,\"errors\":%ld}\n", threads, ops, dt,
           dt > 0 ? ops / dt : 0.0, errors);
    return errors ? 1 : 0;
}
