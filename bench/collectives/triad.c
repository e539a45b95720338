/*
 * The memory-bandwidth ceiling beside `shardc bench collectives`: STREAM's triad
 * a[i] = b[i] + s * c[i] over three arrays of doubles far larger than the caches, on
 * OMP_NUM_THREADS threads (run.sh uses 2). Prints the best of 10 passes as JSON, counting
 * 24 bytes per element as STREAM does (the write-allocate traffic is not counted):
 *   {"impl":"triad","threads":2,"elements":20000000,"best_gbs":25.1}
 *
 * Build: cc -O3 -march=native -fopenmp -o triad triad.c
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000000L;
    if (n <= 0) {
        fprintf(stderr, "usage: triad [elements per array]\n");
        return 2;
    }
    double *a = malloc(sizeof(double) * (size_t)n);
    double *b = malloc(sizeof(double) * (size_t)n);
    double *c = malloc(sizeof(double) * (size_t)n);
    if (!a || !b || !c) {
        fprintf(stderr, "triad: cannot allocate 3 x %ld doubles\n", n);
        return 1;
    }
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        a[i] = 0.0;
        b[i] = 1.0;
        c[i] = 2.0;
    }
    const double s = 3.0;
    double best = 1e30;
    for (int pass = 0; pass < 10; pass++) {
        double t0 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        double t = omp_get_wtime() - t0;
        if (t < best) best = t;
    }
    if (a[n / 2] != 7.0) {
        fprintf(stderr, "triad: wrong result %g\n", a[n / 2]);
        return 1;
    }
    printf("{\"impl\":\"triad\",\"threads\":%d,\"elements\":%ld,\"best_gbs\":%.2f}\n",
           omp_get_max_threads(), n, 24.0 * (double)n / best / 1e9);
    free(a);
    free(b);
    free(c);
    return 0;
}
