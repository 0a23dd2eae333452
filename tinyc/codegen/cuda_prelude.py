"""Layer 3: the helper functions every CUDA kernel's source starts with (cstyle.CUDA_DIALECT's prelude), in CUDA C with inline PTX: half
<-> float by the conversion instructions (no header, so NVRTC needs no CUDA toolkit), two floats rounded into one 16-bit pair, shared
addresses, split-barrier waits and the lane runs shuffles exchange among. Imports nothing.
"""

CUDA_PRELUDE = ("__device__ inline float __half_bits_to_float(unsigned short h) {\n"
               "  float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f;\n}\n"
               "__device__ inline unsigned short __float_to_half_bits(float f) {\n"
               "  unsigned short h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h;\n}\n"
               # two floats rounded to 16 bits (to nearest, ties to even) in one word, the first in the low half: one instruction on sm_80
               "__device__ inline unsigned int __pack_f16x2(float lo, float hi) {\n#if __CUDA_ARCH__ >= 800\n"
               "  unsigned int r; asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo)); return r;\n#else\n"
               "  return (unsigned int)__float_to_half_bits(lo) | ((unsigned int)__float_to_half_bits(hi) << 16);\n#endif\n}\n"
               "__device__ inline unsigned int __pack_bf16x2(float lo, float hi) {\n#if __CUDA_ARCH__ >= 800\n"
               "  unsigned int r; asm(\"cvt.rn.bf16x2.f32 %0, %1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo)); return r;\n#else\n"
               "  unsigned int a = __float_as_uint(lo), b = __float_as_uint(hi);\n"
               "  return ((a + 0x7FFFu + ((a>>16)&1u))>>16) | (((b + 0x7FFFu + ((b>>16)&1u))>>16)<<16);\n#endif\n}\n"
               "__device__ inline unsigned int __shared_address(const void* p) {\n"
               "  unsigned int a; asm(\"{ .reg .u64 q; cvta.to.shared.u64 q, %1; cvt.u32.u64 %0, q; }\" : \"=r\"(a) : \"l\"(p)); return a;\n}\n"
               # try_wait (sm_90) suspends the thread a while before it answers; test_wait (sm_80) answers at once
               "__device__ inline void __barrier_wait(unsigned int barrier, unsigned int parity) {\n"
               "  unsigned int done; do { asm volatile(\"{ .reg .pred p; mbarrier.\"\n"
               "#if __CUDA_ARCH__ >= 900\n\"try_wait\"\n#else\n\"test_wait\"\n#endif\n\".parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\"\n"
               "  : \"=r\"(done) : \"r\"(barrier), \"r\"(parity) : \"memory\"); } while (!done);\n}\n"
               # the lanes a SHUFFLE exchanges among (LANES): this lane's aligned run of `lanes` in its warp, which meet there together
               "__device__ inline unsigned int __lane_run(unsigned int lanes) {\n"
               "  unsigned int lane; asm(\"mov.u32 %0, %%laneid;\" : \"=r\"(lane));\n"
               "  return (0xffffffffu >> (32 - lanes)) << (lane & ~(lanes - 1));\n}\n")
