/* A tight stat(2) loop for bench/cache.py: stat every path listed in LIST (one per line, relative to
 * ROOT), PASSES times, and print one JSON line per pass: {"pass":N,"files":N,"errors":N,"seconds":S,"per_s":R}.
 *
 *     statbench ROOT LIST [PASSES] [--barrier]
 *
 * The list is read into memory first, so only the stat calls are timed. With --barrier it then prints
 * "ready", and starts when a line arrives on stdin: several clients started together begin at once. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ROOT LIST [PASSES]\n", argv[0]);
        return 2;
    }
    int passes = argc > 3 ? atoi(argv[3]) : 1;
    if (passes < 1 || passes > 100) passes = 1;
    int dirfd = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (dirfd < 0) {
        perror(argv[1]);
        return 1;
    }
    FILE *f = fopen(argv[2], "r");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    size_t cap = 1024, n = 0;
    char **paths = malloc(cap * sizeof *paths);
    char *line = NULL;
    size_t len = 0;
    ssize_t got;
    while ((got = getline(&line, &len, f)) > 0) {
        if (line[got - 1] == '\n') line[--got] = 0;
        if (got == 0) continue;
        if (n == cap) paths = realloc(paths, (cap *= 2) * sizeof *paths);
        paths[n++] = strdup(line);
    }
    fclose(f);
    free(line);
    if (argc > 4 && strcmp(argv[4], "--barrier") == 0) {
        char go[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(go, sizeof go, stdin)) return 1;
    }
    for (int p = 1; p <= passes; p++) {
        size_t errors = 0;
        struct stat st;
        double t0 = now();
        for (size_t i = 0; i < n; i++)
            if (fstatat(dirfd, paths[i], &st, 0) != 0) errors++;
        double dt = now() - t0;
        printf("{\"pass\":%d,\"files\":%zu,\"errors\":%zu,\"seconds\":%.6f,\"per_s\":%.1f}\n", p, n, errors, dt,
               dt > 0 ? n / dt : 0.0);
        fflush(stdout);
    }
    return 0;
}
