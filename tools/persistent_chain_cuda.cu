// The draft step's four GEMMs a layer (x -> qkv -> o -> gate/up -> down -> x, 64 rows) in one persistent launch
// whose weight stream never waits for a phase boundary (tools/persistent_chain_cuda.py builds and times it).
//
// One CTA a SM, four warps; each warp owns 16 of the 64 rows. A CTA walks its schedule -- every phase (one GEMM
// of one layer), its tiles (32 output columns, tile = cta, cta + grid, ...), each tile's K chunks (128 columns) --
// and keeps STAGES - 1 weight chunks in flight with cp.async. The issue cursor runs over the same schedule, so at
// the end of a phase the next phase's first weight chunks are already loading while the CTA waits at the grid
// barrier for the phase's outputs (weights never depend on them). The activations (the previous phase's output,
// written by other SMs) are read after the barrier, from L2 (ld.global.cg), one chunk ahead in registers.
// bf16 in, fp32 accumulation (mma.sync m16n8k16), bf16 out.
#include <cuda_bf16.h>
#include <cstdint>

namespace {

constexpr int BN = 32;                        // output columns a tile
constexpr int BK = 128;                       // K columns a chunk
constexpr int THREADS = 128;                  // four warps, 16 rows each
constexpr int SROW = BK * 2 + 16;             // bytes a chunk row takes in shared memory: padded off the banks
constexpr int STAGE_BYTES = BN * SROW;
constexpr int SEGMENTS = BN * BK * 2 / 16;    // 16-byte copies a chunk
constexpr int KSTEPS = BK / 16;               // mma K steps a chunk

struct Phase {                                // one GEMM: out[:64, :n] = x[:64, :k] @ w[n, k].T
  long long w, x, out, ldx, ldo, n, k;        // pointers as integers; leading dimensions in elements
};

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragments of one chunk (KSTEPS steps of 16 columns) for the warp's 16 rows, from L2.
__device__ __forceinline__ void load_a(uint32_t (&a)[KSTEPS][4], const __nv_bfloat16* x, long long ldx, int row,
                                       long long k0, int t) {
  const __nv_bfloat16* r0 = x + row * ldx + k0 + t * 2;
  const __nv_bfloat16* r8 = r0 + 8 * ldx;
#pragma unroll
  for (int s = 0; s < KSTEPS; ++s) {
    a[s][0] = __ldcg(reinterpret_cast<const unsigned*>(r0 + s * 16));
    a[s][1] = __ldcg(reinterpret_cast<const unsigned*>(r8 + s * 16));
    a[s][2] = __ldcg(reinterpret_cast<const unsigned*>(r0 + s * 16 + 8));
    a[s][3] = __ldcg(reinterpret_cast<const unsigned*>(r8 + s * 16 + 8));
  }
}

}  // namespace

// STAGES: chunks in shared memory, STAGES - 1 of them in flight.
template <int STAGES>
__global__ void __launch_bounds__(THREADS, 1)
    chain_kernel(const Phase* __restrict__ phases, int num_phases, unsigned* counter) {
  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int grid = gridDim.x, cta = blockIdx.x, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  // The issue cursor: the next weight chunk to load (phase, tile, chunk) and how many were issued.
  int ip = 0, it = cta, ic = 0, issued = 0;
  auto issue_next = [&]() {
    while (ip < num_phases && it >= phases[ip].n / BN) {  // a phase with no tile for this CTA
      ++ip;
      it = cta;
      ic = 0;
    }
    if (ip < num_phases) {
      const Phase ph = phases[ip];
      const __nv_bfloat16* w = reinterpret_cast<const __nv_bfloat16*>(ph.w) + (long long)it * BN * ph.k + ic * BK;
      const uint32_t stage = smem_base + (issued % STAGES) * STAGE_BYTES;
#pragma unroll
      for (int i = 0; i < SEGMENTS / THREADS; ++i) {
        const int seg = tid + i * THREADS, row = seg / (BK / 8), col = seg % (BK / 8);
        cp_async16(stage + row * SROW + col * 16, w + row * ph.k + col * 8);
      }
      ++issued;
      if (++ic == ph.k / BK) {
        ic = 0;
        it += grid;
      }
    }
    cp_commit();  // one group an iteration, empty past the schedule's end, so the wait counts stay aligned
  };

  for (int s = 0; s < STAGES - 1; ++s) issue_next();
  int consumed = 0;
  for (int p = 0; p < num_phases; ++p) {
    const Phase ph = phases[p];
    const __nv_bfloat16* x = reinterpret_cast<const __nv_bfloat16*>(ph.x);
    const int chunks = ph.k / BK, row = warp * 16 + g;
    for (int tile = cta; tile < ph.n / BN; tile += grid) {
      float acc[BN / 8][4] = {};
      uint32_t a[KSTEPS][4], a_next[KSTEPS][4];
      load_a(a, x, ph.ldx, row, 0, t);
      for (int c = 0; c < chunks; ++c) {
        cp_wait<STAGES - 2>();
        __syncthreads();  // chunk `consumed` has landed for every thread's copies; its stage is free to read
        if (c + 1 < chunks) load_a(a_next, x, ph.ldx, row, (long long)(c + 1) * BK, t);
        const unsigned char* stage = smem + (consumed % STAGES) * STAGE_BYTES;
#pragma unroll
        for (int s = 0; s < KSTEPS; ++s) {
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            const unsigned char* wrow = stage + (j * 8 + g) * SROW + (s * 16 + t * 2) * 2;
            mma16816(acc[j], a[s], *reinterpret_cast<const uint32_t*>(wrow),
                     *reinterpret_cast<const uint32_t*>(wrow + 16));
          }
        }
        __syncthreads();  // every warp is done with the stage the next issue overwrites
        issue_next();
        ++consumed;
#pragma unroll
        for (int s = 0; s < KSTEPS; ++s)
#pragma unroll
          for (int q = 0; q < 4; ++q) a[s][q] = a_next[s][q];
      }
      __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(ph.out) + tile * BN + t * 2;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        *reinterpret_cast<__nv_bfloat162*>(out + row * ph.ldo + j * 8) = __floats2bfloat162_rn(acc[j][0], acc[j][1]);
        *reinterpret_cast<__nv_bfloat162*>(out + (row + 8) * ph.ldo + j * 8) =
            __floats2bfloat162_rn(acc[j][2], acc[j][3]);
      }
    }
    // Grid barrier: the phase's outputs written everywhere before any CTA reads them as the next x. The next
    // phase's weight chunks issued above keep loading meanwhile.
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      atomicAdd(counter, 1u);
      const unsigned target = static_cast<unsigned>(p + 1) * grid;
      while (load_acquire(counter) < target) {
      }
      __threadfence();
    }
    __syncthreads();
  }
  cp_wait<0>();  // nothing left in flight
}

// Host entry: one launch over `phases` ([P, 7] int64 on the device) with `stages` chunks in shared memory;
// `counter` is zeroed first. (Left out by
// -DCHAIN_KERNEL_ONLY, which compiles the kernel alone where torch's headers are not at hand.)
#ifdef CHAIN_KERNEL_ONLY
template __global__ void chain_kernel<4>(const Phase*, int, unsigned*);
template __global__ void chain_kernel<8>(const Phase*, int, unsigned*);
template __global__ void chain_kernel<12>(const Phase*, int, unsigned*);
#else
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

template <int STAGES>
void launch(const torch::Tensor& phases, const torch::Tensor& counter, int64_t grid, cudaStream_t stream) {
  constexpr int smem = STAGES * STAGE_BYTES;
  static const bool sized = [] {  // once, on the first (eager) call, never inside a graph capture
    return cudaFuncSetAttribute(chain_kernel<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) ==
           cudaSuccess;
  }();
  TORCH_CHECK(sized, "the chain kernel's shared memory could not be set");
  chain_kernel<STAGES><<<static_cast<unsigned>(grid), THREADS, smem, stream>>>(
      reinterpret_cast<const Phase*>(phases.data_ptr<int64_t>()), static_cast<int>(phases.size(0)),
      reinterpret_cast<unsigned*>(counter.data_ptr<int32_t>()));
}

void chain(torch::Tensor phases, torch::Tensor counter, int64_t grid, int64_t stages) {
  TORCH_CHECK(phases.is_cuda() && phases.dtype() == torch::kInt64 && phases.dim() == 2 && phases.size(1) == 7);
  TORCH_CHECK(counter.is_cuda() && counter.dtype() == torch::kInt32 && counter.numel() == 1);
  auto stream = at::cuda::getCurrentCUDAStream();
  cudaMemsetAsync(counter.data_ptr(), 0, sizeof(unsigned), stream);
  if (stages == 4) {
    launch<4>(phases, counter, grid, stream);
  } else if (stages == 8) {
    launch<8>(phases, counter, grid, stream);
  } else if (stages == 12) {
    launch<12>(phases, counter, grid, stream);
  } else {
    TORCH_CHECK(false, "stages: 4, 8 or 12, got ", stages);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("chain", &chain, "the persistent GEMM chain, one launch"); }
#endif
