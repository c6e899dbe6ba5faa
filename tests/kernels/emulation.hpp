// Runs the engine's CUDA C kernels on the CPU, for tests on machines without a GPU.
//
// Each block runs as one std::thread per CUDA thread; blocks run one after another, so a
// kernel's `__shared__` variables (static locals here) are the block's shared memory.
// `__syncthreads` is a barrier over the block's threads and a warp shuffle is an exchange
// between the lanes of a warp. This checks the kernels' arithmetic, indexing and
// synchronisation logic; it says nothing about their speed.


#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct uint4 {
    unsigned int x, y, z, w;
};

struct dim3e {
    unsigned x = 1, y = 1, z = 1;
};

inline thread_local dim3e threadIdx;
inline thread_local dim3e blockIdx;
inline dim3e blockDim;
inline dim3e gridDim;

struct WarpExchange {
    std::unique_ptr<std::barrier<>> barrier;
    unsigned long long slot[32];
    int lanes = 0;
};

inline std::unique_ptr<std::barrier<>> block_barrier;
inline std::vector<WarpExchange> warp_exchanges;

inline void __syncthreads() { block_barrier->arrive_and_wait(); }

template <class T>
T __shfl_xor_sync(unsigned, T value, int offset) {
    WarpExchange& w = warp_exchanges[threadIdx.x / 32];
    const int lane = threadIdx.x % 32;
    std::memcpy(&w.slot[lane], &value, sizeof(T));
    w.barrier->arrive_and_wait();
    int source = lane ^ offset;
    if (source >= w.lanes) {
        source = lane;
    }
    T result;
    std::memcpy(&result, &w.slot[source], sizeof(T));
    w.barrier->arrive_and_wait();
    return result;
}

inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
using std::isnan;
template <class T> T min(T a, T b) { return a < b ? a : b; }
template <class T> T max(T a, T b) { return a < b ? b : a; }

// Runs `kernel` over a grid of 1-D blocks.
template <class Kernel>
void emulate(dim3e grid, unsigned threads, Kernel kernel) {
    gridDim = grid;
    blockDim = dim3e{threads, 1, 1};
    for (unsigned z = 0; z < grid.z; ++z) {
        for (unsigned y = 0; y < grid.y; ++y) {
            for (unsigned x = 0; x < grid.x; ++x) {
                block_barrier = std::make_unique<std::barrier<>>(threads);
                warp_exchanges = std::vector<WarpExchange>((threads + 31) / 32);
                for (unsigned w = 0; w < warp_exchanges.size(); ++w) {
                    const int lanes = (int)std::min(32u, threads - w * 32);
                    warp_exchanges[w].lanes = lanes;
                    warp_exchanges[w].barrier = std::make_unique<std::barrier<>>(lanes);
                }
                std::vector<std::thread> team;
                team.reserve(threads);
                for (unsigned t = 0; t < threads; ++t) {
                    team.emplace_back([=] {
                        threadIdx = dim3e{t, 0, 0};
                        blockIdx = dim3e{x, y, z};
                        kernel();
                    });
                }
                for (auto& thread : team) {
                    thread.join();
                }
            }
        }
    }
}
