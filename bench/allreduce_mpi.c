// OpenMPI's MPI_Allreduce as a peer of `allreduce_bench allreduce` (same sizes,
// same method, same output format, prefix "mpi"); bench/allreduce_bench.sh runs it
// with mpirun -np 2 next to the SDK and torch's Gloo:
//   allreduce_mpi [max_bytes]
//                     bus bandwidth (nccl-tests: busbw = S/t * 2(n-1)/n),
//                     f32 sum in place, 4 KiB .. 256 MiB, median per call
// The buffer is allocated and touched once, then reused (first-touch page faults
// are slow on these VMs). Each measured call follows a barrier; warm-up calls
// come first. Rank 0 prints one line per size. OpenMPI as shipped: from 64 MiB its
// allreduce mallocs a scratch buffer per call, which glibc maps fresh (above the 32 MiB
// mmap threshold), and it collapses; GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (for every
// peer of the run) or glibc.malloc.mmap_max=0 avoids that.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int CompareDouble(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);

  /* Optional argument: the largest size (bytes, default 256 MiB). */
  const size_t max_bytes = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : (size_t)256 << 20;
  float* buf = malloc(max_bytes);
  double* t = malloc(200 * sizeof(double));
  if (!buf || !t) {
    fprintf(stderr, "allreduce_mpi: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (size_t i = 0; i < max_bytes / 4; ++i) buf[i] = 1.0f;  // touched once

  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const int count = (int)(bytes / 4);
    const int iters = bytes <= (1 << 20) ? 200 : bytes <= (16 << 20) ? 30 : 7;
    const int warmup = bytes <= (1 << 20) ? 10 : 2;
    for (int i = 0; i < warmup; ++i)
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < iters; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      t[i] = MPI_Wtime() - t0;
    }
    qsort(t, (size_t)iters, sizeof(double), CompareDouble);
    const double median = t[iters / 2];
    const double busbw = bytes / median * 2.0 * (n - 1) / n / 1e9;
    if (rank == 0)
      printf("mpi allreduce bytes=%zu ranks=%d median_ms=%.4f busbw_GBps=%.3f\n", bytes, n,
             median * 1e3, busbw);
    fflush(stdout);
  }
  free(t);
  free(buf);
  MPI_Finalize();
  return 0;
}
