/*
 * Open MPI reference of `shardc bench collectives`: AllReduce (sum, f32, in place) at each
 * size, measured the way shardc and the gloo script measure it.
 *
 * Build and run (bench/collectives/run.sh does both):
 *   mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 *   mpirun -n 4 ./mpi_allreduce --sizes 4096,65536 [--iters N]
 *
 * Method (shared by all three sides):
 *   - iterations per size: --iters N, else min(200, max(5, 256 MiB / size));
 *     untimed warm-up iterations: max(2, iters / 10);
 *   - the first warm-up call carries rank + 1 in every element and is checked against
 *     P (P + 1) / 2; the buffer is then zeroed (sums of zeros stay finite);
 *   - every timed call is timed on every rank; the per-call figure is the slowest rank's
 *     (an AllReduce with MPI_MAX of the samples after the loop); the reported latency is the
 *     median of those figures, the algorithm bandwidth size / latency (GB/s, 1e9 bytes).
 *
 * Rank 0 prints one JSON object per size on stdout:
 *   {"impl":"mpi","procs":4,"size_bytes":4096,"iters":200,"median_us":3.1,"algbw_gbs":1.32}
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Parses "4096,64K,1M" (K, M, G: powers of 1024) into sizes; returns their count or -1. */
static int parse_sizes(const char *text, long long *out, int cap) {
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v <= 0) return -1;
        if (*end == 'K' || *end == 'k') { v <<= 10; end++; }
        else if (*end == 'M' || *end == 'm') { v <<= 20; end++; }
        else if (*end == 'G' || *end == 'g') { v <<= 30; end++; }
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (v % 4 != 0 || n == cap) return -1;
        out[n++] = v;
        if (*end == ',') end++;
        else if (*end) return -1;
        p = end;
    }
    return n;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, procs;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &procs);

    long long sizes[64];
    int nsizes = 0, iters_arg = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            nsizes = parse_sizes(argv[++i], sizes, 64);
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters_arg = atoi(argv[++i]);
        } else {
            nsizes = -1;
        }
    }
    if (nsizes <= 0 || iters_arg < 0) {
        if (rank == 0)
            fprintf(stderr,
                    "usage: mpi_allreduce --sizes 4K,64K,1M [--iters N] "
                    "(sizes in bytes, multiples of 4, K/M/G suffixes)\n");
        MPI_Finalize();
        return 2;
    }

    int status = 0;
    for (int s = 0; s < nsizes && status == 0; s++) {
        long long bytes = sizes[s];
        long long count = bytes / 4;
        int iters = iters_arg;
        if (iters == 0) {
            long long by_volume = (256LL << 20) / bytes;
            iters = (int)(by_volume < 5 ? 5 : by_volume > 200 ? 200 : by_volume);
        }
        int warmup = iters / 10 < 2 ? 2 : iters / 10;
        float *buf = malloc((size_t)bytes);
        double *samples = malloc(sizeof(double) * (size_t)iters);
        if (!buf || !samples) {
            fprintf(stderr, "rank %d: cannot allocate %lld bytes\n", rank, bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (long long i = 0; i < count; i++) buf[i] = (float)(rank + 1);
        for (int w = 0; w < warmup; w++) {
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (w == 0) {
                float want = (float)procs * (float)(procs + 1) / 2.0f;
                if (buf[0] != want || buf[count - 1] != want) {
                    fprintf(stderr, "rank %d: AllReduce of %lld bytes gave %g, expected %g\n",
                            rank, bytes, (double)buf[0], (double)want);
                    status = 1;
                }
                memset(buf, 0, (size_t)bytes);
            }
        }
        for (int it = 0; it < iters; it++) {
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            samples[it] = MPI_Wtime() - t0;
        }
        MPI_Allreduce(MPI_IN_PLACE, samples, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, &status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (rank == 0 && status == 0) {
            double med = median(samples, iters);
            printf("{\"impl\":\"mpi\",\"procs\":%d,\"size_bytes\":%lld,\"iters\":%d,"
                   "\"median_us\":%.3f,\"algbw_gbs\":%.4f}\n",
                   procs, bytes, iters, med * 1e6, (double)bytes / med / 1e9);
            fflush(stdout);
        }
        free(buf);
        free(samples);
    }
    MPI_Finalize();
    return status;
}
