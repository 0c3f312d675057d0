// The draft step's four GEMMs a layer (x -> qkv -> o -> gate/up -> down -> x, 64 rows) in one persistent launch
// whose weight stream never waits for a phase boundary (tools/persistent_chain_cuda.py builds and times it).
//
// One CTA a SM, three warp roles over one schedule: every phase (one GEMM of one layer), the CTA's units in it
// (a unit: 128 output columns x one K slice; unit u of a phase goes to CTA (u + offset) % grid, the offset rotating
// so that the layer's units spread evenly), each unit's K chunks of BK columns.
// - WW warps stream weight chunks (128 rows x BK) into an SW-deep shared-memory ring, each lane's 16-byte cp.async
//   counted on the stage's mbarrier. Weights never depend on activations, so they run on across phase boundaries as
//   far as the ring allows: when a phase's activations arrive, its first weight chunks are already in place.
// - the next warp streams the activations' chunks (64 rows x BK, fp32) into an SX-deep ring the same way; each
//   chunk (BK = BN: one output tile of the previous phase) once that tile's units are all counted done. Phases
//   overlap wherever their tiles allow: no grid barrier. Outputs alternate between two buffers a GEMM by layer
//   parity; a phase's start clears the buffer the phase four on adds into, once the phase that last read it is done.
// - MW warps multiply, first in the CTA: each warp's mma.sync m16n8k16 (16 rows x 128 / (MW / 4) columns, weights
//   by ldmatrix) or, with WG, one warpgroup's wgmma m64n128k16 reading the weights from shared memory; x rounded to
//   bf16 as it is read, fp32 accumulation. A unit's partial sums are added into the phase's fp32 output (atomics
//   when K is split, stores when not).
// (1-D bulk copies, one a row, streamed ~0.5 TB/s: 128- and 256-byte copies are too small for the copy engine.)
#include <cuda_bf16.h>
#include <cstdint>

namespace {

constexpr int ROWS = 64;                  // the batch: four row blocks of 16
constexpr int BN = 128;                   // output columns a unit
// BK_: K columns a chunk (BN: the activation warp takes one output tile a chunk). WG_: the weights laid out for
// wgmma, K-major with the 128-byte swizzle (64 columns a 128-byte row, the 16-byte pieces of row r permuted by
// r % 8; 8-row groups 1024 bytes apart, the 64-column halves of K BN x 128 bytes apart), else padded rows for
// ldmatrix.
template <int BK_, bool WG_>
struct Chunk {
  static constexpr int BK = BK_;
  static constexpr bool WG = WG_;
  static constexpr int W_PITCH = BK * 2 + 16;  // bytes a weight row takes in shared memory: padded off the banks
  static constexpr int W_HALF = BN * 128;      // wgmma: bytes between two 64-column halves of K
  static constexpr int W_STAGE = WG ? BN * BK * 2 : BN * W_PITCH;
  // where the 16 bytes at (row r, segment c) of a weight chunk go
  static __device__ __forceinline__ int w_offset(int r, int c) {
    return WG ? c / 8 * W_HALF + r / 8 * 1024 + r % 8 * 128 + (c % 8 ^ r % 8) * 16 : r * W_PITCH + c * 16;
  }
  static constexpr int W_SEGMENTS = BN * BK * 2 / 16;  // 16-byte copies a weight chunk
  static constexpr int X_PITCH = BK * 4 + 32;  // an fp32 activation row, padded so that float2 reads spread over banks
  static constexpr int X_STAGE = ROWS * X_PITCH;
  static constexpr int X_SEGMENTS = ROWS * BK * 4 / 16;
};
constexpr int NO_ACTIVATIONS = 1;         // flags: the activation warp copies nothing (times the weight stream)
constexpr int NO_WAITS = 2;               // flags: activations loaded without waiting for their tiles (times the waits)
constexpr int NO_PRODUCTS = 4;            // flags: the multiplying warps only take and release the chunks
constexpr int NO_WEIGHTS = 8;             // flags: the weight warp copies nothing (times the rest)
constexpr int NO_ADDS = 16;               // flags: a unit's sums are not written (times the adds)
constexpr int BARRIERS = 32;              // flags: a phase waits for the whole previous one (a grid barrier each)
constexpr long long SPIN_LIMIT = 1ll << 24;  // tries of a wait, seconds of it: past them a broken schedule traps

// One GEMM: out[:64, :n] (+)= x[:64, :k] @ w[n, k].T, K in `split` slices; pointers as integers, leading dimensions
// in elements. offset: the rotation of its units over the CTAs; tiles: where its tiles' counters start; zero, zeros:
// the buffer (and its floats) this phase's start clears for the phase four on (0: none).
struct Phase {
  long long w, x, out, ldx, ldo, n, k, split, offset, tiles, zero, zeros;
};

// The launch's counters (int32, zeroed before it): units done a tile, units done a phase, CTAs that cleared the
// buffer a phase adds into.
struct Counters {
  unsigned* tile_units;
  unsigned* phase_units;
  unsigned* cleared;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(uint32_t bar) {
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// The spin lives inside one asm statement: to the compiler the wait is straight-line code, so the multiplying
// warps' asynchronous products in flight across it are not serialized (ptxas serializes wgmma across divergent
// paths). Past SPIN_LIMIT tries it traps: a broken schedule fails, never hangs.
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p, late;\n .reg .u64 tries;\n mov.u64 tries, 0;\n"
      "WAIT:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @p bra DONE;\n"
      " add.u64 tries, tries, 1;\n setp.gt.u64 late, tries, %2;\n @late trap;\n bra WAIT;\n"
      "DONE:\n}\n" ::"r"(bar), "r"(parity), "n"(SPIN_LIMIT)
      : "memory");
}
// One arrival by the lane that passes `first` (the others skip it inside the asm: no branch for the compiler).
__device__ __forceinline__ void bar_arrive_if(uint32_t bar, bool first) {
  asm volatile("{\n .reg .pred p;\n .reg .b64 state;\n setp.ne.b32 p, %1, 0;\n"
               " @p mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar), "r"(static_cast<int>(first))
               : "memory");
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
// An arrival on `bar` once every cp.async this thread issued so far has landed (counted in the barrier's init).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Two 8-column blocks' B fragments (K +0 and +8 each) from the addresses the lanes give (``multiply``'s ld_row).
__device__ __forceinline__ void load_b(uint32_t* b0, uint32_t* b1, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b0[0]), "=r"(b0[1]), "=r"(b1[0]), "=r"(b1[1])
               : "r"(addr));
}
__device__ __forceinline__ void add_pair(float* p, float a, float b) {  // no value back, so no wait on it
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}
// One count (a release: what the CTA wrote before it is visible to whoever acquires the count) by the thread that
// passes `first`, branch-free for the compiler like bar_arrive_if.
__device__ __forceinline__ void count_if(unsigned* count, bool first) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %1, 0;\n @p red.release.gpu.global.add.u32 [%0], 1;\n}\n"
               ::"l"(count), "r"(static_cast<int>(first))
               : "memory");
}
// The warp waits until *count reaches target (acquire: what the counted writes wrote is visible after). Every lane
// polls, inside the asm like bar_wait: no lane-dependent path for the compiler.
__device__ __forceinline__ void wait_count(const unsigned* count, unsigned target) {
  asm volatile(
      "{\n .reg .pred done, late;\n .reg .u32 seen;\n .reg .u64 tries;\n mov.u64 tries, 0;\n"
      "WAIT:\n ld.acquire.gpu.global.u32 seen, [%0];\n setp.ge.u32 done, seen, %1;\n @done bra DONE;\n"
      " add.u64 tries, tries, 1;\n setp.gt.u64 late, tries, %2;\n @late trap;\n bra WAIT;\n"
      "DONE:\n}\n" ::"l"(count), "r"(target), "n"(SPIN_LIMIT)
      : "memory");
}
__device__ __forceinline__ uint32_t bf16x2(float2 v) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v.x, v.y);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// Not volatile: the compiler may schedule the shared-memory loads of the next products ahead of this one.
__device__ __forceinline__ void mma16816(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The warpgroup's products for one K step of 16: d (64 rows x 128 columns, fp32, each warp's 16 rows as mma.sync
// lays them out) += a (each warp's 16 rows, bf16, mma.sync's A layout) x the weights the descriptor points to.
__device__ __forceinline__ void wgmma_128(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"  // scale-d: add to d
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
        "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
        "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
        "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}
// Keeps the compiler from moving the accumulators' reads or writes across the asynchronous products.
__device__ __forceinline__ void fence_operands(float (&d)[16][4]) {
#pragma unroll
  for (int j = 0; j < 16; ++j)
    asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}

// A phase's units: its tiles times its K slices.
__device__ __forceinline__ int units_of(const Phase& ph) { return static_cast<int>(ph.n / BN * ph.split); }

// A phase's shape as the three roles walk it.
struct Walk {
  int units, slice_k, chunks, first;
  __device__ Walk(const Phase& ph, int cta, int grid, int bk)
      : units(units_of(ph)),
        slice_k(static_cast<int>(ph.k / ph.split)),
        chunks(static_cast<int>(ph.k / ph.split / bk)),
        first(static_cast<int>((cta - ph.offset % grid + grid) % grid)) {}
};

// The weight warps (ww of WW): every weight chunk of the CTA's schedule, as far ahead as the ring's free stages
// allow, each warp a share of every chunk's rows.
template <typename C, int SW, int WW>
__device__ void stream_weights(const Phase* phases, int num_phases, int flags, uint32_t ring, uint32_t full,
                               uint32_t empty, int ww, int lane) {
  uint32_t n = 0;
  for (int p = 0; p < num_phases; ++p) {
    const Phase ph = phases[p];
    const Walk walk(ph, blockIdx.x, gridDim.x, C::BK);
    for (int u = walk.first; u < walk.units; u += gridDim.x) {
      const __nv_bfloat16* w = reinterpret_cast<const __nv_bfloat16*>(ph.w) + (u / ph.split) * BN * ph.k +
                               (u % ph.split) * walk.slice_k;
      for (int c = 0; c < walk.chunks; ++c, ++n) {
        const uint32_t s = n % SW;
        if (n >= SW) bar_wait(empty + 8 * s, (n / SW - 1) & 1);
        if (flags & NO_WEIGHTS) {
          bar_arrive(full + 8 * s);
          continue;
        }
#pragma unroll 8
        for (int seg = ww * 32 + lane; seg < C::W_SEGMENTS; seg += 32 * WW) {  // an instruction: whole rows
          const int r = seg / (C::BK / 8), col = seg % (C::BK / 8);
          cp_async16(ring + s * C::W_STAGE + C::w_offset(r, col), w + r * ph.k + c * C::BK + col * 8);
        }
        cp_async_arrive(full + 8 * s);
      }
    }
  }
}

// The activation warp, phase by phase: first the clearing of the buffer the phase four on adds into (once the
// phases that last wrote and read it are done), then, once every CTA has cleared this phase's own buffer, the phase's
// activation chunks, each once the tile of the previous phase it reads is complete (BK = BN: a chunk is one tile),
// or, with BARRIERS, all of them once the whole previous phase is.
template <typename C, int SX>
__device__ void stream_activations(const Phase* phases, int num_phases, const Counters& counters, int flags,
                                   uint32_t ring, uint32_t full, uint32_t empty, int lane) {
  static_assert(C::BK == BN, "an activation chunk is one output tile of the previous phase");
  const bool waits = !(flags & NO_WAITS);
  uint32_t n = 0;
  for (int p = 0; p < num_phases; ++p) {
    const Phase ph = phases[p];
    if (ph.zero) {  // the buffer phase p - 4 wrote (all of it: its reader may take only the first columns), phase
                    // p - 3 read and phase p + 4 adds into
      for (int q = p - 4; q <= p - 3 && waits; ++q)
        wait_count(counters.phase_units + q, units_of(phases[q]));
      // the same trip count in every lane (a buffer's float4s are a multiple of 32): no lane-dependent path, which
      // ptxas answers by serializing the multiplying warps' wgmma products
      float4* stale = reinterpret_cast<float4*>(ph.zero);
      for (long long i = blockIdx.x * 32ll; i < ph.zeros / 4; i += gridDim.x * 32ll) stale[i + lane] = float4{};
      __threadfence();
      __syncwarp();
      count_if(counters.cleared + p + 4, lane == 0);
    }
    if (p >= 8 && waits) wait_count(counters.cleared + p, gridDim.x);
    const Phase source = phases[p > 0 ? p - 1 : 0];
    const bool barrier = waits && (flags & BARRIERS) && p > 0;
    if (barrier) wait_count(counters.phase_units + p - 1, units_of(source));
    const Walk walk(ph, blockIdx.x, gridDim.x, C::BK);
    for (int u = walk.first; u < walk.units; u += gridDim.x) {
      const int k0 = (u % ph.split) * walk.slice_k;
      const float* x = reinterpret_cast<const float*>(ph.x) + k0;
      for (int c = 0; c < walk.chunks; ++c, ++n) {
        const uint32_t s = n % SX;
        if (n >= SX) bar_wait(empty + 8 * s, (n / SX - 1) & 1);
        if (p > 0 && waits && !barrier) {
          const int tile = (k0 + c * C::BK) / BN;
          wait_count(counters.tile_units + source.tiles + tile, static_cast<unsigned>(source.split));
        }
        if (flags & NO_ACTIVATIONS) {
          bar_arrive(full + 8 * s);
          continue;
        }
#pragma unroll 8
        for (int seg = lane; seg < C::X_SEGMENTS; seg += 32) {  // a warp's instruction: whole rows
          const int r = seg / (C::BK / 4), col = seg % (C::BK / 4);
          cp_async16(ring + s * C::X_STAGE + r * C::X_PITCH + col * 16, x + r * ph.ldx + c * C::BK + col * 4);
        }
        cp_async_arrive(full + 8 * s);
      }
    }
  }
}

// One K step's A fragment (mma.sync's layout, which wgmma's register operand shares) for the lane, from the fp32
// activation stage at xs (the lane's row and column pair), 16 columns from kk, rounded to bf16.
template <typename C>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const unsigned char* xs, int kk) {
  a[0] = bf16x2(*reinterpret_cast<const float2*>(xs + kk * 4));
  a[1] = bf16x2(*reinterpret_cast<const float2*>(xs + 8 * C::X_PITCH + kk * 4));
  a[2] = bf16x2(*reinterpret_cast<const float2*>(xs + (kk + 8) * 4));
  a[3] = bf16x2(*reinterpret_cast<const float2*>(xs + 8 * C::X_PITCH + (kk + 8) * 4));
}

// A chunk's products for one warp (mma.sync): its 16 rows x NB 8-column blocks; ws is the lane's ldmatrix address.
template <typename C, int NB>
__device__ __forceinline__ void mma_chunk(float (&acc)[NB][4], uint32_t ws, const unsigned char* xs) {
#pragma unroll
  for (int kk = 0; kk < C::BK; kk += 16) {
    uint32_t b[NB][2];  // every product's weights loaded before the first product issues
#pragma unroll
    for (int j = 0; j < NB; j += 2) load_b(b[j], b[j + 1], ws + j * 8 * C::W_PITCH + kk * 2);
    uint32_t a[4];
    load_a<C>(a, xs, kk);
#pragma unroll
    for (int j = 0; j < NB; ++j) mma16816(acc[j], a, b[j][0], b[j][1]);
  }
}

// The two rings and their barriers, as the multiplying warps see them.
struct Rings {
  const unsigned char* w;
  const unsigned char* x;
  uint32_t w_full, w_empty, x_full, x_empty;
};

// Chunk n's stages in the two rings: waited for full, released empty (one arrival a multiplying warp).
template <int SW, int SX>
struct Slot {
  uint32_t n, w, x;
  __device__ explicit Slot(uint32_t chunk) : n(chunk), w(chunk % SW), x(chunk % SX) {}
  __device__ void wait(const Rings& r) const {
    bar_wait(r.w_full + 8 * w, (n / SW) & 1);
    bar_wait(r.x_full + 8 * x, (n / SX) & 1);
  }
  __device__ void release_w(const Rings& r, int lane) const {
    __syncwarp();
    bar_arrive_if(r.w_empty + 8 * w, lane == 0);
  }
  __device__ void release_x(const Rings& r, int lane) const {
    __syncwarp();
    bar_arrive_if(r.x_empty + 8 * x, lane == 0);
  }
};

// wgmma's view of 16 K columns of the swizzled weights at addr: 8-row groups 1024 bytes apart, the 128-byte swizzle.
__device__ __forceinline__ uint64_t swizzled(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | 1ull << 16 | static_cast<uint64_t>(1024 >> 4) << 32 |
         1ull << 62;
}

// Chunk n's products for the warpgroup (wgmma), issued without waiting for them: x's bf16 fragments into `a` (which
// the products read until they complete, so consecutive chunks use two sets; x's stage is free once they are
// read), one product a K step of 16; then chunk n - 1's products are waited for and, if `previous`, its weight
// stage released.
template <typename C, int SW, int SX>
__device__ __forceinline__ void wgmma_step(float (&acc)[16][4], uint32_t (&a)[C::BK / 16][4], uint32_t n,
                                           bool previous, const Rings& rings, int xs_offset, int flags, int lane) {
  const Slot<SW, SX> slot(n);
  slot.wait(rings);
  const unsigned char* xs = rings.x + slot.x * C::X_STAGE + xs_offset;
#pragma unroll
  for (int s = 0; s < C::BK / 16; ++s) load_a<C>(a[s], xs, s * 16);
  slot.release_x(rings, lane);
  if (!(flags & NO_PRODUCTS)) {
    // the weights came through cp.async (the generic proxy); wgmma reads them through the async one
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    fence_operands(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    const uint32_t stage = smem_addr(rings.w + slot.w * C::W_STAGE);
#pragma unroll
    for (int s = 0; s < C::BK / 16; ++s) wgmma_128(acc, a[s], swizzled(stage + s / 4 * C::W_HALF + s % 4 * 32));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // chunk n - 1's products are done
  }
  if (previous) Slot<SW, SX>(n - 1).release_w(rings, lane);
}

// A unit's partial sums (a warp's 16 rows x NB 8-column blocks from col0) into the phase's output: added when K is
// split, stored when not.
template <int NB>
__device__ __forceinline__ void write_unit(const float (&acc)[NB][4], const Phase& ph, int u, int row, int col0,
                                           int t) {
  float* out = reinterpret_cast<float*>(ph.out) + row * ph.ldo + (u / ph.split) * BN + col0 + t * 2;
#pragma unroll
  for (int j = 0; j < NB; ++j) {
    float* top = out + j * 8;
    float* bottom = out + 8 * ph.ldo + j * 8;
    if (ph.split == 1) {
      *reinterpret_cast<float2*>(top) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(bottom) = make_float2(acc[j][2], acc[j][3]);
    } else {
      add_pair(top, acc[j][0], acc[j][1]);
      add_pair(bottom, acc[j][2], acc[j][3]);
    }
  }
}

// The multiplying warps (mw of MW): the products, 16 rows and NB 8-column blocks a warp, and each unit's partial
// sums into the phase's output. With wgmma a unit's chunks go in pairs (the phase table makes their count even).
template <typename C, int SW, int SX, int MW>
__device__ void multiply(const Phase* phases, int num_phases, const Counters& counters, int flags, const Rings& rings,
                         int mw, int lane) {
  constexpr int NB = BN / 8 / (MW / 4);
  const int g = lane >> 2, t = lane & 3, row = mw % 4 * 16 + g, col0 = mw / 4 * NB * 8;
  const int xs_offset = row * C::X_PITCH + t * 8;
  // ldmatrix: lane l gives the row address of matrix l / 8 (column block +0 or +1, K +0 or +8), row l % 8
  const int ld_row = col0 + (lane >> 4) * 8 + (lane & 7), ld_k = (lane >> 3 & 1) * 8;
  uint32_t n = 0;
  for (int p = 0; p < num_phases; ++p) {
    const Phase ph = phases[p];
    const Walk walk(ph, blockIdx.x, gridDim.x, C::BK);
    for (int u = walk.first; u < walk.units; u += gridDim.x) {
      float acc[NB][4] = {};
      if constexpr (C::WG) {
        uint32_t even[C::BK / 16][4], odd[C::BK / 16][4];
        for (int c = 0; c < walk.chunks; c += 2, n += 2) {
          wgmma_step<C, SW, SX>(acc, even, n, c > 0, rings, xs_offset, flags, lane);
          wgmma_step<C, SW, SX>(acc, odd, n + 1, true, rings, xs_offset, flags, lane);
        }
        if (!(flags & NO_PRODUCTS)) asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        fence_operands(acc);
        Slot<SW, SX>(n - 1).release_w(rings, lane);
      } else {
        for (int c = 0; c < walk.chunks; ++c, ++n) {
          const Slot<SW, SX> slot(n);
          slot.wait(rings);
          if (!(flags & NO_PRODUCTS)) {
            mma_chunk<C, NB>(acc, smem_addr(rings.w + slot.w * C::W_STAGE + ld_row * C::W_PITCH + ld_k * 2),
                             rings.x + slot.x * C::X_STAGE + xs_offset);
          }
          slot.release_w(rings, lane);
          slot.release_x(rings, lane);
        }
      }
      if (!(flags & NO_ADDS)) write_unit<NB>(acc, ph, u, row, col0, t);
      // the unit counted once every warp's adds are visible: its tile's and its phase's counters
      __threadfence();
      asm volatile("bar.sync 1, %0;\n" ::"n"(32 * MW) : "memory");  // the multiplying warps only
      count_if(counters.tile_units + ph.tiles + u / ph.split, mw == 0 && lane == 0);
      count_if(counters.phase_units + p, mw == 0 && lane == 0);
    }
  }
}

}  // namespace

template <int MW, int WW>
constexpr int threads() {  // MW multiplying, WW weight and one activation warp
  return 32 * (WW + 1 + MW);
}

// SW weight chunks and SX activation chunks of BK columns in shared memory; MW multiplying warps (first: with WG,
// one warpgroup of four using wgmma), WW weight-streaming warps and the activation warp.
template <int BK, bool WG, int SW, int SX, int MW, int WW>
__global__ void __launch_bounds__(threads<MW, WW>(), 1)
    chain_kernel(const Phase* __restrict__ phases, int num_phases, unsigned* counts, int tiles, int flags) {
  const Counters counters{counts, counts + tiles, counts + tiles + num_phases};
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // the swizzle is a function of the address: the weight ring starts on 1024 bytes (smem_bytes leaves room)
  unsigned char* smem = smem_raw + (1024 - smem_addr(smem_raw) % 1024) % 1024;
  const unsigned char* w_ring = smem;
  using C = Chunk<BK, WG>;
  static_assert(!WG || MW == 4, "wgmma: one warpgroup multiplies");
  const unsigned char* x_ring = smem + SW * C::W_STAGE;
  const uint32_t w_full = smem_addr(x_ring + SX * C::X_STAGE), w_empty = w_full + 8 * SW;
  const uint32_t x_full = w_empty + 8 * SW, x_empty = x_full + 8 * SX;
  // the warp's index through a shuffle: the compiler then knows it is warp-uniform, and the roles' branches below
  // are not divergent paths (ptxas would serialize the wgmma products in one)
  const int warp = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x >> 5), 0), lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < SW; ++s) {
      bar_init(w_full + 8 * s, 32 * WW);  // each streaming lane's cp.async arrival
      bar_init(w_empty + 8 * s, MW);
    }
    for (int s = 0; s < SX; ++s) {
      bar_init(x_full + 8 * s, 32);
      bar_init(x_empty + 8 * s, MW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (warp < MW) {
    const Rings rings{w_ring, x_ring, w_full, w_empty, x_full, x_empty};
    multiply<C, SW, SX, MW>(phases, num_phases, counters, flags, rings, warp, lane);
  } else if (warp < MW + WW) {
    stream_weights<C, SW, WW>(phases, num_phases, flags, smem_addr(w_ring), w_full, w_empty, warp - MW, lane);
  } else {
    stream_activations<C, SX>(phases, num_phases, counters, flags, smem_addr(x_ring), x_full, x_empty, lane);
  }
}

template <int BK, bool WG>
constexpr int smem_bytes(int sw, int sx) {
  return sw * Chunk<BK, WG>::W_STAGE + sx * Chunk<BK, WG>::X_STAGE + 16 * (sw + sx) + 1024;
}

// Host entry: one launch over `phases` ([P, 12] int64 on the device), its products by mma.sync or wgmma; `counters`
// (int32: the phases' tiles, then 2 x P) are zeroed first. (Left out by -DCHAIN_KERNEL_ONLY, which compiles the
// kernel alone where torch's headers are not at hand.)
#ifdef CHAIN_KERNEL_ONLY
template __global__ void chain_kernel<128, false, 4, 2, 4, 2>(const Phase*, int, unsigned*, int, int);
template __global__ void chain_kernel<128, true, 4, 2, 4, 2>(const Phase*, int, unsigned*, int, int);
#else
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

template <int BK, bool WG, int SW, int SX, int MW, int WW>
void launch(const torch::Tensor& phases, const torch::Tensor& counters, int64_t grid, int64_t flags,
            cudaStream_t stream) {
  constexpr int smem = smem_bytes<BK, WG>(SW, SX);
  static const bool sized = [] {  // once, on the first (eager) call, never inside a graph capture
    auto kernel = chain_kernel<BK, WG, SW, SX, MW, WW>;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess;
  }();
  TORCH_CHECK(sized, "the chain kernel's shared memory could not be set");
  chain_kernel<BK, WG, SW, SX, MW, WW><<<static_cast<unsigned>(grid), threads<MW, WW>(), smem, stream>>>(
      reinterpret_cast<const Phase*>(phases.data_ptr<int64_t>()), static_cast<int>(phases.size(0)),
      reinterpret_cast<unsigned*>(counters.data_ptr<int32_t>()),
      static_cast<int>(counters.numel() - 2 * phases.size(0)), static_cast<int>(flags));
}

void chain(torch::Tensor phases, torch::Tensor counters, int64_t grid, bool wgmma, int64_t flags) {
  TORCH_CHECK(phases.is_cuda() && phases.dtype() == torch::kInt64 && phases.dim() == 2 && phases.size(1) == 12);
  TORCH_CHECK(counters.is_cuda() && counters.dtype() == torch::kInt32 && counters.numel() > 2 * phases.size(0));
  auto stream = at::cuda::getCurrentCUDAStream();
  cudaMemsetAsync(counters.data_ptr(), 0, counters.numel() * sizeof(unsigned), stream);
  // the builds: 128-column chunks, rings of 4 and 2, four multiplying and two weight warps; mma.sync or wgmma
  if (wgmma) {
    launch<128, true, 4, 2, 4, 2>(phases, counters, grid, flags, stream);
  } else {
    launch<128, false, 4, 2, 4, 2>(phases, counters, grid, flags, stream);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("chain", &chain, "the persistent GEMM chain, one launch"); }
#endif
