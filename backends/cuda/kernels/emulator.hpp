// Runs shardc's CUDA kernel sources on the host: each block's threads are OS threads, blocks
// one after another; `__shared__` arrays are static (one block runs at a time); barriers are
// a std::barrier over the block; warp shuffles go through a shared slot array between two
// barriers (every kernel calls them with the whole block, see prelude.cuh).
#include <math.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <barrier>
#include <thread>
#include <vector>
#include <utility>
#include <type_traits>

struct dim3 {
    unsigned x, y, z;
};

namespace shardc_emu {
inline thread_local dim3 thread_idx{0, 0, 0};
inline thread_local dim3 block_idx{0, 0, 0};
inline dim3 block_dim{1, 1, 1};
inline dim3 grid_dim{1, 1, 1};
inline std::barrier<>* bar = nullptr;
inline double shfl_slots[1024];
}  // namespace shardc_emu

#define threadIdx (shardc_emu::thread_idx)
#define blockIdx (shardc_emu::block_idx)
#define blockDim (shardc_emu::block_dim)
#define gridDim (shardc_emu::grid_dim)
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static

inline void __syncthreads() { shardc_emu::bar->arrive_and_wait(); }

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
    unsigned t = threadIdx.x;
    shardc_emu::shfl_slots[t] = (double)v;
    __syncthreads();
    T r = (T)shardc_emu::shfl_slots[(t & ~31u) | ((t & 31u) ^ (unsigned)mask)];
    __syncthreads();
    return r;
}

namespace shardc_emu {
template <typename... A, std::size_t... I>
inline void call(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(args[I])...);
}
template <typename... A>
inline void invoke(void (*f)(A...), void** args) {
    call(f, args, std::index_sequence_for<A...>{});
}
}  // namespace shardc_emu

// Runs `thunk(args)` on a grid of `grid` blocks of `block` threads. Returns 0, or -1 when the
// threads could not be started.
extern "C" int shardc_emu_launch(void (*thunk)(void**), unsigned grid, unsigned block,
                                 void** args) {
    if (block == 0 || block > 1024 || grid == 0) return -1;
    shardc_emu::block_dim = dim3{block, 1, 1};
    shardc_emu::grid_dim = dim3{grid, 1, 1};
    std::barrier<> b((std::ptrdiff_t)block);
    shardc_emu::bar = &b;
    std::vector<std::thread> threads;
    threads.reserve(block);
    try {
        for (unsigned t = 0; t < block; ++t) {
            threads.emplace_back([=]() {
                shardc_emu::thread_idx = dim3{t, 0, 0};
                for (unsigned g = 0; g < grid; ++g) {
                    shardc_emu::block_idx = dim3{g, 0, 0};
                    thunk(args);
                    __syncthreads();
                }
            });
        }
    } catch (...) {
        // Threads already started wait at the barrier forever: detach them is not safe either,
        // so report and abort the process rather than hang.
        std::abort();
    }
    for (auto& th : threads) th.join();
    return 0;
}
